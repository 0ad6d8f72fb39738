"""The vendor simulator as a parity candidate: a row beside onnxruntime and TVM.

For a bundle whose manifest says a vendor built it (manifest["vendor"]["built"]), the
candidate "<vendor>-simulator" runs the vendor's simulator on the parity inputs. During
`compile` the simulator already ran on the reference inputs (rknn/simulator.npz), so those
outputs are used when the inputs are the same arrays; otherwise (and always for
`parity BUNDLE`) the vendor's toolchain runs again.
"""

from __future__ import annotations

from typing import Callable

import numpy as np


def vendor_runners(bundle, *, simulated: bool = False, log: Callable[[str], None] = print) -> dict:
    """{candidate name: runner} for the bundle's vendor build (empty when there is none)."""
    from .vendor import missing_message, toolchain_python
    from .vendors import VENDORS, get_vendor
    info = bundle.manifest.get("vendor") or {}
    if not info.get("built"):
        return {}
    if info["name"] not in VENDORS:  # Vela (Ethos-U): its int8 accuracy is in the manifest, no simulator row
        acc = info.get("accuracy_int8") or {}
        if acc:
            log(f"note: {info['name']}: the int8 TFLite model Vela compiled, run on LiteRT against PyTorch "
                f"fp32 at build time: cosine {acc.get('cosine', float('nan')):.6f}, "
                f"max abs {acc.get('max_abs', float('nan')):.3g} (no simulator row)")
        return {}
    vendor = get_vendor(info["name"])
    name = f"{info['name']}-simulator"
    stored = _stored_outputs(bundle, vendor.PREFIX) if simulated else {}

    def run(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        hit = stored.get(_key(inputs))
        return hit if hit is not None else vendor.rebuild_and_simulate(bundle, [inputs], log=log)[0]

    if not stored and toolchain_python(vendor.TOOLCHAIN) is None:
        log(f"note: no {name} row: {missing_message(vendor.TOOLCHAIN)}")
        return {}
    return {name: run}


def _key(inputs: dict[str, np.ndarray]) -> bytes:
    return b"".join(k.encode() + np.ascontiguousarray(v).tobytes() for k, v in sorted(inputs.items()))


def _stored_outputs(bundle, prefix: str) -> dict[bytes, dict[str, np.ndarray]]:
    """Simulator outputs saved at compile time, keyed by the reference inputs they ran on."""
    path = bundle.file(prefix + "simulator.npz")
    if not path.is_file():
        return {}
    with np.load(path) as sim, np.load(bundle.file("reference.npz")) as ref:
        out = {}
        for length in {k.split("/")[0] for k in sim.files}:
            inputs = {k.split("/")[-1]: ref[k] for k in ref.files if k.startswith(f"{length}/in/")}
            out[_key(inputs)] = {k.split("/")[-1]: sim[k] for k in sim.files if k.startswith(f"{length}/out/")}
        return out
