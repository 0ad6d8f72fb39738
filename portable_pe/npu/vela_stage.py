"""Arm's Vela in the flow: the compile's vendor stage for `--target npu --profile
ethos-u85|ethos-u55`, the guide's Ethos-U columns and `inspect`'s line (HOOKS,
registered in npu/vendors.py).

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

from .vela import ACCELERATORS, TOOLCHAIN, VelaJob, build_bundle_files, compile_jobs, summarize
from .vendor_hooks import VendorHooks

PREFIX = "vela/"


def build_stage(state):
    """The vendor stage: (report, files) of Vela's build, or a report that none was made."""
    from ..compile.state import Added
    from .profiles import load_profile
    from .toolchain import skipped_build, vendor_coverage
    accelerator = load_profile(state.target_options["profile"]).accelerator
    blocker = ("the graph came as an .onnx file: Vela's path converts the PyTorch model (ONNX -> TFLite would "
               "need TensorFlow)" if state.spec is None else None)
    skipped = skipped_build(state.target_options["vendor_build"], TOOLCHAIN, state.log, blocker=blocker)
    if skipped is not None:
        return Added(report=skipped)
    npu = state.report["npu"]
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
    return Added(report={"vendor": {"name": TOOLCHAIN, "built": True, **report},
                         "npu": {**npu, "coverage": coverage, "profile_coverage": npu["coverage"]}},
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


def guide(jobs, *, columns: tuple[str, ...], work_dir: Path, log: Callable[[str], None], prepare=None) -> dict:
    """Arm Ethos-U through Vela: one int8 TFLite model per (encoder, length), compiled for
    each accelerator column; one worker start for all of them (npu/vela.py compile_jobs)."""
    from .report import npu_report
    entries = compile_jobs([VelaJob(j.spec, j.seq_len) for j in jobs], accelerators=list(columns),
                           work_dir=work_dir, log=log)
    out = {}
    for column in columns:
        reports = []
        for job, entry in zip(jobs, entries):
            s = summarize(entry, column)
            if not s["ok"]:
                reports.append(npu_report(column=column, job=job, ok=False, error=s["error"]))
                continue
            built = (entry["export"]["export_s"] + entry["convert_s"] + entry["quantize_s"] + s["compile_s"])
            acc = ACCELERATORS[column]
            reports.append(npu_report(
                column=column, job=job, ok=True, ops_npu=s["npu_ops"], ops_cpu=s["cpu_ops"],
                cpu_ops=s["cpu_fallbacks"], accuracy=entry["accuracy"], time_ms=s["inference_ms"],
                time_source=f"Vela {entry['versions'].get('ethos-u-vela', '?')} estimate: {acc['name']}, "
                            f"{acc['system_config']}, {acc['memory_mode']}, {s['clock_hz'] / 1e6:.0f} MHz",
                size_bytes=Path(entry["vela"][acc["name"]]["vela_tflite"]).stat().st_size, build_s=built,
                details={k: s[k] for k in ("cycles_total", "cycles_npu", "sram_bytes", "dram_bytes",
                                           "off_chip_flash_bytes", "sram_used_kib", "dram_used_kib",
                                           "off_chip_flash_used_kib", "macs")}
                | {"int8_tflite_bytes": entry["int8_bytes"], "calibration_samples": entry["calibration_samples"]}))
        out[column] = reports
    return out


def describe(vendor: dict) -> str:
    return (f"Vela {vendor.get('versions', {}).get('ethos-u-vela', '?')} {vendor['accelerator']}: "
            f"{vendor['npu_ops']} op(s) on the NPU, {vendor['cpu_ops']} on the CPU, "
            f"estimate {vendor['inference_ms']:.3f} ms")


HOOKS = VendorHooks(prefix=PREFIX, build=build_stage, guide=guide, describe=describe, simulator=simulator)
