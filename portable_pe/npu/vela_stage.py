"""Arm's Vela in the flow: the compile's vendor stage for `--target npu --profile
ethos-u85|ethos-u55`, the guide's Ethos-U columns (the same stages: one path) and
`inspect`'s line (HOOKS, registered in npu/vendors.py).

Vela compiles the encoder (PyTorch -> full-int8 TFLite by litert-torch -> Vela,
npu/vela.py) and the bundle keeps, under vela/, the int8 TFLite model, Vela's compiled
model (its command stream in an `ethos-u` custom operator, what an Ethos-U board runs
through TFLite Micro) and Vela's per-layer report. Placement in the manifest then comes
from Vela, not from our op list.

Vela converts from the PyTorch model, so a foreign .onnx file gets no Vela build (it
would need ONNX -> TFLite, i.e. TensorFlow): the bundle says so, as it does when the
toolchain is missing and --vendor-build is auto.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Callable

from .vela import ACCELERATORS, TOOLCHAIN, build_bundle_files
from .vendor_hooks import VendorHooks

PREFIX = "vela/"


def blocker(state) -> str | None:
    """Vela's path converts the PyTorch model: an .onnx file has none."""
    if state.spec is None:
        return ("the graph came as an .onnx file: Vela's path converts the PyTorch model (ONNX -> TFLite would "
                "need TensorFlow)")
    return None


def build_stage(state):
    """The vendor stage: (report, files) of Vela's build, or a report that none was made.
    The profile's [tflite] pre-check judges the int8 TFLite graph Vela was handed, and is
    checked against Vela's placement (which decides); a disagreement is a warning."""
    from ..compile.state import Added
    from .agreement import agreement
    from .profiles import coverage, resolve_profile
    from .tflite_check import check_tflite
    from .toolchain import skipped_build, vendor_coverage
    skipped = skipped_build(state.target_options["vendor_build"], TOOLCHAIN, state.log, blocker=blocker(state))
    if skipped is not None:
        return Added(report=skipped)
    profile = resolve_profile(state.target_options)[0]
    accelerator = profile.accelerator
    npu = state.report["npu"]
    with tempfile.TemporaryDirectory(prefix="portable-pe-vela-") as work:
        image = npu["image"]["shape"][2:] if npu.get("image") else None  # (1, C, [F,] H, W)
        files, report = build_bundle_files(spec=state.spec, seq_len=npu["seq_len"], accelerator=accelerator,
                                           work_dir=Path(work) / "build", log=state.log, image=image)
    acc = report["accuracy_int8"]
    state.log(f"  vela ({accelerator}): {report['npu_ops']} op(s) on the NPU, {report['cpu_ops']} on the CPU; "
              f"estimate {report['inference_ms']:.3f} ms; int8 TFLite vs PyTorch: cosine {acc['cosine']:.6f}")
    for op in report["cpu_fallbacks"]:
        state.log(f"  vela: on the CPU: {op}")
    verdicts = check_tflite(report.pop("tflite_operators"), profile)  # hundreds of names: not for the manifest
    report["agreement"] = agreement(verdicts, report["placement"])
    refused = len(report["agreement"]["profile_refused"])
    state.log(f"  vela: profile {profile.name}'s pre-check of the int8 TFLite graph: {refused} of {len(verdicts)} "
              f"operator(s) refused; {'agrees' if report['agreement']['agree'] else 'disagrees'} with Vela")
    for line in report["agreement"]["disagreements"]:
        state.log(f"  WARNING: profile {profile.name} and Vela disagree: {line}")
    vela_coverage = vendor_coverage(f"Vela {report['versions'].get('ethos-u-vela', '?')} ({accelerator})",
                                    npu_ops=report["npu_ops"], cpu_ops=report["cpu_ops"])
    return Added(report={"vendor": {"name": TOOLCHAIN, "built": True, **report},
                         "npu": {**npu, "coverage": vela_coverage, "profile_coverage": npu["coverage"],
                                 "profile_coverage_vendor_graph": coverage(verdicts)}},
                 files={PREFIX + name: data for name, data in files.items()})


def simulator(bundle, *, simulated: bool, log: Callable[[str], None]) -> dict:
    """No simulator row: Vela has no simulator. Its int8 accuracy, measured on LiteRT at
    build time, is in the manifest, and the log says so."""
    acc = bundle.manifest["vendor"].get("accuracy_int8") or {}
    if acc:
        log(f"note: {TOOLCHAIN}: the int8 TFLite model Vela compiled, run on LiteRT against PyTorch "
            f"fp32 at build time: cosine {acc.get('cosine', float('nan')):.6f}, "
            f"max abs {acc.get('max_abs', float('nan')):.3g} (no simulator row)")
    return {}


def guide(jobs, *, columns: tuple[str, ...], work_dir: Path, log: Callable[[str], None], prepare) -> dict:
    """The guide's Ethos-U columns: each encoder through `--target npu --profile <column>`,
    the compile pipeline's own stages up to and including the vendor stage (`prepare`,
    compile/pipeline.py: the guide hands it in), so a cell is what `portable-pe compile`
    builds or refuses; TVM's host build, which the NPU does not use, is left out."""
    import time
    from .report import npu_report
    from .toolchain import VendorError
    out = {}
    for column in columns:
        out[column] = []
        for i, job in enumerate(jobs, 1):
            log(f"  {column}: [{i}/{len(jobs)}] {job.spec.name} T={job.seq_len}")
            options = {"profile": column, "seq_len": job.seq_len, "npu_dtype": "int8", "vendor_build": "require"}
            start = time.perf_counter()
            try:
                st = prepare(job.spec, target="npu", target_options=options, through="vendor", host_build=False,
                             log=lambda m: None)
            except (ValueError, VendorError, RuntimeError) as err:  # a refusal or Vela's own failure
                out[column].append(npu_report(column=column, job=job, ok=False,
                                              error=str(err).strip().splitlines()[0]))
                continue
            out[column].append(_guide_cell(column, job, st, build_s=time.perf_counter() - start))
    return out


def _guide_cell(column: str, job, st, *, build_s: float) -> dict:
    """One guide cell from a compile state's Vela report (the manifest's "vendor" section)."""
    from .report import npu_report
    v = st.report["vendor"]
    acc = ACCELERATORS[column]
    return npu_report(
        column=column, job=job, ok=True, ops_npu=v["npu_ops"], ops_cpu=v["cpu_ops"], cpu_ops=v["cpu_fallbacks"],
        accuracy=v["accuracy_int8"], time_ms=v["inference_ms"],
        time_source=f"Vela {v['versions'].get('ethos-u-vela', '?')} estimate: {acc['name']}, "
                    f"{acc['system_config']}, {acc['memory_mode']}, {v['clock_hz'] / 1e6:.0f} MHz",
        size_bytes=len(st.files[PREFIX + "model_vela.tflite"]), build_s=round(build_s, 2),
        details={k: v[k] for k in ("cycles_total", "cycles_npu", "sram_bytes", "dram_bytes", "off_chip_flash_bytes",
                                   "sram_used_kib", "dram_used_kib", "off_chip_flash_used_kib", "macs")}
        | {"int8_tflite_bytes": len(st.files[PREFIX + "model_int8.tflite"]),
           "calibration_samples": v["calibration_samples"],
           "profile_disagreements": len(v["agreement"]["disagreements"])})


def describe(vendor: dict) -> str:
    return (f"Vela {vendor.get('versions', {}).get('ethos-u-vela', '?')} {vendor['accelerator']}: "
            f"{vendor['npu_ops']} op(s) on the NPU, {vendor['cpu_ops']} on the CPU, "
            f"estimate {vendor['inference_ms']:.3f} ms")


HOOKS = VendorHooks(prefix=PREFIX, build=build_stage, guide=guide, describe=describe, simulator=simulator,
                    blocker=blocker)
