"""NVIDIA GPUs: dlight GPU schedules on every kernel, host code for the local CPU.

Builds anywhere (no GPU needed: the executable then holds CUDA C source, which tests
compile with nvcc); runs only where a GPU is.
"""

from __future__ import annotations

import re

import tvm

from . import llvm

_ARCH = re.compile(r"sm_\d{2,3}[af]?")
_KERNEL = re.compile(r'extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(')


def default_arch(spec) -> str:
    """The local GPU's arch when there is one, else targets/cuda.toml's fallback."""
    device = tvm.cuda(0)
    if device.exist:
        return "sm_" + device.compute_version.replace(".", "")
    return spec.options["arch"]["fallback"]


def tvm_target(spec, *, arch: str | None = None) -> tvm.target.Target:
    arch = arch or default_arch(spec)
    if not _ARCH.fullmatch(arch):
        raise ValueError(f"CUDA arch {arch!r} is not an SM arch; expected e.g. sm_80, sm_86, sm_87, sm_89, sm_90")
    return tvm.target.Target({**spec.tvm, "arch": arch}, host=llvm.tvm_target(_host_spec()))


def _host_spec():
    from ..targets import load_target
    return load_target("llvm")


def relax_pipeline(target):
    """TVM's CUDA pipeline: legalize, fuse, then dlight GPU rules (Matmul, GEMV, Reduction,
    GeneralReduction, Fallback) so every loop is bound to blocks/threads. An unbound
    kernel fails the build ("Did you forget to bind?"), so a build that succeeds is bound."""
    from tvm.relax.backend.cuda.pipeline import get_default_pipeline
    return get_default_pipeline(target)


def legalize_onnx(model, state):
    return llvm.legalize_onnx(model, state)


def export_library(executable, path, *, target_options: dict | None = None) -> None:
    executable.export_library(str(path))


def cuda_source(executable) -> str:
    """The CUDA C source of every kernel in a built executable (found by module kind, not
    by position in the import tree)."""
    stack, sources = [executable.mod], []
    while stack:
        module = stack.pop()
        if module.kind == "cuda":
            sources.append(module.inspect_source())
        stack.extend(module.imports)
    if not sources:
        raise RuntimeError("the executable holds no CUDA module: the build produced no GPU kernels")
    return "\n".join(sources)


def kernel_names(source: str) -> set[str]:
    """Kernel names defined (or declared: TVM forward-declares each one) in CUDA source."""
    return set(_KERNEL.findall(source))


def finalize(state) -> dict:
    """Record the kernels in the manifest; with --keep-intermediates dump their CUDA source
    (tests compile that with nvcc, so a broken kernel is caught without a GPU)."""
    import hashlib
    source = cuda_source(state.executable)
    state.dump("06-kernels.cu", source)
    return {"cuda": {"arch": str(state.tvm_target.arch), "kernels": sorted(kernel_names(source)),
                     "source_sha256": hashlib.sha256(source.encode()).hexdigest()}}
