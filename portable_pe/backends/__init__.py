"""Per-target build code: one Backend record per target kind, every hook declared.

BACKENDS maps a target spec's `backend` (targets/<name>.toml) to the module that defines
its record, ``BACKEND = Backend(...)``. A hook a target has nothing to do for keeps its
default, so callers never look a hook up with getattr, and nothing outside a backend
branches on its kind:

    tvm_target(spec, **options)      -> tvm.target.Target   (options: the target's TOML options)
    relax_pipeline(target, precision) -> the Relax pipeline tvm.compile runs (precision: quant.PRECISIONS)
    for_precision(target, spec, precision) -> tvm.target.Target  the target a precision builds for, or an error
    legalize_onnx(model, state)      -> Added               target rewrites before the import
    vendor_build(state)              -> Added               a vendor compiler's build (npu)
    finalize(state)                  -> Added               checks that need the build
    export_library(executable, path, *, target_options)     writes model.so
    precisions                                              what --precision may be; first = default
    runs_here                                               its code runs on this machine
    tuning_variant(options, target)  -> str | None          a database per board or arch
    check_tunable(target)                                   what MetaSchedule needs, or an error
    fusion_passes(target)            -> list of passes      the kernels tuning extracts
    build_candidate(mod, target)                            one tuning candidate's build
    build(mod, target, pipeline)     -> the compile's executable (tvm.compile; cuda: in the target's scope)

Backends read the CompileState and never write to it: what they make goes back to the
stage as an Added record (compile/state.py), which the stage list records.
"""

from __future__ import annotations

import importlib

from .backend import Backend, export_here  # noqa: F401 (the record and its default export, for callers)

#: backend name -> the module holding its BACKEND record
BACKENDS = {
    "llvm": "portable_pe.backends.llvm",
    "cuda": "portable_pe.backends.cuda",
    "arm": "portable_pe.backends.arm",
    "npu": "portable_pe.backends.npu",
}


def get_backend(name: str) -> Backend:
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; valid: {', '.join(BACKENDS)}")
    return importlib.import_module(BACKENDS[name]).BACKEND
