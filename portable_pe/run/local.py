"""Run a bundle: locally (run_local) or on a board over TVM RPC (run_rpc), one signature.

Inputs are checked against the manifest before anything runs: names, dtypes, ranks,
static dims, symbolic dims within their bounds and consistent across inputs.
"""

from __future__ import annotations

import platform

import numpy as np

from ..bundle.artifact import Bundle, BundleError
from ..bundle.shared_library import check_shared_library
from ..spec.dims import dim_sum_error, relation_error
from ..spec.io_names import BATCH, SEQ
from ..spec.schema import multiple_text


class InputError(ValueError):
    """Inputs that do not match what the bundle was compiled for."""


def check_inputs(manifest: dict, inputs: dict[str, np.ndarray]) -> None:
    specs = {spec["name"]: spec for spec in manifest["inputs"]}
    missing, extra = sorted(set(specs) - set(inputs)), sorted(set(inputs) - set(specs))
    if missing or extra:
        raise InputError(f"inputs must be named {sorted(specs)}; missing {missing}, unexpected {extra}")
    bounds = manifest.get("dims", {})
    bound_values: dict[str, int] = {}
    for name, spec in specs.items():
        array = inputs[name]
        if str(array.dtype) != spec["dtype"]:
            raise InputError(f"input {name!r} must be {spec['dtype']}, got {array.dtype}")
        if array.ndim != len(spec["dims"]):
            raise InputError(f"input {name!r} must have rank {len(spec['dims'])} {spec['dims']}, "
                             f"got shape {list(array.shape)}")
        for axis, (dim, size) in enumerate(zip(spec["dims"], array.shape)):
            if isinstance(dim, int):
                if size != dim:
                    raise InputError(f"input {name!r} axis {axis} must be {dim}, got {size} "
                                     f"(shape {list(array.shape)}, expected {spec['dims']})")
                continue
            lo, hi = bounds.get(dim, {}).get("min", 1), bounds.get(dim, {}).get("max")
            if size < lo or (hi is not None and size > hi):
                raise InputError(f"input {name!r} axis {axis} ({dim}) is {size}; this bundle accepts "
                                 f"{dim} in {lo}..{hi}{' ' + bounds[dim]['why'] if 'why' in bounds.get(dim, {}) else ''}")
            step = bounds.get(dim, {}).get("multiple", 1)
            if size % step:  # a vision graph's pixels: whole patches (or windows) only
                what = multiple_text(step, bounds[dim].get("patch", step))
                raise InputError(f"input {name!r} axis {axis} ({dim}) is {size}; it must be a multiple of {what} "
                                 f"(e.g. {size - size % step or step} or {size - size % step + step})")
            if bound_values.setdefault(dim, size) != size:
                raise InputError(f"dim {dim!r} is {bound_values[dim]} in one input and {size} in "
                                 f"input {name!r}; they must agree")
    beyond = dim_sum_error(manifest, bound_values) or relation_error(manifest, bound_values)
    if beyond:
        raise InputError(beyond)
    for name, limit in manifest.get("value_limits", {}).items():
        values = inputs[name]
        if values.size and (values.min() < limit["min"] or values.max() > limit["max"]):
            raise InputError(f"input {name!r} values must lie in {limit['min']}..{limit['max']} "
                             f"({limit['why']}); got {values.min()}..{values.max()}")


def _outputs(result, names: list[str]) -> dict[str, np.ndarray]:
    values = [result] if hasattr(result, "numpy") else list(result)
    if len(values) != len(names):
        raise BundleError(f"the module returned {len(values)} outputs, the manifest names {names}")
    return {name: value.numpy() for name, value in zip(names, values)}


class LocalRunner:
    """A bundle's model.so loaded into a Relax VM on this machine."""

    def __init__(self, bundle: Bundle):
        import tvm
        from tvm import relax
        from ..threads import default_tvm_threads
        default_tvm_threads()  # before TVM's pool starts, which this VM's first run does
        device_kind = bundle.manifest["target"]["device"]
        host = bundle.manifest["target"].get("host_arch")
        if host and host != platform.machine():
            raise BundleError(f"bundle {bundle.path} was built for {host} ({bundle.target} target); "
                              f"this machine is {platform.machine()}. Run it on the board: "
                              f"`portable-pe deploy {bundle.path} --rpc HOST:PORT`")
        _require_cpu_instructions(bundle)
        self.device = tvm.device(device_kind, 0)
        if not self.device.exist:
            raise BundleError(f"bundle {bundle.path} needs a {device_kind} device, none is present here")
        self.manifest = bundle.manifest
        check_shared_library(bundle.file("model.so"))  # a truncated one dies by SIGBUS inside load_module
        self.vm = relax.VirtualMachine(tvm.runtime.load_module(str(bundle.file("model.so"))), self.device)
        self._tensor = lambda a: tvm.runtime.tensor(a, device=self.device)

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        check_inputs(self.manifest, inputs)
        args = [self._tensor(np.ascontiguousarray(inputs[spec["name"]])) for spec in self.manifest["inputs"]]
        return _outputs(self.vm[entry_for(self.manifest, inputs)](*args), [o["name"] for o in self.manifest["outputs"]])


def _require_cpu_instructions(bundle: Bundle) -> None:
    """A bundle's AMX or AVX512-BF16 kernels (--precision bf16's, an int8 build's bf16
    attention and AMX-INT8 matmuls, as its manifest's "bf16" and "int8" sections name
    them): on a CPU without their instructions the first one would stop the process
    (SIGILL), so say so first."""
    from ..cpu_schedule.bf16_isa import KERNEL_FEATURES
    from ..cpu_schedule.int8_isa import AMX_INT8_FEATURES
    from ..host_cpu import LLVM_FEATURE_OF_FLAG, amx_permitted, llvm_features_here
    features = {**KERNEL_FEATURES, "amx-int8": AMX_INT8_FEATURES}
    for section in ("bf16", "int8"):
        kernel = bundle.manifest.get(section, {}).get("kernel")
        if kernel not in features:
            continue
        needs = features[kernel]
        missing = sorted(set(needs) - llvm_features_here())
        if not missing and kernel.startswith("amx") and not amx_permitted():
            missing = ["permission to use AMX tiles (arch_prctl ARCH_REQ_XCOMP_PERM refused)"]
        if missing:
            flags = {v: k for k, v in LLVM_FEATURE_OF_FLAG.items()}
            raise BundleError(f"bundle {bundle.path} runs its {section} kernels on {kernel}, which needs "
                              f"{', '.join(flags.get(f, f) for f in needs)}; this CPU has no "
                              f"{', '.join(flags.get(f, f) for f in missing)} (/proc/cpuinfo). Compile it on this "
                              f"machine (--precision {bundle.manifest.get('precision', section)} picks what the CPU "
                              f"has) or use a float32 bundle")


def entry_for(manifest: dict, inputs: dict[str, np.ndarray]) -> str:
    """`main`, or the tuned static entry whose (batch, seq) the inputs match exactly."""
    sizes = {}
    for spec in manifest["inputs"]:
        for dim, size in zip(spec["dims"], inputs[spec["name"]].shape):
            if isinstance(dim, str):
                sizes[manifest["dims"][dim]["role"]] = size
    for entry in manifest.get("tuning", {}).get("specializations", []):
        if all(sizes.get(role, entry[role]) == entry[role] for role in (BATCH, SEQ)):  # a tuned point's roles
            return entry["function"]
    return "main"


def run_local(bundle: Bundle, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return LocalRunner(bundle).run(inputs)
