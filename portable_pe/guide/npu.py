"""The guide's NPU section: vendor columns, each filled by the vendor's own compiler.

NPU_VENDORS maps a vendor to an NpuVendor: the columns it fills (one per NPU it compiles
for), the toolchain it needs (`bash scripts/npu_toolchain.sh TOOLCHAIN`) and

    run(jobs: list[NpuJob], *, columns: tuple[str, ...], work_dir: Path,
        log: Callable[[str], None]) -> dict[str, list[dict]]

which returns, per column, one report per job in job order, each made by npu_report()
and so with exactly REPORT_KEYS. A vendor builds each (encoder, length) once and fills all
its columns from it (Vela compiles one int8 TFLite model for U55, U65 and U85).

`portable-pe guide --targets npu-NAME` runs NPU_VENDORS[NAME]. The guide adds each
report's position work afterwards, from the time estimates: the encoder's estimate minus
the no-position encoder's at the same length and column (vendors without an estimate
leave it empty).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .npu_report import REPORT_KEYS, NpuJob, npu_report  # noqa: F401 (the guide imports them from here)
from .npu_rknn import rknn


@dataclass(frozen=True)
class NpuVendor:
    columns: tuple[str, ...]
    toolchain: str
    run: Callable[..., dict[str, list[dict]]]
    description: str = ""


def ethos_u(jobs: list[NpuJob], *, columns: tuple[str, ...], work_dir: Path,
            log: Callable[[str], None]) -> dict[str, list[dict]]:
    """Arm Ethos-U through Vela: one int8 TFLite model per (encoder, length), compiled for
    each accelerator column (npu/vela.py)."""
    from ..npu.vela import ACCELERATORS, VelaJob, compile_jobs, summarize
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


NPU_VENDORS: dict[str, NpuVendor] = {
    "rknn": NpuVendor(columns=("rknn-rk3588",), toolchain="rknn", run=rknn,
                      description="Rockchip RK3588 through RKNN-Toolkit2 (build, layer table, simulator)"),
    # U65 (npu/vela.py ACCELERATORS) is left out: at T=4096 each Vela compile for the
    # U55/U65 took 50 s, and the guide's goal is U85 and U55
    "ethos-u": NpuVendor(columns=("ethos-u85", "ethos-u55"), toolchain="ethos-u", run=ethos_u,
                         description="Arm Ethos-U85 and U55 through Vela (PyTorch -> int8 TFLite by litert-torch)"),
}


def run_vendor(name: str, jobs: list[NpuJob], *, work_dir: Path, log: Callable[[str], None]) -> dict:
    """NPU_VENDORS[name] on the jobs, or every cell not ok with the reason it could not run
    (a missing toolchain names the command that installs it)."""
    from ..npu.vendor import VendorError, missing_message, toolchain_python
    vendor = NPU_VENDORS[name]
    if toolchain_python(vendor.toolchain) is None:
        why = missing_message(vendor.toolchain)
        return {"ran": False, "error": why,
                "reports": {c: [npu_report(column=c, job=j, ok=False, error=why) for j in jobs] for c in vendor.columns}}
    try:
        reports = vendor.run(jobs, columns=vendor.columns, work_dir=work_dir, log=log)
    except VendorError as err:
        return {"ran": False, "error": str(err),
                "reports": {c: [npu_report(column=c, job=j, ok=False, error=str(err)) for j in jobs]
                            for c in vendor.columns}}
    for column, rows in reports.items():
        bad = [r for r in rows if set(r) != set(REPORT_KEYS)]
        if bad or len(rows) != len(jobs):
            raise RuntimeError(f"NPU vendor {name!r} column {column!r}: {len(rows)} report(s) for {len(jobs)} "
                               f"job(s); every report must come from npu_report()")
    return {"ran": True, "error": None, "reports": reports}
