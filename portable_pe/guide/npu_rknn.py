"""The guide's RKNN column: each encoder through `--target npu --profile rknpu2`, the
compile pipeline's own stages up to and including the vendor stage (RKNN-Toolkit2's
build, its layer table and its simulator), so the numbers are the ones `portable-pe
compile` records. The TVM host build, which the NPU does not use, is left out.

RKNN-Toolkit2 prints per-layer cycle counts but no inference time for a board it has
not run on, so this column has no time estimate (time_ms stays empty); the layer table's
cycle sum is kept in the details, as RKNN printed it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from .npu_report import NpuJob, npu_report

#: the stages a vendor build needs; `load` is replaced by the job's own GraphSpec
STAGES = ("target", "export", "simplify", "legalize", "quantize", "reference", "vendor")


def rknn(jobs: list[NpuJob], *, columns: tuple[str, ...], work_dir: Path,
         log: Callable[[str], None]) -> dict[str, list[dict]]:
    """One report per job and column; a column is "rknn-<soc>" (e.g. rknn-rk3588)."""
    out = {}
    for column in columns:
        soc = column.split("-", 1)[1]
        out[column] = []
        for i, job in enumerate(jobs, 1):
            log(f"  {column}: [{i}/{len(jobs)}] {job.spec.name} T={job.seq_len}")
            out[column].append(_cell(job, column=column, soc=soc))
    return out


def _cell(job: NpuJob, *, column: str, soc: str) -> dict:
    from ..compile.pipeline import STAGES as PIPELINE, CompileState, _run_stages
    from ..npu.vendor import VendorError
    from ..backends.targets import load_target
    options = {"profile": "rknpu2", "seq_len": job.seq_len, "npu_dtype": "int8", "soc": soc, "vendor_build": "require"}
    st = CompileState(source=f"{job.spec.name} (guide)", target=load_target("npu"), intermediates=None, shapes={},
                      target_options=options, log=lambda m: None)
    st.spec, st.name = job.spec, job.spec.name
    start = time.perf_counter()
    try:
        _run_stages(st, [(name, stage) for name, stage in PIPELINE if name in STAGES])
    except (ValueError, VendorError, RuntimeError) as err:  # a refusal or the vendor's own failure
        return npu_report(column=column, job=job, ok=False, error=str(err).strip().splitlines()[0])
    vendor = st.target_report["vendor"]
    placed = vendor["placement"]
    (sim,) = vendor["simulator"].values()
    return npu_report(
        column=column, job=job, ok=True, ops_npu=placed["ops_npu"], ops_cpu=placed["ops_cpu"],
        cpu_ops=[{"op": o["op"], "name": o["name"], "reason": o["why"][0]} for o in placed["cpu_ops"]],
        accuracy={"cosine": sim["cosine"], "max_abs": sim["max_abs"], "max_ref": sim.get("max_ref"),
                  "source": f"RKNN-Toolkit2 simulator ({soc}, int8) against PyTorch fp32"},
        size_bytes=vendor["rknn_bytes"], build_s=round(time.perf_counter() - start, 2),
        details={"toolkit": vendor.get("toolkit"), "layer_table_cycles": placed["npu_cycles"], "vendor_build_s": vendor["timings_s"]["build_s"],
                 "profile_disagreements": len(vendor["agreement"]["disagreements"])})
