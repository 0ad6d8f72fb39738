"""A vendor's simulator as a parity candidate: a row beside onnxruntime and TVM.

For a bundle whose manifest says a vendor built it (manifest["vendor"]["built"]), the
vendor's hooks (npu/vendors.py) give the candidate, e.g. "rknn-simulator". Outputs a
vendor stage stored at compile time, for the bundle's reference inputs, are looked up by
those inputs (npu/rknn_stage.py stored_runner), so `compile`'s report need not run the
vendor again.
"""

from __future__ import annotations

from typing import Callable


def vendor_runners(bundle, *, simulated: bool = False, log: Callable[[str], None] = print) -> dict:
    """{candidate name: runner} for the bundle's vendor build (empty when there is none).
    `simulated`: the simulator ran in this compile's vendor stage, on the reference inputs."""
    from .vendors import vendor_hooks
    info = bundle.manifest.get("vendor") or {}
    if not info.get("built"):
        return {}
    return vendor_hooks(info["name"]).simulator(bundle, simulated=simulated, log=log)
