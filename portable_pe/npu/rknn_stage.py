"""RKNN-Toolkit2 in the flow: the compile's vendor stage, the parity simulator row, the
guide's RKNN column and `inspect`'s line (HOOKS, registered in npu/vendors.py).

The vendor stage hands RKNN the float graph legalize made (rknn/model.onnx, opset 19)
with our calibration set; its build log gives placement, its simulator runs the
reference inputs, and the profile's predictions are checked against its placement.
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from .rknn import PREFIX, TOOLCHAIN, build, rebuild_and_simulate, vendor_graph
from .vendor_hooks import VendorHooks


def build_stage(state):
    """The vendor stage: RKNN's build of rknn/model.onnx, its placement and simulator run.
    Without the toolchain (and --vendor-build auto) the bundle says plainly that no vendor
    build was made."""
    import onnx
    from ..bundle.reference import ReferenceCase, find_case, write_cases
    from ..compile.state import Added
    from ..run.parity import make_inputs
    from .accuracy import accuracy
    from .agreement import agreement
    from .profiles import check_model, coverage, resolve_profile
    from .toolchain import skipped_build, vendor_coverage
    npu = state.report["npu"]
    skipped = skipped_build(state.target_options["vendor_build"], TOOLCHAIN, state.log)
    if skipped is not None:
        return Added(report=skipped)
    profile, dtype, soc = resolve_profile(state.target_options)
    model = onnx.ModelProto.FromString(state.files[PREFIX + "model.onnx"])
    case = find_case(state.reference, npu["reference_length"])
    calibration = [make_inputs(state.io["inputs"], length=case.length, seed=1 + i)  # quantize.py's seeds
                   for i in range(int(profile.quantization.get("calibration_samples", 8)))]
    built = build(model, soc=soc, dtype=dtype, calibration=calibration, simulate=[case.inputs], log=state.log)
    simulated = built.outputs[0]
    built.report["simulator"] = {name: accuracy(case.outputs[name], got)
                                 for name, got in simulated.items() if name in case.outputs}
    for name, acc in built.report["simulator"].items():
        state.log(f"  {TOOLCHAIN} simulator vs reference ({name}): cosine {acc['cosine']:.6f}, "
                  f"max abs {acc['max_abs']:.3g}")
    placed = built.report["placement"]
    built.report["agreement"] = agreement(check_model(model, profile), placed)
    for line in built.report["agreement"]["disagreements"]:
        state.log(f"  WARNING: profile {profile.name} and {TOOLCHAIN} disagree: {line}")
    npz, index = write_cases([ReferenceCase(case.length, {}, simulated)])
    built.report["simulated"] = index
    vendor_cov = vendor_coverage(f"{built.report['toolkit']} build log ({soc})", npu_ops=placed["ops_npu"],
                                 cpu_ops=placed["ops_cpu"])
    npu_report = {**npu, "coverage": vendor_cov, "profile_coverage": npu["coverage"],
                  "profile_coverage_vendor_graph": coverage(check_model(model, profile))}
    return Added(report={"vendor": built.report, "npu": npu_report},
                 files={**built.files, PREFIX + "simulator.npz": npz})


def simulator(bundle, *, simulated: bool, log: Callable[[str], None]) -> dict:
    """{"rknn-simulator": runner}: during `compile` the simulator already ran on the reference
    inputs (rknn/simulator.npz), so those outputs serve when the inputs are the same arrays;
    otherwise (and always for `parity BUNDLE`) the toolkit builds and simulates again."""
    from .toolchain import missing_message, toolchain_python
    name = f"{TOOLCHAIN}-simulator"
    stored = stored_runner(bundle, PREFIX + "simulator.npz", bundle.manifest["vendor"].get("simulated", [])) \
        if simulated else None
    if stored is None and toolchain_python(TOOLCHAIN) is None:
        log(f"note: no {name} row: {missing_message(TOOLCHAIN)}")
        return {}

    def run(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        hit = stored(inputs) if stored is not None else None
        return hit if hit is not None else rebuild_and_simulate(bundle, [inputs], log=log)[0]
    return {name: run}


def _key(inputs: dict[str, np.ndarray]) -> bytes:
    return b"".join(k.encode() + np.ascontiguousarray(v).tobytes() for k, v in sorted(inputs.items()))


def stored_runner(bundle, npz_name: str, index: list[dict]):
    """inputs -> the outputs stored in `npz_name` for the reference case with exactly those
    inputs (None for other inputs), or None when the bundle stored none."""
    from ..bundle.reference import bundle_cases, read_cases
    path = bundle.file(npz_name)
    if not index or not path.is_file():
        return None
    stored = {case.length: case.outputs for case in read_cases(path, index)}
    by_inputs = {_key(case.inputs): stored[case.length] for case in bundle_cases(bundle) if case.length in stored}
    return lambda inputs: by_inputs.get(_key(inputs))


def summary(vendor: dict) -> dict:
    """The numbers of a build that every table of RKNN results shows (the guide's column,
    scripts/npu_rknn_table.py), from the manifest's "vendor" section."""
    placed = vendor["placement"]
    (sim,) = vendor["simulator"].values()
    return {"ops_npu": placed["ops_npu"], "ops_cpu": placed["ops_cpu"], "cpu_ops": placed["cpu_ops"],
            "npu_cycles": placed["npu_cycles"], "cosine": sim["cosine"], "max_abs": sim["max_abs"],
            "max_ref": sim.get("max_ref"), "rknn_bytes": vendor["rknn_bytes"],
            "build_s": vendor["timings_s"]["build_s"], "toolkit": vendor.get("toolkit"),
            "disagreements": vendor["agreement"]["disagreements"]}


def guide(jobs, *, columns: tuple[str, ...], work_dir, log: Callable[[str], None], prepare) -> dict[str, list[dict]]:
    """The guide's RKNN columns ("rknn-<soc>"): each encoder through `--target npu --profile
    rknpu2`, the compile pipeline's own stages up to and including the vendor stage
    (`prepare`, compile/pipeline.py: the guide hands it in), so the numbers are the ones
    `portable-pe compile` records; TVM's host build, which the NPU does not use, is left
    out. RKNN prints per-layer cycle counts but no inference time for a board it has not
    run on, so there is no time estimate; the layer table's cycle sum is in the details."""
    from .report import npu_report
    from .toolchain import VendorError
    out = {}
    for column in columns:
        soc = column.split("-", 1)[1]
        out[column] = []
        for i, job in enumerate(jobs, 1):
            log(f"  {column}: [{i}/{len(jobs)}] {job.spec.name} T={job.seq_len}")
            options = {"profile": "rknpu2", "seq_len": job.seq_len, "npu_dtype": "int8", "soc": soc,
                       "vendor_build": "require"}
            start = time.perf_counter()
            try:
                st = prepare(job.spec, target="npu", target_options=options, through="vendor", host_build=False,
                             log=lambda m: None)
            except (ValueError, VendorError, RuntimeError) as err:  # a refusal or the vendor's own failure
                out[column].append(npu_report(column=column, job=job, ok=False,
                                              error=str(err).strip().splitlines()[0]))
                continue
            s = summary(st.report["vendor"])
            out[column].append(npu_report(
                column=column, job=job, ok=True, ops_npu=s["ops_npu"], ops_cpu=s["ops_cpu"],
                cpu_ops=[{"op": o["op"], "name": o["name"], "reason": o["why"][0]} for o in s["cpu_ops"]],
                accuracy={"cosine": s["cosine"], "max_abs": s["max_abs"], "max_ref": s["max_ref"],
                          "source": f"RKNN-Toolkit2 simulator ({soc}, int8) against PyTorch fp32"},
                size_bytes=s["rknn_bytes"], build_s=round(time.perf_counter() - start, 2),
                details={"toolkit": s["toolkit"], "layer_table_cycles": s["npu_cycles"],
                         "vendor_build_s": s["build_s"], "profile_disagreements": len(s["disagreements"])}))
    return out


def describe(vendor: dict) -> str:
    return (f"{vendor.get('toolkit', vendor['name'])} {vendor['soc']} {vendor['dtype']}: "
            f"{vendor['placement']['ops_npu']} op(s) on the NPU, {vendor['placement']['ops_cpu']} on the CPU")


HOOKS = VendorHooks(prefix=PREFIX, build=build_stage, guide=guide, describe=describe, vendor_graph=vendor_graph,
                    simulator=simulator)
