"""NVIDIA GPUs: dlight GPU schedules on every kernel, host code for the local CPU.

Builds anywhere (no GPU needed: the executable then holds CUDA C source, which tests
compile with nvcc); runs only where a GPU is.
"""

from __future__ import annotations

import re

import tvm

from . import llvm
from .backend import Backend

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
    from .targets import load_target
    return load_target("llvm")


def fusion_passes(target) -> list:
    """Everything before scheduling in TVM's CUDA pipeline: the kernels tuning extracts
    and the tuning database is keyed by (their structural hashes)."""
    from ..cpu_schedule.dim_vars import WithNamedDims
    # a pixel graph's token count (H // P * (W // P) + extras) as one variable, as on CPU
    # (dim_vars): dlight's rules cannot bind loops over the expression
    from .cuda_math import PowerAsProducts
    # x ** 2 as x * x: nvcc's fast math (TVM's default) makes powf NaN for a negative base
    return [WithNamedDims([PowerAsProducts(), *_tvm_cuda().library_dispatch_passes(target),
                           *_tvm_legalize(target)[0]])]


def relax_pipeline(target, precision: str = "fp32"):
    """TVM's CUDA pipeline with the tuning database applied before the GPU schedule rules
    (cuda_rules.GPUSchedule: dlight's Matmul, GEMV, Reduction, GeneralReduction, each
    falling through to the next when it fails on a kernel, then BindSpatialLoops in
    Fallback's place), which schedule
    every kernel the database has nothing for, so every loop is bound to blocks/threads. An
    unbound kernel fails the build ("Did you forget to bind?"), so a build that succeeds
    is bound. The pass's report() names the kernels that fell through (manifest
    "cuda_schedules")."""
    from ..cpu_schedule.pipeline import ApplyTuningDatabase
    from .cuda_rules import FallThroughLog, GPUSchedule
    cuda = _tvm_cuda()

    @tvm.transform.module_pass(opt_level=0, name="PortablePECUDAPipeline")
    class _Pipeline:
        def __init__(self):
            self.log = FallThroughLog()

        def report(self) -> dict:
            return {"cuda_schedules": {"fell_through": self.log.to_manifest()}} if self.log.failures else {}

        def transform_module(self, mod, _ctx):
            with target:
                return tvm.transform.Sequential([*fusion_passes(target), ApplyTuningDatabase,
                                                 GPUSchedule(self.log), *cuda.dataflow_lower_passes(target),
                                                 *cuda.finalize_passes(target)])(mod)
    return _Pipeline()


def _tvm_cuda():
    from tvm.relax.backend.cuda import pipeline
    return pipeline


def _tvm_legalize(target):
    """TVM's CUDA legalize passes split before their last one, the dlight schedules
    (which cuda_rules.GPUSchedule replaces)."""
    *fuse, dlight = _tvm_cuda().legalize_passes(target)
    if "ApplyDefaultSchedule" not in str(dlight.info.name):
        raise RuntimeError(f"TVM's CUDA legalize passes no longer end with dlight's ApplyDefaultSchedule "
                           f"(last: {dlight.info.name}): portable_pe/backends/cuda.py needs updating")
    return fuse, dlight


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


def finalize(state):
    """Record the kernels in the manifest; with --keep-intermediates dump their CUDA source
    (tests compile that with nvcc, so a broken kernel is caught without a GPU)."""
    import hashlib
    from ..compile.state import Added
    source = cuda_source(state.executable)
    state.dump("06-kernels.cu", source)
    code = kernel_code()
    if code == "source":
        state.log(f"  kernels kept as CUDA source: {SOURCE_ONLY}")
    return Added(report={"cuda": {"arch": str(state.tvm_target.arch), "kernels": sorted(kernel_names(source)),
                                  "kernel_code": code, "source_sha256": hashlib.sha256(source.encode()).hexdigest()}})


#: why a bundle built without TVM's CUDA runtime holds kernel source, and what that means
SOURCE_ONLY = ("TVM here has no CUDA runtime (no NVIDIA driver), so nvcc was not run on them; a runtime-only TVM "
               "on the GPU machine cannot load this bundle. Compile on a machine with the NVIDIA driver (the GPU "
               "machine, or a build machine with the driver installed) for kernels in the bundle")


def kernel_code() -> str:
    """What a build's model.so holds for its kernels: "binary" (nvcc or NVRTC ran, through
    TVM's CUDA runtime, which needs the driver's libcuda) or "source" (CUDA C only)."""
    return "binary" if tvm.runtime.enabled("cuda") else "source"


def tuning_variant(options: dict, target) -> str:
    """Tuning databases are per GPU arch: targets/tuning/cuda/<sm_XY>/<graph>/."""
    return str(target.attrs["arch"])


def check_tunable(target) -> None:
    """Tuning builds candidates here, and TVM only compiles CUDA kernels to a binary where
    its CUDA runtime is enabled (the NVIDIA driver is present); elsewhere a build holds CUDA
    source only, which a GPU cannot load."""
    if not tvm.runtime.enabled("cuda"):
        raise ValueError("tuning for cuda builds each candidate on this machine, and TVM here has no CUDA runtime "
                         "(no NVIDIA driver): its builds hold CUDA source only, which a GPU cannot load. Run "
                         "`portable-pe tune --target cuda` on a machine with the driver (the GPU box itself, or a "
                         "build machine with one) and point --rpc-tracker at the GPUs")


def _use_nvcc() -> None:
    """TVM compiles CUDA kernels through tvm_callback_cuda_compile, whose default (NVRTC)
    needs the cuda-bindings package; use nvcc when it is on PATH and no compiler was asked
    for (TVM_CUDA_COMPILE_MODE)."""
    import os
    import shutil
    if shutil.which("nvcc") and "TVM_CUDA_COMPILE_MODE" not in os.environ:
        os.environ["TVM_CUDA_COMPILE_MODE"] = "nvcc"


def _prepare_codegen() -> None:
    """What every cuda build needs before TVM emits its kernels: nvcc as the compiler, and
    sin/cos lowered with their argument reduced (cuda_intrin: nvcc's fast math)."""
    from .cuda_intrin import register
    _use_nvcc()
    register()


def build(mod, target, pipeline):
    """The compile's build, inside the target's scope: the kernel compiler takes the SM
    arch from the target in scope, and without one nvcc fails ("No CUDA architecture was
    specified or GPU detected") or, on a GPU box, builds for the local GPU instead of
    --arch."""
    _prepare_codegen()
    with target:
        return tvm.compile(mod, target=target, relax_pipeline=pipeline)


def build_candidate(mod, target):
    """A tuning candidate, built as the compile builds (build)."""
    _prepare_codegen()
    with target:
        return tvm.compile(mod, target=target)


BACKEND = Backend(name="cuda", tvm_target=tvm_target, relax_pipeline=relax_pipeline, finalize=finalize,
                  tuning_variant=tuning_variant, check_tunable=check_tunable, fusion_passes=fusion_passes,
                  build_candidate=build_candidate, build=build)
