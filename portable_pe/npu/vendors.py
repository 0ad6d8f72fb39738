"""NPU vendor compilers: VENDORS maps a profile's `vendor` key (targets/npu/*.toml) to the
module that drives that vendor's toolchain. Adding a vendor is one line here and a module
with the same names:

    TOOLCHAIN               the name `bash scripts/npu_toolchain.sh NAME` sets up
    PREFIX                  the bundle folder for the vendor's files (e.g. "rknn/")
    SOCS, DTYPES            the chips and --npu-dtype values the module can build for (the
                            profile's `socs` list is what --soc offers)
    vendor_graph(model)     the ONNX the vendor is handed (e.g. opset lowered)
    build(model, *, soc, dtype, calibration, simulate, log) -> VendorBuild
                            build, placement from the vendor's log, simulator outputs
    rebuild_and_simulate(bundle, inputs, *, log) -> [outputs]   the `parity` row
"""

from __future__ import annotations

import importlib

VENDORS = {
    "rknn": "portable_pe.npu.rknn",  # Rockchip RKNN-Toolkit2 (RK3588/RK3576/RK3568)
}


def get_vendor(name: str):
    if name not in VENDORS:
        raise ValueError(f"unknown NPU vendor {name!r}; valid: {', '.join(VENDORS)}")
    return importlib.import_module(VENDORS[name])
