"""The vendor stage of `--target npu --profile ethos-u85|ethos-u55`: Arm's Vela compiles
the encoder (PyTorch -> full-int8 TFLite by litert-torch -> Vela, npu/vela.py) and the
bundle keeps, under vela/, the int8 TFLite model, Vela's compiled model (its command
stream in an `ethos-u` custom operator, what an Ethos-U board runs through TFLite Micro)
and Vela's per-layer report. Placement in the manifest then comes from Vela, not from
our op list.

Vela converts from the PyTorch model, so a foreign .onnx file gets no Vela build (it
would need ONNX -> TFLite, i.e. TensorFlow): the bundle says so, as it does when the
toolchain is missing and --vendor-build is auto.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from .vela import PROFILE_ACCELERATORS, TOOLCHAIN, build_bundle_files
from .vendor import skipped_build, vendor_coverage

PREFIX = "vela/"


def vela_build(state, profile_name: str) -> dict | None:
    """(report, files) for the Staged result, or a report that no vendor build was made."""
    accelerator = PROFILE_ACCELERATORS[profile_name]
    blocker = ("the graph came as an .onnx file: Vela's path converts the PyTorch model (ONNX -> TFLite would "
               "need TensorFlow)" if state.spec is None else None)
    skipped = skipped_build(state.target_options.get("vendor_build") or "auto", TOOLCHAIN, state.log, blocker=blocker)
    if skipped is not None:
        return {"report": skipped, "files": {}}
    npu = state.target_report["npu"]
    with tempfile.TemporaryDirectory(prefix="portable-pe-vela-") as work:
        files, report = build_bundle_files(spec=state.spec, seq_len=npu["seq_len"], accelerator=accelerator,
                                           work_dir=Path(work) / "build", log=state.log)
    acc = report["accuracy_int8"]
    state.log(f"  vela ({accelerator}): {report['npu_ops']} op(s) on the NPU, {report['cpu_ops']} on the CPU; "
              f"estimate {report['inference_ms']:.3f} ms; int8 TFLite vs PyTorch: cosine {acc['cosine']:.6f}")
    for op in report["cpu_fallbacks"]:
        state.log(f"  vela: on the CPU: {op}")
    coverage = vendor_coverage(f"Vela {report['versions'].get('ethos-u-vela', '?')} ({accelerator})",
                               npu_ops=report["npu_ops"], cpu_ops=report["cpu_ops"])
    return {"report": {"vendor": {"name": TOOLCHAIN, "built": True, **report},
                       "npu": {**npu, "coverage": coverage, "profile_coverage": npu["coverage"]}},
            "files": {PREFIX + name: data for name, data in files.items()}}
