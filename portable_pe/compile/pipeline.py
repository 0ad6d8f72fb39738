"""The compile pipeline, read top to bottom like the README's diagram.

    target -> load -> export -> simplify -> tables -> legalize -> quantize -> import
           -> tuning -> reference -> vendor -> build -> finalize -> bundle

Each stage (stages.py) returns what it adds, and run_stages applies it to the state;
with keep_intermediates each stage dumps what it produced, so a user can see where a
number went wrong. The vendor stage (a vendor NPU compiler, when the target has one)
comes before TVM's build, so a vendor failure is reported before minutes of host
compilation.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from ..backends import get_backend
from ..backends.targets import TargetSpec, load_target
from ..bundle.artifact import Bundle, bundle_writer
from ..interrupts import raise_if_interrupted
from ..npu.toolchain import VendorError
from ..spec.graphs import GraphSpec
from ..threads import default_tvm_threads
from .export import DEFAULT_EXPORTER
from .intermediates import Intermediates
from .manifest import write_compiled_bundle
from .state import CompileRequest, CompileState
from .stages import (stage_build, stage_export, stage_finalize, stage_import, stage_legalize, stage_load,
                     stage_quantize, stage_reference, stage_simplify, stage_tables, stage_target, stage_tuning,
                     stage_vendor)


class CompileError(RuntimeError):
    """A stage failed; the message names the stage and the source."""


STAGES = [("target", stage_target), ("load", stage_load), ("export", stage_export), ("simplify", stage_simplify),
          ("tables", stage_tables), ("legalize", stage_legalize), ("quantize", stage_quantize),
          ("import", stage_import), ("tuning", stage_tuning), ("reference", stage_reference),
          ("vendor", stage_vendor), ("build", stage_build), ("finalize", stage_finalize)]
#: what only the TVM build of the graph needs; a vendor's build (the guide's NPU columns) leaves them out
HOST_BUILD_STAGES = ("import", "tuning", "build", "finalize")


def compile_graph(source: str | GraphSpec, *, target: str = "llvm", out: str | Path | None = None,
                  keep_intermediates: bool = False, shapes: dict[str, list[int]] | None = None,
                  target_options: dict | None = None, pe_tables: str | None = None, tuning: bool = True,
                  exporter: str = DEFAULT_EXPORTER, precision: str | None = None, force: bool = False,
                  dim_relations: tuple = (), reference_sizes: tuple = (),
                  log: Callable[[str], None] = print) -> Bundle:
    """Compile a shipped graph name, a TOML spec or an .onnx file into a verified bundle.

    `target_options` go to the backend's tvm_target() (e.g. board= for arm, arch= for cuda).
    `tuning=False` ignores the graph's tuning database (the "TVM untuned" build).
    `exporter` exports specs to ONNX (export.EXPORTERS); .onnx sources ignore it.
    Nothing is written to `out` unless every stage succeeds. `out` may be an existing
    bundle or a new path; `force` lets it replace anything else (bundle/paths.py).
    `precision` (quant.PRECISIONS, default: the target's first) "int8" quantizes the
    constant-weight matmuls (default bundle folder dist/<graph>-<target>-int8).
    `dim_relations` (spec.dims.DimRelation, or "s53=past+T" strings): how a foreign graph's
    dims are tied, where the compile cannot learn it (compile/relation_probe.py).
    `reference_sizes` ("224x224", ...): a vision graph's reference cases stored in the bundle
    (default: parity's default_sizes), which the bundle checks itself at on another machine.
    """
    default_tvm_threads()  # before TVM's pool starts: the build and the npu's check run kernels
    spec = _available(target)
    precision, default_precision = _precision(spec, precision)
    stem = source.name if isinstance(source, GraphSpec) else (
        Path(source).stem if Path(source).suffix in (".onnx", ".toml") else source)
    suffix = "" if precision == default_precision else f"-{precision}"
    request = CompileRequest(source=source, target=spec, target_options=dict(target_options or {}),
                             shapes=dict(shapes or {}), precision=precision, exporter=exporter,
                             use_tuning=tuning, pe_tables=pe_tables, dim_relations=_relations(dim_relations),
                             reference_sizes=tuple(reference_sizes))
    with bundle_writer(Path("dist") / f"{stem}-{target}{suffix}" if out is None else out, replace_any=force) as writer:
        inter = Intermediates(writer.dest, force=force) if keep_intermediates else None
        st = CompileState(request, log=log, intermediates=inter)
        try:
            run_stages(st, STAGES)
            bundle = write_compiled_bundle(st, writer)
        finally:
            published = inter.publish() if inter else None
            if published:
                log(f"[intermediates] {published}")
    log(f"[bundle] {bundle.path} ({st.timings['total']:.1f} s)")
    return bundle


def prepare(source: str | GraphSpec, *, target: str = "llvm", target_options: dict | None = None,
            shapes: dict[str, list[int]] | None = None, through: str = "import", host_build: bool = True,
            log: Callable[[str], None] = print) -> CompileState:
    """The stages up to and including `through`, for tools that build differently: tuning
    (through "import"), a vendor's build alone (through "vendor", host_build=False: the
    guide's NPU columns and scripts/npu_rknn_table.py leave out TVM's host build)."""
    default_tvm_threads()
    names = [name for name, _ in STAGES]
    if through not in names:
        raise ValueError(f"unknown stage {through!r}; the stages: {', '.join(names)}")
    st = CompileState(CompileRequest(source=source, target=_available(target),
                                     target_options=dict(target_options or {}), shapes=dict(shapes or {})), log=log)
    stages = STAGES[: names.index(through) + 1]
    run_stages(st, [(n, s) for n, s in stages if host_build or n not in HOST_BUILD_STAGES])
    return st


def _available(target: str) -> TargetSpec:
    spec = load_target(target)
    spec.require_available()
    return spec


def _precision(spec: TargetSpec, precision: str | None) -> tuple[str, str]:
    """(the precision to build, the target's default): what the backend builds."""
    from ..quant import PRECISIONS
    supported = get_backend(spec.backend).precisions
    precision = precision or supported[0]
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; valid: {', '.join(PRECISIONS)}")
    if precision not in supported:
        raise ValueError(f"target {spec.name!r} builds precision {', '.join(supported)}, not {precision!r}; "
                         f"expected one of those (--precision)")
    return precision, supported[0]


def run_stages(st: CompileState, stages) -> None:
    """Run `stages` ((name, function) pairs) in order on `st`, applying what each adds;
    a failure names the stage and the source."""
    source = st.request.source.name if isinstance(st.request.source, GraphSpec) else st.request.source
    start = time.perf_counter()
    for name, stage in stages:
        t = time.perf_counter()
        st.log(f"[{name}] ...")
        try:
            st.apply(stage(st))
        except Exception as err:
            raise_if_interrupted(err)  # Ctrl-C inside TVM's C++ code arrives as a bare RuntimeError
            if isinstance(err, (ValueError, FileNotFoundError, VendorError)):
                raise  # already says which input (or vendor stage) failed and what was expected
            first = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
            shapes = st.request.shapes
            raise CompileError(f"{name} stage failed for {source}: {first}"
                               f"{' (input shapes fixed by --shape: ' + str(shapes) + ')' if shapes else ''}") from err
        st.timings[name] = time.perf_counter() - t
    st.timings["total"] = time.perf_counter() - start


def _relations(given) -> tuple:
    from ..spec.dims import DimRelation
    return tuple(r if isinstance(r, DimRelation) else DimRelation.parse(r) for r in given or ())
