"""Per-target build code. Every backend module has the same functions:

    tvm_target(spec, **options) -> tvm.target.Target
    relax_pipeline(target)      -> tvm.transform.Pass | str   (for tvm.compile)
    legalize_onnx(model, state) -> onnx.ModelProto | Legalized (target rewrites before import)
    export_library(executable, path, *, target_options) -> None   (writes model.so)

and optionally

    vendor_build(state) -> Staged | None    (a vendor compiler's build, e.g. RKNN for npu)
    finalize(state)     -> dict | Staged    (checks that need the build and the reference)

Backends read the CompileState and never write to it: what they make goes back to the
stage in compile.py, which records it (Legalized, Staged).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

BACKENDS = ("llvm", "cuda", "arm", "npu")


@dataclass
class Legalized:
    """legalize_onnx's result beyond the model: the stage records each field it is given."""
    model: object                      # onnx.ModelProto
    io: dict | None = None             # inputs/outputs when legalizing changed them (static shapes)
    tolerance: dict | None = None      # per-dtype tolerance overrides for parity
    report: dict = field(default_factory=dict)            # manifest sections
    files: dict[str, bytes] = field(default_factory=dict)  # extra bundle files, by bundle path
    reference_model: object = None     # foreign ONNX: the float graph the reference runs (not a
                                       # quantized model.onnx), shipped as reference.onnx


@dataclass
class Staged:
    """A later stage's result: manifest sections and extra bundle files."""
    report: dict = field(default_factory=dict)
    files: dict[str, bytes] = field(default_factory=dict)


def get_backend(name: str):
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; valid: {', '.join(BACKENDS)}")
    return importlib.import_module(f"{__name__}.{name}")
