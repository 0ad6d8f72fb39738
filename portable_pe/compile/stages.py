"""The compile stages, in the order pipeline.STAGES runs them. Each reads the state and
returns what it adds (state.Added); none writes to the state."""

from __future__ import annotations

import copy
import json
import tempfile
from dataclasses import replace
from pathlib import Path

import onnx

from ..backends import get_backend
from ..backends.targets import TargetSpec, target_json
from ..bundle.reference import ReferenceCase
from ..run.parity import (DEFAULT_LENGTHS, check_request, default_sizes, make_inputs, onnxruntime_runner,
                          parse_sizes, pixel_roles, size_label, torch_reference, usable_lengths)
from ..spec.graphs import ROOT, GraphSpec, load_graph
from ..spec.io_names import describe_io, dim_roles
from ..spec.schema import NAME
from ..user_files import load_onnx_file
from .export import export_onnx_cached, get_metadata
from .frontend import fix_input_shapes, name_dim_expressions, tie_input_dims
from .state import Added, CompileState


def resolve_target(target: TargetSpec, options: dict):
    """(options with the target's defaults merged in, the TVM target): a bad --board/--arch
    or a missing toolchain fails here, in a second, not after the export."""
    unknown = sorted(set(options) - set(target.options))
    if unknown:
        raise ValueError(f"target {target.name!r} takes no option {', '.join(unknown)} "
                         f"(--{', --'.join(u.replace('_', '-') for u in unknown)}); its valid options: "
                         f"{', '.join(target.options) or 'none'}")
    for name, value in options.items():
        _check_option(target, name, value)
    options = {**{k: o["default"] for k, o in target.options.items() if "default" in o}, **options}
    return options, get_backend(target.backend).tvm_target(target, **options)


def _check_option(target: TargetSpec, name: str, value) -> None:
    """A value against its declaration (the command line checks the same with argparse)."""
    option, flag = target.options[name], "--" + name.replace("_", "-")
    if "choices" in option and value not in option["choices"]:
        raise ValueError(f"unknown {name.replace('_', ' ')} {value!r} for target {target.name!r} ({flag}); "
                         f"valid: {', '.join(option['choices'])}")
    if option.get("type") == "int":
        lo, hi = option.get("range", (1, None))
        if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
            raise ValueError(f"{flag} must be an integer in {lo}..{hi}, got {value!r}")
    if option.get("type") == "size" and not (isinstance(value, (list, tuple)) and len(value) in (2, 3) and all(
            isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)):
        raise ValueError(f"{flag} must be an image size in pixels, [H, W] (video [F, H, W]) positive integers, "
                         f"got {value!r}")


def stage_target(st: CompileState) -> Added:
    options, tvm_target = resolve_target(st.target, st.request.target_options)
    # a precision the target's CPU lacks the instructions for fails here, before the export
    tvm_target = get_backend(st.target.backend).for_precision(tvm_target, st.target, st.request.precision)
    st.log(f"  target: {json.dumps(target_json(tvm_target))}")
    return Added(target_options=options, tvm_target=tvm_target)


def stage_load(st: CompileState) -> Added:
    source = st.request.source
    if isinstance(source, GraphSpec):
        return Added(spec=source, name=source.name)
    path = Path(source)
    if path.suffix != ".onnx":
        spec = load_graph(source)
        return Added(spec=spec, name=spec.name)
    model = load_onnx_file(path)
    for old, new in name_dim_expressions(model).items():
        st.log(f"  input dim {old!r} is named {new!r} here (an identifier, as TVM's import needs)")
    # the name becomes part of paths (tuning databases): a foreign file's metadata must not steer them
    named = get_metadata(model).get("graph")
    if st.request.shapes:
        fix_input_shapes(model, st.request.shapes)
    return Added(model=model, name=named if named and NAME.ok(named) else path.stem)


def stage_export(st: CompileState) -> Added | None:
    if st.spec is None:
        return None
    model, cached = export_onnx_cached(st.spec, exporter=st.request.exporter)
    st.log(f"  export: {st.request.exporter} exporter"
           f"{', from the cache (same spec, torch and exporter source)' if cached else ''}")
    st.dump("01-exported.onnx", model.SerializeToString())
    return Added(model=model)


def stage_simplify(st: CompileState) -> Added:
    from .bf16_mul import widen_bf16_mul
    from .relation_probe import learn_relations
    from .simplify import simplify_onnx
    from .size_probe import probe_pixel_sizes, refuse_if_unrunnable
    from ..legalize import inline_decided_ifs
    model, _ = widen_bf16_mul(st.model)  # before anything runs it: onnxruntime has no bf16 Mul
    model, inlined = inline_decided_ifs(model)  # before onnxsim, whose folding fails on them
    if inlined:
        st.log(f"  {inlined} If node(s) decided by the graph's dims: replaced by the branch taken")
    io = describe_io(model, st.spec)
    if st.spec is None:  # a foreign export's dims, tried before they are trusted: how they are
        io = learn_relations(model, io, stated=st.request.dim_relations, log=st.log)  # tied,
        io = probe_pixel_sizes(model, io, log=st.log)  # and the image sizes it runs at
    batch = 2 if st.spec else 1
    if pixel_roles(io):  # image sizes in whole patches, not sequence lengths
        checks = [make_inputs(io["inputs"], sizes=s, batch=batch, dim_roles=dim_roles(io)) for s in default_sizes(io)[:2]]
    else:
        lengths = usable_lengths(io, (7, 33)) or usable_lengths(io, (1,))
        checks = [make_inputs(io["inputs"], length=n, batch=batch, dim_roles=dim_roles(io),
                              relations=io.get("dim_relations")) for n in lengths]
        if st.spec is None:  # a foreign export whose dims are symbolic but fixed (Whisper's encoder)
            refuse_if_unrunnable(model, io, checks)
    model, report = simplify_onnx(model, check_inputs=checks)
    st.log(f"  simplify: {report.summary()}")
    st.dump("02-simplified.onnx", model.SerializeToString())
    return Added(model=model, io=io, report={"simplify": {
        "nodes_before": report.nodes_before, "nodes_after": report.nodes_after,
        "ops_after": report.ops_after, "max_abs_diff": report.max_abs_diff}})


def stage_tables(st: CompileState) -> Added | None:
    """--pe-tables int8: stored position tables quantized per row (quant/tables.py)."""
    if st.request.pe_tables != "int8":
        return None
    from ..quant.tables import quantize_onnx_tables
    model, tables = quantize_onnx_tables(st.model)
    st.log(f"  pe-tables int8: {len(tables)} stored table(s) quantized per row"
           f"{'' if tables else ' (this encoding computes its tables at run time)'}")
    return Added(model=model, report={"pe_tables": {"dtype": "int8", "tables": tables}})


def stage_legalize(st: CompileState) -> Added:
    """Foreign graphs: shape arithmetic made something TVM's importer follows; then the
    target's rewrites of the ONNX graph (e.g. NPU folding; none for most targets)."""
    model, io = st.model, st.io
    if st.spec is None or st.spec.vision is not None:  # a vision graph's pixel dims: through its patch stem
        from ..legalize import dim_bounds, legalize
        from ..spec.dims import apply_dim_bounds, relations_of
        multiples = {d: (info["multiple"], info.get("patch", info["multiple"])) for d, info in io["dims"].items()
                     if info.get("multiple", 1) > 1}
        model = copy.deepcopy(model)
        tie_input_dims(model, relations_of(io))
        # a foreign export's own shape arithmetic (Swin's -1 reshapes) needs the image restated
        # in whole multiples; our graphs' dim programs are all legalize's (and the restated image
        # made the tiny Swin's LLVM build take 10 minutes instead of 24 s)
        model = legalize(model, multiples=multiples, pin_multiples=st.spec is None)
        io = json.loads(json.dumps(io))  # a copy: the bounds narrow it
        for said in apply_dim_bounds(io, dim_bounds(model)):  # the graph runs only up to them
            st.log(f"  legalize: {said}")
    backend = get_backend(st.target.backend)
    done = backend.legalize_onnx(model, _with(st, model=model, io=io))
    model = done.model or model
    st.dump("03-legalized.onnx", model.SerializeToString())
    return replace(done, model=model, io=done.io or io)


def _with(st: CompileState, **products) -> CompileState:
    """A copy of the state with some products replaced: what a backend hook called inside
    a stage reads, before the stage's own result is applied."""
    return replace(st, **products)


def stage_quantize(st: CompileState) -> Added | None:
    """--precision int8: the constant-weight matmuls quantized (quant/), calibrated on
    seeded inputs; a graph that already has QDQ nodes (an NPU graph) is kept as it is."""
    if st.request.precision != "int8":
        return None
    if any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in st.model.graph.node):
        st.log("  int8: the graph is quantized already (QDQ)")
        return None
    from ..quant.calibration import calibration_feeds, calibration_lengths, calibration_sizes
    from ..quant.qdq import quantize_linears
    from ..cpu_schedule.int8_isa import reduces_weight_range
    sizes = calibration_sizes(st.io)  # a vision graph calibrates at image sizes, not lengths
    lengths = [] if sizes else calibration_lengths(st.io)
    feeds = calibration_feeds(st.io, lengths=lengths, sizes=sizes)
    # x86 without VNNI: the exact int8 kernel there takes 7-bit weights (int8_isa)
    reduce_range = reduces_weight_range(st.tvm_target)
    model, report = quantize_linears(st.model, feeds, reduce_range=reduce_range)
    if sizes:
        report["calibration_sizes"] = [size_label(s) for s in sizes]
    else:
        report["calibration_lengths"] = lengths
    report["calibration_shapes"] = [{k: list(v.shape) for k, v in f.items()} for f in feeds]
    st.log(f"  int8: {report['matmuls_int8']} matmul(s) with constant weights quantized, "
           f"{report['matmuls_float']} kept float32; calibrated at "
           + (', '.join(report['calibration_sizes']) if sizes else f"T={lengths}"))
    if reduce_range:
        st.log("  int8: weights quantized to 7 bits (+-64, onnxruntime's reduce_range): this CPU has no VNNI, "
               "and its exact int8 kernel (vpmaddubsw) takes them")
    st.dump("03b-quantized.onnx", model.SerializeToString())
    return Added(model=model, report={"quantization": report})


def stage_import(st: CompileState) -> Added:
    from .frontend import import_onnx
    relax = import_onnx(st.model)
    st.dump("04-relax.py", relax.script())
    return Added(relax=relax)


def stage_tuning(st: CompileState) -> Added | None:
    """With a tuning database for this graph and target: one static entry per tuned point,
    except the points whose recheck found the dynamic main as fast (tune/judge.py)."""
    from ..tune.database import database_digest, database_dir_of, specialize, specialized_name, tuned_points
    from ..tune.judge import adds_entry, entry_verdict
    db_dir = database_dir_of(st)
    points = tuned_points(db_dir)
    if not (st.request.use_tuning and points and st.io.get("dims")) or st.request.precision != "fp32":
        why = ("none for " + st.name if not points else "not used (--no-tuning)" if not st.request.use_tuning
               else f"not used ({st.request.precision}: its kernels are float32)")
        st.log(f"  tuning database: {why}")
        return None
    tuning = {"database": (db_dir.relative_to(ROOT) if db_dir.is_relative_to(ROOT) else db_dir).as_posix(),
              "digest": database_digest(db_dir), "specializations": []}
    relax = st.relax
    for saved in points:
        point = {"batch": saved["batch"], "seq": saved["seq"]}
        if not all(info["min"] <= point[info["role"]] <= info["max"] for info in st.io["dims"].values()):
            continue
        if not adds_entry(saved):
            # the recheck ran this entry against main on this target: main was as fast
            verdict = entry_verdict(saved)
            st.log(f"  {specialized_name(point)} left out: the dynamic main ran batch={point['batch']} "
                   f"seq={point['seq']} in {verdict['main_ms']:.3f} ms, the tuned entry in "
                   f"{verdict['tuned_ms']:.3f} ms (tune --recheck)")
            tuning.setdefault("left_out", []).append({**point, **verdict})
            continue
        relax = specialize(relax, dims=st.io["dims"], point=point)
        tuning["specializations"].append({"function": specialized_name(point), **point})
    return Added(relax=relax, tuning=tuning)


def _reference_sizes(st: CompileState) -> list[dict[str, int]]:
    """A vision graph's reference image sizes: the request's (--sizes), checked against the
    graph's bounds, else default_sizes. The bundle's run_on_board.py checks at these."""
    if not st.request.reference_sizes:
        return default_sizes(st.io)
    sizes = [parse_sizes(text, pixel_roles(st.io)) for text in st.request.reference_sizes]
    check_request(st.io, lengths=(), sizes=sizes)
    return sizes


def stage_reference(st: CompileState) -> Added:
    """Seeded inputs at the default parity lengths the graph takes (a vision graph: at the
    requested sizes), and the reference's outputs on them: PyTorch for a spec, onnxruntime
    on the graph for a foreign file."""
    if st.request.reference_sizes and not pixel_roles(st.io):
        parse_sizes(st.request.reference_sizes[0], [])  # refused, naming --sizes: a graph without image dims
    if st.spec is not None:
        run = torch_reference(st.spec.to_dict())
    else:
        with tempfile.NamedTemporaryFile(suffix=".onnx") as f:
            onnx.save(st.reference_model or st.model, f.name)
            run = onnxruntime_runner(f.name, [o["name"] for o in st.io["outputs"]])
    cases = []
    if pixel_roles(st.io):
        for sizes in _reference_sizes(st):
            inputs = make_inputs(st.io["inputs"], sizes=sizes, dim_roles=dim_roles(st.io))
            cases.append(ReferenceCase(None, inputs, run(inputs), sizes=sizes))
        st.log(f"  reference at {', '.join(size_label(c.sizes) for c in cases)}")
        return Added(reference=tuple(cases))
    for n in usable_lengths(st.io, DEFAULT_LENGTHS):
        inputs = make_inputs(st.io["inputs"], length=n, dim_roles=dim_roles(st.io), relations=st.io.get("dim_relations"))
        cases.append(ReferenceCase(n, inputs, run(inputs)))
    return Added(reference=tuple(cases))


def stage_vendor(st: CompileState) -> Added:
    """A vendor compiler's build of the legalized graph, where the target has one (npu with
    a vendor profile: RKNN-Toolkit2 and its simulator, or Vela), with its placement."""
    return get_backend(st.target.backend).vendor_build(st)


def stage_build(st: CompileState) -> Added:
    backend = get_backend(st.target.backend)
    pipeline = backend.relax_pipeline(st.tvm_target, precision=st.request.precision)
    report = (_bf16_report(st) if st.request.precision == "bf16" else
              _int8_kernels_report(st) if st.request.precision == "int8" else {})
    if not st.tuning.get("specializations"):
        executable = backend.build(st.relax, st.tvm_target, pipeline)
        return Added(executable=executable, report={**report, **_pipeline_report(st, pipeline)})
    from ..tune.database import as_main, coverage, open_database
    database = open_database(ROOT / st.tuning["database"])
    entries = []
    for entry in st.tuning["specializations"]:
        hits, misses = coverage(as_main(st.relax, entry["function"]), st.tvm_target, database, backend=backend)
        entries.append({**entry, "tuned_kernels": len(hits), "untuned_kernels": len(misses)})
        st.log(f"  {entry['function']}: {len(hits)} tuned kernel(s), {len(misses)} miss(es) "
               f"{'(default schedules for: ' + ', '.join(misses[:4]) + ('...' if len(misses) > 4 else '') + ')' if misses else ''}")
    with database:
        executable = backend.build(st.relax, st.tvm_target, pipeline)
    return Added(executable=executable, tuning={**st.tuning, "specializations": entries},
                 report={**report, **_pipeline_report(st, pipeline)})


def _pipeline_report(st: CompileState, pipeline) -> dict:
    """Manifest sections a backend's pipeline wrote about the build it ran, where its pass
    has a report() (cuda: the kernels dlight's preferred rules could not schedule; llvm:
    kernels left unscheduled and rewrites that failed, which the log warns about)."""
    from ..cpu_schedule.failures import warning_line
    report = getattr(pipeline, "report", None)
    report = report() if callable(report) else {}
    if "cpu_schedules" in report:
        st.log(f"  {warning_line(report['cpu_schedules'])}")
    return report


def _bf16_report(st: CompileState) -> dict:
    """The manifest's "bf16" section: the kernel, and which matmuls run in bf16."""
    from ..cpu_schedule.bf16_plan import bf16_plan
    plan = bf16_plan(st.relax, st.tvm_target)
    st.log(f"  bf16: {plan['matmuls_bf16']} matmul(s) with constant weights in bf16 ({plan['kernel']}), "
           f"{plan['matmuls_float32']} kept float32 (shape); attention: {plan['attentions_bf16']} "
           f"in bf16, {plan['attentions_float32']} in float32")
    return {"bf16": plan}


def _int8_kernels_report(st: CompileState) -> dict:
    """An int8 llvm build's AMX kernels, for the run-time check of the CPU's instructions:
    the "int8" section names AMX-INT8 where its matmuls run on the tiles, the "bf16" one
    its attention where that runs on AMX-BF16 (bf16_plan)."""
    from ..cpu_schedule.bf16_isa import bf16_kernel
    from ..cpu_schedule.bf16_plan import attention_plan, int8_attention_plan
    from ..cpu_schedule.int8_attention import INT8_MIN_KEYS, runs_on as int8_scores_run_on
    from ..cpu_schedule.int8_isa import has_amx_int8, int8_isas
    if st.tvm_target.kind.name != "llvm":
        return {}
    isas = int8_isas(st.tvm_target)
    dot = isas[0].name
    amx_int8 = has_amx_int8(st.tvm_target)
    report = {"int8": {"kernel": "amx-int8" if amx_int8 else dot}}
    if len(isas) > 1:  # avx2-u8s7: weights quantized elsewhere, beyond +-64, take the next
        report["int8"]["else"] = isas[1].name
        dot += f" (weights within +-{isas[0].w_max}), else {isas[1].name}"
    st.log("  int8 matmuls: " + (f"amx-int8 where K % 64 == 0 and N % 32 == 0, else {dot}" if amx_int8 else dot))
    if int8_scores_run_on(st.tvm_target):  # the fusion's own test: no fusion run to count nothing
        plan = int8_attention_plan(st.relax, st.tvm_target)
        if plan["attentions_int8_scores"]:
            total = plan["attentions_int8_scores"] + plan["attentions_float32"]
            st.log(f"  attention: Q.K^T in int8 in {plan['attentions_int8_scores']} of {total} from "
                   f"{INT8_MIN_KEYS} keys on (dynamic per-row scales; softmax and P.V in float32)")
            report["int8"].update(plan)
    if bf16_kernel(st.tvm_target) == "amx-bf16":
        plan = attention_plan(st.relax, st.tvm_target)
        if plan["attentions_bf16"]:
            st.log(f"  attention: {plan['attentions_bf16']} in bf16 on AMX tiles, {plan['attentions_float32']} in float32")
            report["bf16"] = plan
    return report


def stage_finalize(st: CompileState) -> Added:
    """Backend checks that need the build and the reference (e.g. the NPU's TVM accuracy)."""
    return get_backend(st.target.backend).finalize(st)
