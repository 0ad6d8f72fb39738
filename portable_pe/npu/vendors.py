"""NPU vendor compilers: one registry that the compile, the parity simulator row, `inspect`
and the guide all read.

VENDORS maps a profile's `vendor` key (targets/npu/*.toml) to a Vendor record: what the
CLI and the guide show without loading anything heavy, and the module whose HOOKS (a
vendor_hooks.VendorHooks record, every hook declared) do the work. Adding a vendor is one entry here,
a toolchain script (scripts/toolchains/NAME.sh) and a module with HOOKS.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from .vendor_hooks import VendorHooks


@dataclass(frozen=True)
class Vendor:
    name: str                        # the toolchain: `bash scripts/npu_toolchain.sh NAME`
    description: str
    guide_columns: tuple[str, ...]   # `portable-pe guide --targets npu-NAME`: one column per NPU
    module: str                      # the module holding HOOKS
    #: The profile's check of the host ONNX graph never decides while the vendor builds: the
    #: vendor's placement does, and the check is a prediction checked against it (a warning).
    #: True: when no vendor build is made (toolchain missing, --vendor-build skip, a graph the
    #: vendor cannot take), a node the profile refuses stops the compile, and the refusal names
    #: the graph it judged; False: the vendor runs what its NPU lacks on the CPU, so a refusal
    #: stays a prediction.
    precheck_decides_without_build: bool = False


VENDORS: dict[str, Vendor] = {
    "rknn": Vendor("rknn", "Rockchip RK3588 through RKNN-Toolkit2 (build, layer table, simulator)",
                   ("rknn-rk3588",), "portable_pe.npu.rknn_stage"),
    # U65 (npu/vela.py ACCELERATORS) is left out of the guide: at T=4096 each Vela compile
    # for the U55/U65 took 50 s, and the guide's goal is U85 and U55
    "ethos-u": Vendor("ethos-u", "Arm Ethos-U85 and U55 through Vela (PyTorch -> int8 TFLite by litert-torch)",
                      ("ethos-u85", "ethos-u55"), "portable_pe.npu.vela_stage",
                      precheck_decides_without_build=True),
}


def get_vendor(name: str) -> Vendor:
    if name not in VENDORS:
        raise ValueError(f"unknown NPU vendor {name!r}; valid: {', '.join(VENDORS)}")
    return VENDORS[name]


def vendor_hooks(name: str) -> VendorHooks:
    return importlib.import_module(get_vendor(name).module).HOOKS
