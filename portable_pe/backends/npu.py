"""NPU-style targets: the bundle's model.onnx is the NPU-ready graph (static (1, N),
position encodings folded to constants, ops rewritten for the profile; QDQ int8, or the
float graph with --npu-dtype fp16), and model.so is a TVM build of that same graph for
the host CPU (llvm, or arm with --host arm).

legalize_onnx does the NPU work; it fails with a per-node report when the profile still
refuses nodes after rewriting and the profile's check decides. A profile with a `vendor`
(npu/vendors.py: rknpu2 -> RKNN-Toolkit2, ethos-u85/u55 -> Vela) has that vendor's
compiler build it in vendor_build: placement and accuracy then come from the vendor's
build log and simulator. A vendor that runs what its NPU lacks on the CPU makes a refused
node not an error but the profile's prediction, which the vendor's placement is checked
against.

Like every backend, this one reads the CompileState and returns what it made (Added);
the stage list records it.
"""

from __future__ import annotations


from . import arm, llvm
from .backend import Backend
from ..compile.state import Added
from ..npu.accuracy import accuracy
from ..npu.profiles import resolve_profile

#: the host CPU builds targets/npu.toml's --host chooses from
HOSTS = {"llvm": llvm.BACKEND, "arm": arm.BACKEND}


def _host(options: dict):
    """The backend and target spec of the host CPU build (options["host"]: targets/npu.toml)."""
    from .targets import load_target
    host = options["host"]
    return HOSTS[host], load_target(host)


def tvm_target(spec, *, host, **_options):
    backend, host_spec = _host({"host": host})
    # the llvm host keeps the npu target's own [tvm] table (mcpu = host); arm builds for its board
    return backend.tvm_target(spec if host == "llvm" else host_spec)


def relax_pipeline(target, precision: str = "fp32"):
    # the host CPU pipeline (arm's is llvm's): its int8 lowering (cpu_schedule.quant_matmul)
    # runs the QDQ matmuls as integer kernels instead of float matmuls on dequantized copies
    return llvm.BACKEND.relax_pipeline(target, precision=precision)


def export_library(executable, path, *, target_options: dict | None = None) -> None:
    # an arm host's model.so must be linked by the cross compiler: the host backend knows how
    _host(target_options)[0].export_library(executable, path)


def legalize_onnx(model, state) -> Added:
    from ..npu.fold import fold_positions
    from ..npu.profiles import check_model, coverage, format_blockers
    from ..npu.quantize import quantize_int8
    from ..npu.rewrite import rewrite_for_profile
    from ..npu.vendors import vendor_hooks
    from ..spec.io_names import describe_io
    profile, dtype, soc = resolve_profile(state.target_options)
    model = _pinned_image(model, state, batch=profile.batch)
    image = _static_image(model)
    seq_len = int(state.target_options["seq_len"])
    if state.spec is not None and state.spec.vision is None:
        profile.check_seq_len(seq_len)
        if state.spec.max_length < seq_len:
            raise ValueError(f"--seq-len {seq_len} exceeds graph {state.name!r}'s max length {state.spec.max_length}")
    folded, fold_report = fold_positions(model, seq_len=seq_len, batch=profile.batch)  # an image's dims are fixed already
    if image:  # pinned, the image's patch positions folded like a sequence's
        fold_report["seq_len"] = None
    sized_by = "--image-size" if state.spec is not None else "--shape; --seq-len does not apply"
    state.log(f"  npu: {'image ' + image['input'] + ' ' + 'x'.join(map(str, image['shape'])) + f' ({sized_by})' if image else f'fixed (1, {seq_len})'}; "
              f"folded {fold_report['folded_inputs']}; {fold_report['nodes_before']} -> {fold_report['nodes_after']} nodes")
    before = [v for v in check_model(folded, profile) if not v.allowed]
    rewritten, rewrite_report = rewrite_for_profile(folded, profile)
    after = [v for v in check_model(rewritten, profile) if not v.allowed]
    state.log(f"  npu: profile {profile.name}{' (' + soc + ')' if soc else ''}: {len(before)} disallowed node(s) "
              f"before rewriting, {len(after)} after ({rewrite_report['rewritten']})")
    decides, graph = _precheck_decides(state, profile)
    if after and decides:
        raise ValueError(format_blockers(check_model(rewritten, profile), profile, graph=graph))
    if after:  # the vendor's build decides: the check of this graph is a prediction, checked later
        state.log(f"  npu: {len(after)} node(s) of the host ONNX graph the profile refuses (a prediction, "
                  f"not decisive: {profile.vendor}'s compiler places the ops): "
                  + ", ".join(f"{v.node} [{v.op}]" for v in after[:8]) + (" ..." if len(after) > 8 else ""))
    host_graph = quantize_int8(rewritten, profile) if dtype == "int8" else rewritten
    verdicts = check_model(host_graph, profile, quantized=dtype == "int8")
    if any(not v.allowed for v in verdicts) and decides:
        raise ValueError(f"after {dtype} quantization: " + format_blockers(verdicts, profile, graph=graph))
    cov = coverage(verdicts)
    state.log(f"  npu: profile check: {cov['nodes_npu']}/{cov['nodes_total']} nodes, "
              f"{cov['macs_npu'] / 1e6:.1f}/{cov['macs_total'] / 1e6:.1f} MMACs on the NPU")
    io = describe_io(host_graph, None)  # static (1, N): the reference runs at N only
    if image is None and io.get("static_length") != seq_len:
        raise ValueError(f"--seq-len {seq_len}, but the graph's input is fixed to length {io.get('static_length')} "
                         f"(by --shape or by the graph itself); pass --seq-len {io.get('static_length')}")
    files, vendor_opset, graphs = {}, None, {"onnxruntime_fp32_rewritten": rewritten}
    if dtype == "int8":
        graphs["onnxruntime_int8"] = host_graph
    hooks = vendor_hooks(profile.vendor) if profile.vendor else None
    if hooks is not None and hooks.vendor_graph is not None:  # a vendor that takes ONNX: the graph it gets
        vendor_model = hooks.vendor_graph(rewritten)
        files[hooks.prefix + "model.onnx"] = vendor_model.SerializeToString()
        vendor_opset = next(o.version for o in vendor_model.opset_import if o.domain in ("", "ai.onnx"))
        graphs["onnxruntime_vendor_graph"] = vendor_model
    report = {"profile": profile.name, "profile_source": profile.source, "seq_len": None if image else seq_len,
              "image": image, "reference_length": io.get("static_length") if image else seq_len, "dtype": dtype,
              "soc": soc, "vendor": profile.vendor, "vendor_opset": vendor_opset,
              "fold": fold_report, "rewrite": rewrite_report,
              "disallowed_before_rewrite": len(before), "disallowed_after_rewrite": len(after),
              "expected_on_cpu": [f"{v.node} [{v.op}]: {'; '.join(v.why)}" for v in after],
              "coverage": {"source": f"profile {profile.name}", **cov},
              "accuracy": _onnxruntime_accuracy(state, io, seq_len, graphs),
              "size_bytes": {"fp32": len(rewritten.SerializeToString()), dtype: len(host_graph.SerializeToString())}}
    return Added(model=host_graph, io=io, report={"npu": report}, files=files,
                 reference_model=folded if state.spec is None else None)


def _precheck_decides(state, profile) -> tuple[bool, str]:
    """(whether the profile's check of the host ONNX graph stops the compile, a description
    of that graph for the refusal). Without a vendor the graph is the NPU graph itself; with
    one that builds, the vendor decides; with one that will not build, the vendor record says."""
    from ..npu.toolchain import why_no_build
    from ..npu.vendors import get_vendor, vendor_hooks
    if profile.vendor is None:
        return True, "the NPU graph (model.onnx)"
    vendor = get_vendor(profile.vendor)
    why = why_no_build(state.target_options["vendor_build"], vendor.name,
                       blocker=vendor_hooks(vendor.name).blocker(state))
    graph = (f"the host ONNX graph (model.onnx, what model.so runs; the {vendor.name} compiler, which judges the "
             f"graph it is handed, is not run: {why})")
    return vendor.precheck_decides_without_build and why is not None, graph


def _pinned_image(model, state, *, batch: int):
    """Our own vision graph with its pixel input fixed to --image-size (default the spec's
    export.example_size); other graphs as they are, once the options are checked: --image-size
    is a vision spec's, and a vision spec is sized by it, not by --seq-len."""
    from ..npu.image_size import image_size, pin_image
    given = state.request.target_options
    vision = state.spec is not None and state.spec.vision is not None
    if vision and "seq_len" in given:
        raise ValueError(f"--seq-len: graph {state.name!r} is a vision graph, whose NPU graph is fixed by its image "
                         f"size: give --image-size {'x'.join(map(str, state.spec.example_size))} (pixels) instead")
    if not vision and "image_size" in given:
        raise ValueError("--image-size is the static size of portable-pe's own vision graphs (a spec with [vision]); "
                         + ("pin a foreign .onnx file's image input with --shape NAME=1x3xHxW" if state.spec is None
                            else f"graph {state.name!r} takes token sequences: give --seq-len N"))
    if not vision:
        return model
    size = image_size(state.spec, given.get("image_size"))
    return pin_image(model, size=size, batch=batch)


def _static_image(model) -> dict | None:
    """{"input", "shape"} of the graph's image input (a float input that reaches a Conv),
    whose dims must be fixed (--shape) for an NPU; None for a token-sequence graph."""
    from ..spec.pixel_inputs import image_inputs
    for name in image_inputs(model):
        dims = next(vi.type.tensor_type.shape.dim for vi in model.graph.input if vi.name == name)
        shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in dims]
        if not all(isinstance(d, int) and d > 0 for d in shape):
            raise ValueError(f"input {name!r} is an image ({'x'.join(map(str, shape))}, it feeds a Conv), and an NPU "
                             f"build needs its size fixed: pass --shape {name}=1x{shape[1] if isinstance(shape[1], int) else 3}xHxW "
                             "(the resolution the NPU will run)")
        return {"input": name, "shape": shape}
    return None


def _onnxruntime_accuracy(state, io, seq_len, graphs: dict) -> dict:
    """onnxruntime on each graph vs PyTorch at (1, N): the float rewrites' parity comes before
    quantization, so a wrong rewrite is caught here, not blamed on int8."""
    from ..compile.simplify import ort_session
    from ..run.parity import make_inputs, torch_reference
    if state.spec is None:
        return {}
    inputs = make_inputs(io["inputs"], length=seq_len)
    ref = torch_reference(state.spec.to_dict())(inputs)["hidden"]
    return {name: accuracy(ref, ort_session(graph).run(None, inputs)[0]) for name, graph in graphs.items()}


def vendor_build(state) -> Added:
    """The profile's vendor compiler (npu/vendors.py) builds what legalize_onnx made."""
    from ..npu.vendors import vendor_hooks
    vendor = state.report["npu"]["vendor"]
    return vendor_hooks(vendor).build(state) if vendor else Added()


def finalize(state) -> Added:
    """After the host build: partition report, model.so, and the TVM build's accuracy.

    model.so is exported here, once, and the accuracy run loads that file: a VirtualMachine
    made on the in-memory executable would link it a second time (tens of seconds), and TVM
    0.27's VM records an empty memory scope per constant in the executable it runs
    (vm.cc's `memory_scopes[i]` inserts), which exporting it afterwards logs as one
    "Scope Saving:" warning per constant, and every later load as "Scope Loaded:"."""
    import tempfile
    from pathlib import Path
    from ..bundle.reference import find_case
    from ..npu.partition import partition
    npu = state.report["npu"]
    _, part = partition(state.relax, resolve_profile(state.target_options)[0])
    result = dict(npu["accuracy"])
    case = find_case(state.reference, npu["reference_length"])
    with tempfile.TemporaryDirectory() as tmp:
        so = Path(tmp) / "model.so"
        export_library(state.executable, so, target_options=state.target_options)
        if "hidden" in case.outputs and state.target_options["host"] == "llvm":  # the host build runs here
            import tvm
            from tvm import relax
            vm = relax.VirtualMachine(tvm.runtime.load_module(str(so)), tvm.cpu())
            got = vm["main"](*[tvm.runtime.tensor(case.inputs[i["name"]]) for i in state.io["inputs"]]).numpy()
            result[f"tvm_{npu['dtype'] if npu['dtype'] == 'int8' else 'fp32'}"] = accuracy(case.outputs["hidden"], got)
        library = so.read_bytes()
    return Added(report={"npu": {**npu, "partition": part, "accuracy": result}}, files={"model.so": library})


BACKEND = Backend(name="npu", tvm_target=tvm_target, relax_pipeline=relax_pipeline, legalize_onnx=legalize_onnx,
                  vendor_build=vendor_build, finalize=finalize, export_library=export_library,
                  precisions=("int8",),  # the NPU graph is always int8 (QDQ); quant.PRECISIONS
                  )
