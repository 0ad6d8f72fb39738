"""The VendorHooks record: what a vendor module (npu/vendors.py names them) does in the
flow, every hook declared; each vendor module defines HOOKS = VendorHooks(...)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


def _no_simulator(bundle, *, simulated: bool, log) -> dict:
    return {}


def _no_blocker(state) -> str | None:
    return None


@dataclass(frozen=True)
class VendorHooks:
    """What a vendor module does; a vendor with nothing to do for one keeps its default.

    build(state) -> compile.state.Added     the compile's vendor stage: the vendor's build,
                                            placement and accuracy (manifest "vendor", files)
    guide(jobs, *, columns, work_dir, log, prepare)  the guide's cells: per column, one npu_report
                                            per job (prepare: the compile pipeline's, handed in)
    describe(vendor_report) -> str          `inspect`'s line for the manifest's "vendor" section
    vendor_graph(model) -> model | None     the ONNX the vendor is handed, when it takes ONNX
    simulator(bundle, *, simulated, log)    {candidate name: runner} for the parity report
    blocker(state) -> str | None            why the vendor cannot take this graph at all (None: it can)
    prefix                                  the bundle folder for the vendor's files
    """
    prefix: str
    build: Callable
    guide: Callable
    describe: Callable[[dict], str]
    vendor_graph: Callable | None = None
    simulator: Callable = _no_simulator
    blocker: Callable = _no_blocker
