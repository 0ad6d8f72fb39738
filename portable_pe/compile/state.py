"""What the compile stages share: the request, and what the stages have added to it.

Each stage reads a CompileState and returns an Added record (or None), and the stage
list (pipeline.py) applies it: a stage, or a backend hook it calls, never writes to the
state itself, so every value in it was set by exactly one place, named in the stage list.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    import onnx
    import tvm
    from ..backends.targets import TargetSpec
    from ..bundle.reference import ReferenceCase
    from ..spec.graphs import GraphSpec
    from .intermediates import Intermediates


@dataclass(frozen=True)
class CompileRequest:
    """What the user asked for, as compile_graph received it."""
    source: str | GraphSpec                    # a shipped graph name, a .toml or .onnx path, or a spec
    target: TargetSpec
    target_options: dict = field(default_factory=dict)   # the target's options as given (target stage merges defaults)
    shapes: dict[str, list[int]] = field(default_factory=dict)  # --shape: foreign input dims to pin
    precision: str = "fp32"                     # quant.PRECISIONS
    exporter: str = "torchscript"               # compile/export.py EXPORTERS
    use_tuning: bool = True                     # apply targets/tuning/<target>/<graph> when it exists
    pe_tables: str | None = None                # "int8": stored position tables as int8 rows
    dim_relations: tuple = ()                   # --dim-relation: spec.dims.DimRelation records stated
    reference_sizes: tuple = ()                 # --sizes ("224x224", ...): a vision graph's stored reference cases


@dataclass(frozen=True)
class Added:
    """What one stage adds: each product it makes (None: left as it was), manifest
    sections (merged into the report, a section replaced as a whole) and bundle files."""
    target_options: dict | None = None
    tvm_target: tvm.target.Target | None = None
    spec: GraphSpec | None = None
    name: str | None = None
    model: onnx.ModelProto | None = None
    io: dict | None = None
    relax: tvm.IRModule | None = None
    tuning: dict | None = None
    reference: tuple[ReferenceCase, ...] | None = None
    reference_model: onnx.ModelProto | None = None
    executable: object = None                   # tvm.relax.VMExecutable
    report: dict = field(default_factory=dict)
    files: dict[str, bytes] = field(default_factory=dict)


_PRODUCTS = tuple(f.name for f in fields(Added) if f.name not in ("report", "files"))


@dataclass
class CompileState:
    request: CompileRequest
    log: Callable[[str], None] = print
    intermediates: Intermediates | None = None
    # the products, each set by one stage's Added record
    target_options: dict = field(default_factory=dict)    # resolved: the target's defaults merged in
    tvm_target: tvm.target.Target | None = None
    spec: GraphSpec | None = None                         # None for a foreign .onnx source
    name: str = ""
    model: onnx.ModelProto | None = None                  # the graph as the last stage left it
    io: dict = field(default_factory=dict)                # inputs, outputs, dims (spec/io_names.describe_io)
    relax: tvm.IRModule | None = None
    tuning: dict = field(default_factory=dict)            # database, digest, specialized entries
    reference: tuple[ReferenceCase, ...] = ()
    reference_model: onnx.ModelProto | None = None        # foreign ONNX: the graph the reference runs
    executable: object = None
    report: dict = field(default_factory=dict)            # manifest sections the stages wrote
    files: dict[str, bytes] = field(default_factory=dict)  # extra bundle files (rknn/, vela/, model.so)
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def target(self) -> TargetSpec:
        return self.request.target

    def apply(self, added: Added | None) -> None:
        if added is None:
            return
        for name in _PRODUCTS:
            value = getattr(added, name)
            if value is not None:
                setattr(self, name, value)
        self.report.update(added.report)
        self.files.update(added.files)

    def dump(self, filename: str, content: str | bytes) -> None:
        if self.intermediates is not None:
            self.intermediates.dump(filename, content)
