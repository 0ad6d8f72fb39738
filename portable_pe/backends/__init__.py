"""Per-target build code. Every backend module has the same functions:

    tvm_target(spec, **options) -> tvm.target.Target
    relax_pipeline(target)      -> tvm.transform.Pass | str   (for tvm.compile)
    legalize_onnx(model, state) -> onnx.ModelProto            (target rewrites before import)
    export_library(executable, path) -> None                   (writes model.so)
"""

from __future__ import annotations

import importlib

BACKENDS = ("llvm", "cuda", "arm", "npu")


def get_backend(name: str):
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; valid: {', '.join(BACKENDS)}")
    return importlib.import_module(f"{__name__}.{name}")
