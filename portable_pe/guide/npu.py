"""The guide's NPU section: vendor columns, each filled by the vendor's own compiler.

Each vendor in npu/vendors.py VENDORS fills its `guide_columns` (one per NPU it compiles
for) through its hooks' `guide(jobs, *, columns, work_dir, log, prepare)`, which returns,
per column, one report per job in job order, each made by npu/report.py's npu_report()
and so with exactly REPORT_KEYS. A vendor builds each (encoder, length) once and fills all
its columns from it (Vela compiles one int8 TFLite model for U55, U65 and U85); `prepare`
is the compile pipeline's, for a vendor whose build is the pipeline's vendor stage.

`portable-pe guide --targets npu-NAME` runs VENDORS[NAME]. The guide adds each report's
position work afterwards, from the time estimates: the encoder's estimate minus the
no-position encoder's at the same length and column (vendors without an estimate leave
it empty).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..npu.report import REPORT_KEYS, NpuJob, npu_report


def run_vendor(name: str, jobs: list[NpuJob], *, work_dir: Path, log: Callable[[str], None]) -> dict:
    """VENDORS[name] on the jobs, or every cell not ok with the reason it could not run
    (a missing toolchain names the command that installs it)."""
    from ..compile.pipeline import prepare
    from ..npu.toolchain import VendorError, missing_message, toolchain_python
    from ..npu.vendors import get_vendor, vendor_hooks
    vendor = get_vendor(name)
    columns = vendor.guide_columns

    def failed(why: str) -> dict:
        return {"ran": False, "error": why,
                "reports": {c: [npu_report(column=c, job=j, ok=False, error=why) for j in jobs] for c in columns}}
    if toolchain_python(vendor.name) is None:
        return failed(missing_message(vendor.name))
    try:
        reports = vendor_hooks(name).guide(jobs, columns=columns, work_dir=work_dir, log=log, prepare=prepare)
    except VendorError as err:
        return failed(str(err))
    for column, rows in reports.items():
        bad = [r for r in rows if set(r) != set(REPORT_KEYS)]
        if bad or len(rows) != len(jobs):
            raise RuntimeError(f"NPU vendor {name!r} column {column!r}: {len(rows)} report(s) for {len(jobs)} "
                               f"job(s); every report must come from npu_report()")
    return {"ran": True, "error": None, "reports": reports}
