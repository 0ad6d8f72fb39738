"""The host CPU."""

from __future__ import annotations

import os

import tvm

from .backend import Backend


def tvm_target(spec, **options) -> tvm.target.Target:
    config = dict(spec.tvm)
    if config.get("mcpu") == "host":
        config["mcpu"] = tvm.target.codegen.llvm_get_system_cpu()
    config.setdefault("num-cores", os.cpu_count() or 1)
    return with_reassociation(tvm.target.Target(config))


def with_reassociation(target: tvm.target.Target) -> tvm.target.Target:
    """Let LLVM reorder float additions, maxima and products (and nothing else of fast-math).

    The row reductions of layer norm and softmax (sum, max over the last axis) are
    loop-carried chains that LLVM may only vectorize when it may reassociate them; without
    it every element waits for the previous add. Measured on the rope graph, one znver4
    core: layer norm 65 -> 15 us per call at T=128. Outputs move by float rounding only
    (max abs error vs PyTorch 1.7e-06 before and after)."""
    return tvm.target.Target({**target.export(), "fast-math-reassoc": True})


def relax_pipeline(target, precision: str = "fp32"):
    # TVM's stock CPU pipeline schedules nothing (serial, scalar loops): ours adds
    # parallel, vectorized, tiled schedules for every kernel.
    from ..cpu_schedule import cpu_pipeline
    return cpu_pipeline(target, precision=precision)


def host_features(cpu: str) -> list[str]:
    """The bf16 LLVM features this machine's CPU reports that LLVM's model of `cpu` lacks
    (host_cpu.py: a virtual machine may show an older model number); AMX only where Linux
    lets this process use it."""
    from tvm.target.codegen import llvm_get_cpu_features
    from ..host_cpu import amx_permitted, llvm_features_here
    known = set(llvm_get_cpu_features(tvm.target.Target({"kind": "llvm", "mcpu": cpu})))
    found = sorted(llvm_features_here() - known)
    if "amx-tile" in found and not amx_permitted():
        found = [f for f in found if not f.startswith("amx")]
    return found


def for_precision(target: tvm.target.Target, spec, precision: str) -> tvm.target.Target:
    """bf16 needs AMX-BF16 or AVX512-BF16: the host's, when the target is the host CPU.
    int8 gets the host's too, unrequired: its matmuls run on AMX-INT8 and its attention on
    AMX-BF16 where the host has them (int8_isa.has_amx_int8, bf16_plan.BF16_ATTENTION_PRECISIONS)."""
    if precision not in ("bf16", "int8"):
        return target
    from ..cpu_schedule.bf16_isa import bf16_kernel, needed_features
    if spec.tvm.get("mcpu") == "host":
        extra = host_features(str(target.attrs["mcpu"]))
        if extra:
            config = dict(target.export())
            config["mattr"] = [*config.get("mattr", []), *(f"+{f}" for f in extra)]
            target = tvm.target.Target(config)
    if precision == "bf16" and bf16_kernel(target) is None:
        raise ValueError(f"--precision bf16 needs an x86 CPU with {needed_features('x86')} (AMX tdpbf16ps or AVX-512 vdpbf16ps); "
                         f"target {spec.name!r} ({target.attrs.get('mcpu', 'generic')}) has neither: build fp32 "
                         f"(the default) or --precision int8")
    return target


BACKEND = Backend(name="llvm", tvm_target=tvm_target, relax_pipeline=relax_pipeline,
                  precisions=("fp32", "int8", "bf16"),  # quant.PRECISIONS it builds; the first is the default
                  for_precision=for_precision, runs_here=True)
