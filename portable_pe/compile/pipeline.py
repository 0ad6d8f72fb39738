"""The compile pipeline, read top to bottom like DESIGN.md's diagram.

    load -> export -> simplify -> legalize -> import -> reference -> vendor -> build -> bundle

Each stage is one function on a shared CompileState; with keep_intermediates each stage
dumps what it produced, so a user can see where a number went wrong.
"""

from __future__ import annotations

import io
import json
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import numpy as np
import onnx

from .. import __version__
from ..bundle.artifact import Bundle, write_bundle
from ..bundle.lock import bundle_lock
from .export import DEFAULT_EXPORTER, export_onnx_cached, get_metadata
from ..spec.graphs import ROOT, GraphSpec, load_graph
from .intermediates import Intermediates
from ..interrupts import raise_if_interrupted
from ..bundle.paths import bundle_destination
from ..spec.schema import NAME
from .frontend import fix_input_shapes
from ..user_files import load_onnx_file
from ..spec.io_names import describe_io, dim_roles
from ..npu.vendor import VendorError
from ..run.parity import DEFAULT_LENGTHS, TOLERANCES, make_inputs, tolerance_for, onnxruntime_runner, torch_reference, usable_lengths
from ..backends.targets import TargetSpec, load_target, target_arch, target_json


#: shipped in every bundle as run_on_board.py: the bundle checks itself on a board
BOARD_RUNNER = Path(__file__).resolve().parent.parent / "bundle" / "run_on_board.py"


class CompileError(RuntimeError):
    """A stage failed; the message names the stage and the source."""


@dataclass
class CompileState:
    source: str
    target: TargetSpec
    intermediates: Intermediates | None
    shapes: dict[str, list[int]]
    target_options: dict
    log: Callable[[str], None]
    spec: GraphSpec | None = None
    name: str = ""
    model: onnx.ModelProto | None = None
    simplify: dict = field(default_factory=dict)
    io: dict = field(default_factory=dict)
    relax: object = None
    tvm_target: object = None
    executable: object = None
    reference: dict[str, np.ndarray] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    pe_tables: str | None = None  # "int8": position tables stored as int8 rows (pe_tables.py)
    target_report: dict = field(default_factory=dict)
    use_tuning: bool = True  # apply targets/tuning/<target>/<graph> when it exists
    exporter: str = DEFAULT_EXPORTER  # torch -> ONNX exporter for specs (export.EXPORTERS)
    tuning: dict = field(default_factory=dict)  # database, digest, specialized entries
    files: dict[str, bytes] = field(default_factory=dict)  # extra bundle files backends made (e.g. rknn/)
    reference_model: onnx.ModelProto | None = None  # foreign ONNX: reference graph if not st.model
    precision: str = "fp32"  # quant.PRECISIONS; "int8": stage_quantize makes a QDQ graph

    def dump(self, filename: str, content: str | bytes) -> None:
        if self.intermediates is not None:
            self.intermediates.dump(filename, content)


def stage_load(st: CompileState) -> None:
    path = Path(st.source)
    if path.suffix == ".onnx":
        st.model = load_onnx_file(path)
        # the name becomes part of paths (tuning databases): a foreign file's metadata must not steer them
        named = get_metadata(st.model).get("graph")
        st.name = named if named and NAME.ok(named) else path.stem
        if st.shapes:
            fix_input_shapes(st.model, st.shapes)
    else:
        st.spec = load_graph(st.source)
        st.name = st.spec.name


def stage_export(st: CompileState) -> None:
    if st.spec is None:
        return
    st.model, cached = export_onnx_cached(st.spec, exporter=st.exporter)
    st.log(f"  export: {st.exporter} exporter"
           f"{', from the cache (same spec, torch and exporter source)' if cached else ''}")
    st.dump("01-exported.onnx", st.model.SerializeToString())


def stage_simplify(st: CompileState) -> None:
    from .simplify import simplify_onnx
    st.io = describe_io(st.model, st.spec)
    lengths = usable_lengths(st.io, (7, 33)) or usable_lengths(st.io, (1,))
    checks = [make_inputs(st.io["inputs"], length=n, batch=2 if st.spec else 1, dim_roles=dim_roles(st.io))
              for n in lengths]
    st.model, report = simplify_onnx(st.model, check_inputs=checks)
    st.simplify = {"nodes_before": report.nodes_before, "nodes_after": report.nodes_after,
                   "ops_after": report.ops_after, "max_abs_diff": report.max_abs_diff}
    st.log(f"  simplify: {report.summary()}")
    st.dump("02-simplified.onnx", st.model.SerializeToString())


def stage_legalize(st: CompileState) -> None:
    """Target rewrites of the ONNX graph (e.g. NPU folding); identity for most targets."""
    from ..backends import get_backend
    if st.pe_tables == "int8":
        from ..quant.tables import quantize_onnx_tables
        st.model, tables = quantize_onnx_tables(st.model)
        st.target_report["pe_tables"] = {"dtype": "int8", "tables": tables}
        st.log(f"  pe-tables int8: {len(tables)} stored table(s) quantized per row"
               f"{'' if tables else ' (this encoding computes its tables at run time)'}")
        if tables:  # the reference keeps fp32 tables: judge float32 outputs by the int8-table row
            st.target = replace(st.target, tolerance={**st.target.tolerance,
                                                      "float32": dict(TOLERANCES["int8_tables"])})
    if st.spec is None:  # foreign graphs: make shape arithmetic something TVM's importer follows
        from ..spec.io_names import apply_dim_bounds
        from ..legalize import dim_bounds, legalize
        st.model = legalize(st.model)
        for said in apply_dim_bounds(st.io, dim_bounds(st.model)):  # the graph runs only up to them
            st.log(f"  legalize: {said}")
    _record(st, get_backend(st.target.backend).legalize_onnx(st.model, st))
    st.dump("03-legalized.onnx", st.model.SerializeToString())


def _record(st: CompileState, made) -> None:
    """What a backend handed back (backends.Legalized / Staged / a model / a report dict):
    the stage list, not the backend, writes it into the state."""
    from ..backends import Legalized
    if isinstance(made, onnx.ModelProto):
        made = Legalized(model=made)
    if isinstance(made, Legalized):
        st.model = made.model
        st.io = made.io or st.io
        st.reference_model = made.reference_model
        if made.tolerance is not None:
            st.target = replace(st.target, tolerance=made.tolerance)
    if isinstance(made, dict):
        st.target_report.update(made)
    elif made is not None:
        st.target_report.update(made.report)
        st.files.update(made.files)


def stage_quantize(st: CompileState) -> None:
    """--precision int8: the constant-weight matmuls quantized (quant/), calibrated on
    seeded inputs; a graph that already has QDQ nodes (an NPU graph) is kept as it is."""
    if st.precision != "int8":
        return
    if any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in st.model.graph.node):
        st.log("  int8: the graph is quantized already (QDQ)")
        return
    from ..quant.calibration import calibration_feeds, calibration_lengths
    from ..quant.qdq import quantize_linears
    lengths = calibration_lengths(st.io)
    feeds = calibration_feeds(st.io, lengths=lengths)
    st.model, report = quantize_linears(st.model, feeds)
    report["calibration_lengths"] = lengths
    report["calibration_shapes"] = [{k: list(v.shape) for k, v in f.items()} for f in feeds]
    st.target_report["quantization"] = report
    st.log(f"  int8: {report['matmuls_int8']} matmul(s) with constant weights quantized, "
           f"{report['matmuls_float']} kept float32; calibrated at T={lengths}")
    # the reference stays float32 PyTorch: judge the float32 outputs by the int8 row
    st.target = replace(st.target, tolerance={**st.target.tolerance, "float32": dict(TOLERANCES["int8_linear"])})
    st.dump("03b-quantized.onnx", st.model.SerializeToString())


def stage_import(st: CompileState) -> None:
    from .frontend import import_onnx
    st.relax = import_onnx(st.model)
    st.dump("04-relax.py", st.relax.script())


def stage_target(st: CompileState) -> None:
    """Resolve the TVM target first: a bad --board/--arch or a missing toolchain fails in
    a second, not after the export."""
    from ..backends import get_backend
    unknown = sorted(set(st.target_options) - set(st.target.options))
    if unknown:
        raise ValueError(f"target {st.target.name!r} takes no option {', '.join(unknown)} "
                         f"(--{', --'.join(u.replace('_', '-') for u in unknown)}); its valid options: "
                         f"{', '.join(st.target.options) or 'none'}")
    st.target_options = {**{k: o["default"] for k, o in st.target.options.items() if "default" in o},
                         **st.target_options}
    st.tvm_target = get_backend(st.target.backend).tvm_target(st.target, **st.target_options)
    st.log(f"  target: {json.dumps(target_json(st.tvm_target))}")


def stage_tuning(st: CompileState) -> None:
    """With a tuning database for this graph and target: one static entry per tuned point."""
    from ..tune.database import database_digest, database_dir_of, specialize, specialized_name, tuned_points
    db_dir = database_dir_of(st)
    points = tuned_points(db_dir)
    if not (st.use_tuning and points and st.io.get("dims")) or st.precision != "fp32":
        why = ("none for " + st.name if not points else "not used (--no-tuning)" if not st.use_tuning
               else f"not used ({st.precision}: its kernels are float32)")
        st.log(f"  tuning database: {why}")
        return
    st.tuning = {"database": (db_dir.relative_to(ROOT) if db_dir.is_relative_to(ROOT) else db_dir).as_posix(), "digest": database_digest(db_dir),
                 "specializations": []}
    for point in points:
        point = {"batch": point["batch"], "seq": point["seq"]}
        if all(info["min"] <= point[info["role"]] <= info["max"] for info in st.io["dims"].values()):
            st.relax = specialize(st.relax, dims=st.io["dims"], point=point)
            st.tuning["specializations"].append({"function": specialized_name(point), **point})


def stage_build(st: CompileState) -> None:
    import tvm
    from ..backends import get_backend
    backend = get_backend(st.target.backend)
    pipeline = backend.relax_pipeline(st.tvm_target)
    if st.tuning.get("specializations"):
        from ..tune.database import as_main, coverage, open_database
        database = open_database(ROOT / st.tuning["database"])
        for entry in st.tuning["specializations"]:
            hits, misses = coverage(as_main(st.relax, entry["function"]), st.tvm_target, database,
                                    backend=st.target.backend)
            entry.update(tuned_kernels=len(hits), untuned_kernels=len(misses))
            st.log(f"  {entry['function']}: {len(hits)} tuned kernel(s), {len(misses)} miss(es) "
                   f"{'(default schedules for: ' + ', '.join(misses[:4]) + ('...' if len(misses) > 4 else '') + ')' if misses else ''}")
        with database:
            st.executable = tvm.compile(st.relax, target=st.tvm_target, relax_pipeline=pipeline)
    else:
        st.executable = tvm.compile(st.relax, target=st.tvm_target, relax_pipeline=pipeline)


def stage_reference(st: CompileState) -> None:
    lengths = usable_lengths(st.io, DEFAULT_LENGTHS)
    if st.spec is not None:
        run = torch_reference(st.spec.to_dict())
    else:
        with tempfile.NamedTemporaryFile(suffix=".onnx") as f:
            onnx.save(st.reference_model or st.model, f.name)
            run = onnxruntime_runner(f.name, [o["name"] for o in st.io["outputs"]])
    for n in lengths:
        inputs = make_inputs(st.io["inputs"], length=n, dim_roles=dim_roles(st.io))
        for k, v in {**{f"in/{k}": v for k, v in inputs.items()},
                     **{f"out/{k}": v for k, v in run(inputs).items()}}.items():
            st.reference[f"T{n}/{k}"] = v


def stage_vendor(st: CompileState) -> None:
    """A vendor compiler's build of the legalized graph, where the target has one (npu:
    RKNN-Toolkit2 for the rknpu2 profile), with its placement and simulator run."""
    from ..backends import get_backend
    vendor_build = getattr(get_backend(st.target.backend), "vendor_build", None)
    if vendor_build is not None:
        _record(st, vendor_build(st))


def stage_finalize(st: CompileState) -> None:
    """Backend checks that need the build and the reference (e.g. the NPU's TVM accuracy)."""
    from ..backends import get_backend
    finalize = getattr(get_backend(st.target.backend), "finalize", None)
    if finalize is not None:
        _record(st, finalize(st))


def stage_bundle(st: CompileState, dest: Path, *, replace_any: bool = False) -> Bundle:
    import torch
    import tvm
    from ..backends import get_backend
    with tempfile.TemporaryDirectory() as tmp:
        so = st.files.get("model.so") or Path(tmp) / "model.so"  # a backend may have exported it already
        if not isinstance(so, bytes):
            get_backend(st.target.backend).export_library(st.executable, so, target_options=st.target_options)
        buf = io.BytesIO()
        np.savez(buf, **st.reference)
        manifest = {
            "graph": {"name": st.name, "source": "spec" if st.spec else "onnx",
                      "spec": st.spec.to_dict() if st.spec else None},
            "encoding": st.spec.encoding if st.spec else get_metadata(st.model).get("encoding", "unknown"),
            "target": {"name": st.target.name, "device": st.target.device, "options": st.target_options,
                       "tvm": target_json(st.tvm_target), "host_arch": target_arch(st.tvm_target)},
            **st.io,
            "reference": {"source": "torch" if st.spec else "onnxruntime",
                          **({"model": "reference.onnx"} if st.reference_model is not None else {}),
                          "lengths": sorted({int(k.split('/')[0][1:]) for k in st.reference})},
            # resolved per output dtype, so the bundle's runner can check itself without us
            "tolerance": {o["dtype"]: tolerance_for(o["dtype"], st.target.tolerance) for o in st.io["outputs"]},
            "simplify": st.simplify,
            "versions": {"portable_pe": __version__, "torch": torch.__version__.split("+")[0],
                         "onnx": onnx.__version__, "tvm": tvm.__version__},
            "precision": st.precision,
            "tuning": st.tuning or {"database": None},
            "timings_s": {k: round(v, 3) for k, v in st.timings.items()},
            **st.target_report,
        }
        extra = {**st.files, **({"reference.onnx": st.reference_model.SerializeToString()}
                                if st.reference_model is not None else {})}
        return write_bundle(dest, {**extra, "model.so": so, "model.onnx": st.model.SerializeToString(),
                                   "reference.npz": buf.getvalue(), "run_on_board.py": BOARD_RUNNER},
                            json.loads(json.dumps(manifest, default=list)), replace_any=replace_any)


# the vendor stage (a vendor NPU compiler, when the target has one) comes before TVM's
# build, so a vendor failure is reported before minutes of host compilation
STAGES = [("target", stage_target), ("load", stage_load), ("export", stage_export), ("simplify", stage_simplify),
          ("legalize", stage_legalize), ("quantize", stage_quantize), ("import", stage_import), ("tuning", stage_tuning),
          ("reference", stage_reference), ("vendor", stage_vendor), ("build", stage_build), ("finalize", stage_finalize)]


def compile_graph(source: str, *, target: str = "llvm", out: str | Path | None = None,
                  keep_intermediates: bool = False, shapes: dict[str, list[int]] | None = None,
                  target_options: dict | None = None, pe_tables: str | None = None, tuning: bool = True, exporter: str = DEFAULT_EXPORTER,
                  precision: str | None = None, force: bool = False, log: Callable[[str], None] = print) -> Bundle:
    """Compile a shipped graph name, a TOML spec or an .onnx file into a verified bundle.

    `target_options` go to the backend's tvm_target() (e.g. board= for arm, arch= for cuda).
    `tuning=False` ignores the graph's tuning database (the "TVM untuned" build).
    `exporter` exports specs to ONNX (export.EXPORTERS); .onnx sources ignore it.
    Nothing is written to `out` unless every stage succeeds. `out` may be an existing
    bundle or a new path; `force` lets it replace anything else (out_paths).
    `precision` (quant.PRECISIONS, default: the target's first) "int8" quantizes the
    constant-weight matmuls (default bundle folder dist/<graph>-<target>-int8).
    """
    spec = load_target(target)
    spec.require_available()
    precision, default_precision = _precision(spec, precision)
    stem = Path(source).stem if Path(source).suffix in (".onnx", ".toml") else source
    suffix = "" if precision == default_precision else f"-{precision}"
    dest = bundle_destination(Path("dist") / f"{stem}-{target}{suffix}" if out is None else out, force=force)
    inter = Intermediates(dest, force=force) if keep_intermediates else None
    st = CompileState(source=str(source), target=spec, intermediates=inter, shapes=shapes or {},
                      target_options=target_options or {}, log=log, pe_tables=pe_tables, use_tuning=tuning,
                      exporter=exporter, precision=precision)
    with bundle_lock(dest):
        try:
            _run_stages(st, STAGES)
            bundle = stage_bundle(st, dest, replace_any=force)
        finally:
            published = inter.publish() if inter else None
            if published:
                log(f"[intermediates] {published}")
    log(f"[bundle] {bundle.path} ({st.timings['total']:.1f} s)")
    return bundle


def _precision(spec: TargetSpec, precision: str | None) -> tuple[str, str]:
    """(the precision to build, the target's default): what the backend builds
    (backends/*.py PRECISIONS, default float32 only)."""
    from ..backends import get_backend
    from ..quant import PRECISIONS
    supported = tuple(getattr(get_backend(spec.backend), "PRECISIONS", ("fp32",)))
    precision = precision or supported[0]
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; valid: {', '.join(PRECISIONS)}")
    if precision not in supported:
        raise ValueError(f"target {spec.name!r} builds precision {', '.join(supported)}, not {precision!r}")
    return precision, supported[0]


def prepare(source: str, *, target: str = "llvm", target_options: dict | None = None,
            shapes: dict[str, list[int]] | None = None, log: Callable[[str], None] = print) -> CompileState:
    """The stages up to the Relax import, for tools that build differently (tuning, the
    RKNN table script)."""
    spec = load_target(target)
    spec.require_available()
    st = CompileState(source=str(source), target=spec, intermediates=None, shapes=shapes or {},
                      target_options=target_options or {}, log=log)
    last = [name for name, _ in STAGES].index("import")
    _run_stages(st, STAGES[: last + 1])
    return st


def _run_stages(st: CompileState, stages) -> None:
    source = st.source
    start = time.perf_counter()
    for name, stage in stages:
        t = time.perf_counter()
        st.log(f"[{name}] ...")
        try:
            stage(st)
        except Exception as err:
            raise_if_interrupted(err)  # Ctrl-C inside TVM's C++ code arrives as a bare RuntimeError
            if isinstance(err, (ValueError, FileNotFoundError, VendorError)):
                raise  # already says which input (or vendor stage) failed and what was expected
            first = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
            raise CompileError(f"{name} stage failed for {source}: {first}"
                               f"{' (input shapes fixed by --shape: ' + str(st.shapes) + ')' if st.shapes else ''}") from err
        st.timings[name] = time.perf_counter() - t
    st.timings["total"] = time.perf_counter() - start

