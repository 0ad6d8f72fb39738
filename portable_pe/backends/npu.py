"""NPU-style targets: the bundle's model.onnx is the NPU-ready graph (static (1, N),
position encodings folded to constants, ops rewritten for the profile; QDQ int8, or the
float graph with --npu-dtype fp16), and model.so is a TVM build of that same graph for
the host CPU (llvm, or arm with --host arm).

legalize_onnx does the NPU work; it fails with a per-node report when the profile still
refuses nodes after rewriting. A profile with a `vendor` (rknpu2 -> RKNN-Toolkit2) also
hands the vendor's compiler the float graph in vendor_build: placement and accuracy then
come from the vendor's build log and simulator (npu/vendors.py). A vendor runs what its
NPU lacks on the CPU, so there a refused node is not an error but the profile's
prediction, which the vendor's placement is checked against.

Like every backend, this one reads the CompileState and returns what it made (Legalized,
Staged); the stages in compile.py record it.
"""

from __future__ import annotations

import numpy as np

from . import Legalized, Staged, llvm  # noqa

HOSTS = ("llvm", "arm")
VENDOR_BUILDS = ("auto", "require", "skip")


def _host(options):
    from . import get_backend
    from .targets import load_target
    host = options.get("host") or "llvm"
    if host not in HOSTS:
        raise ValueError(f"--host {host!r} is not a host for the npu target; valid: {', '.join(HOSTS)}")
    return get_backend(host), (load_target(host) if host != "llvm" else None)


def tvm_target(spec, *, profile=None, seq_len=None, host=None, npu_dtype=None, soc=None, vendor_build=None):
    if vendor_build not in (None, *VENDOR_BUILDS):
        raise ValueError(f"--vendor-build {vendor_build!r}; valid: {', '.join(VENDOR_BUILDS)}")
    backend, host_spec = _host({"host": host})
    return backend.tvm_target(host_spec) if host_spec is not None else llvm.tvm_target(spec)


#: the NPU graph is always int8 (QDQ); quant.PRECISIONS
PRECISIONS = ("int8",)


def relax_pipeline(target):
    # the host CPU pipeline (arm's is llvm's): its int8 lowering (cpu_schedule.quant_matmul)
    # runs the QDQ matmuls as integer kernels instead of float matmuls on dequantized copies
    return llvm.relax_pipeline(target)


def export_library(executable, path, *, target_options: dict | None = None) -> None:
    # an arm host's model.so must be linked by the cross compiler: the host backend knows how
    _host(target_options or {})[0].export_library(executable, path)


def _accuracy(reference: np.ndarray, got: np.ndarray) -> dict:
    r, g = reference.astype(np.float64).ravel(), got.astype(np.float64).ravel()
    return {"cosine": float(r @ g / (np.linalg.norm(r) * np.linalg.norm(g))),
            "max_abs": float(np.max(np.abs(r - g))), "max_ref": float(np.max(np.abs(r)))}


def _options(state):
    from ..npu.profiles import load_profile
    opts = state.target_options
    profile = load_profile(opts.get("profile") or "generic_int8")
    dtype = opts.get("npu_dtype") or "int8"
    profile.check_dtype(dtype)
    soc = profile.resolve_soc(opts.get("soc"))
    return profile.for_soc(soc), dtype, soc


def legalize_onnx(model, state) -> Legalized:
    from ..compile.pipeline import describe_io
    from ..npu.fold import fold_positions
    from ..npu.profiles import check_model, coverage, format_blockers
    from ..npu.quantize import quantize_int8
    from ..npu.rewrite import rewrite_for_profile
    from ..run.parity import TOLERANCES
    profile, dtype, soc = _options(state)
    seq_len = int(state.target_options.get("seq_len") or 128)
    profile.check_seq_len(seq_len)
    if state.spec is not None and state.spec.max_length < seq_len:
        raise ValueError(f"--seq-len {seq_len} exceeds graph {state.name!r}'s max length {state.spec.max_length}")
    folded, fold_report = fold_positions(model, seq_len=seq_len, batch=profile.batch)
    state.log(f"  npu: fixed (1, {seq_len}); folded {fold_report['folded_inputs']}; "
              f"{fold_report['nodes_before']} -> {fold_report['nodes_after']} nodes")
    before = [v for v in check_model(folded, profile) if not v.allowed]
    rewritten, rewrite_report = rewrite_for_profile(folded, profile)
    after = [v for v in check_model(rewritten, profile) if not v.allowed]
    state.log(f"  npu: profile {profile.name}{' (' + soc + ')' if soc else ''}: {len(before)} disallowed node(s) "
              f"before rewriting, {len(after)} after ({rewrite_report['rewritten']})")
    if after and not profile.vendor:
        raise ValueError(format_blockers(check_model(rewritten, profile), profile))
    if after:  # a vendor compiler places what its NPU lacks on the CPU: a prediction, checked later
        state.log(f"  npu: {len(after)} node(s) the profile expects on the CPU: "
                  + ", ".join(f"{v.node} [{v.op}]" for v in after[:8]) + (" ..." if len(after) > 8 else ""))
    host_graph = quantize_int8(rewritten, profile) if dtype == "int8" else rewritten
    verdicts = check_model(host_graph, profile, quantized=dtype == "int8")
    if any(not v.allowed for v in verdicts) and not profile.vendor:
        raise ValueError(f"after {dtype} quantization: " + format_blockers(verdicts, profile))
    cov = coverage(verdicts)
    state.log(f"  npu: profile check: {cov['nodes_npu']}/{cov['nodes_total']} nodes, "
              f"{cov['macs_npu'] / 1e6:.1f}/{cov['macs_total'] / 1e6:.1f} MMACs on the NPU")
    io = describe_io(host_graph, None)  # static (1, N): the reference runs at N only
    if io.get("static_length") != seq_len:
        raise ValueError(f"--seq-len {seq_len}, but the graph's input is fixed to length {io.get('static_length')} "
                         f"(by --shape or by the graph itself); pass --seq-len {io.get('static_length')}")
    files, vendor_opset, graphs = {}, None, {"onnxruntime_fp32_rewritten": rewritten}
    if dtype == "int8":
        graphs["onnxruntime_int8"] = host_graph
    if profile.vendor:
        from ..npu.vendors import get_vendor
        vendor = get_vendor(profile.vendor)
        vendor_model = vendor.vendor_graph(rewritten)
        files[vendor.PREFIX + "model.onnx"] = vendor_model.SerializeToString()
        vendor_opset = next(o.version for o in vendor_model.opset_import if o.domain in ("", "ai.onnx"))
        graphs["onnxruntime_vendor_graph"] = vendor_model
    accuracy = _onnxruntime_accuracy(state, io, seq_len, graphs)
    # outputs stay float32, but their error is the NPU dtype's: judge them by its row
    tolerance = {**state.target.tolerance, "float32": dict(TOLERANCES["int8" if dtype == "int8" else "float16"])}
    report = {"profile": profile.name, "profile_source": profile.source, "seq_len": seq_len, "dtype": dtype,
              "soc": soc, "vendor": profile.vendor, "vendor_opset": vendor_opset,
              "fold": fold_report, "rewrite": rewrite_report,
              "disallowed_before_rewrite": len(before), "disallowed_after_rewrite": len(after),
              "expected_on_cpu": [f"{v.node} [{v.op}]: {'; '.join(v.why)}" for v in after],
              "coverage": {"source": f"profile {profile.name}", **cov}, "accuracy": accuracy,
              "size_bytes": {"fp32": len(rewritten.SerializeToString()), dtype: len(host_graph.SerializeToString())}}
    return Legalized(model=host_graph, io=io, tolerance=tolerance, report={"npu": report}, files=files,
                     reference_model=folded if state.spec is None else None)


def _onnxruntime_accuracy(state, io, seq_len, graphs: dict) -> dict:
    """onnxruntime on each graph vs PyTorch at (1, N): the float rewrites' parity comes before
    quantization, so a wrong rewrite is caught here, not blamed on int8."""
    from ..run.parity import make_inputs, torch_reference
    from ..compile.simplify import ort_session
    if state.spec is None:
        return {}
    inputs = make_inputs(io["inputs"], length=seq_len)
    ref = torch_reference(state.spec.to_dict())(inputs)["hidden"]
    return {name: _accuracy(ref, ort_session(graph).run(None, inputs)[0]) for name, graph in graphs.items()}


def vendor_build(state) -> Staged | None:
    """The profile's vendor compiler builds the float graph legalize_onnx made; its log
    gives placement, its simulator runs the reference inputs. Without the toolchain (and
    --vendor-build auto) the bundle says plainly that no vendor build was made."""
    from ..npu.vendor import skipped_build, vendor_coverage
    from ..npu.vendors import get_vendor
    npu = state.target_report["npu"]
    from ..npu.vela import PROFILE_ACCELERATORS
    if npu.get("profile") in PROFILE_ACCELERATORS:  # Arm Ethos-U: Vela, from the PyTorch model
        from ..npu.vela_stage import vela_build
        return Staged(**vela_build(state, npu["profile"]))
    if not npu.get("vendor"):
        return None
    vendor = get_vendor(npu["vendor"])
    skipped = skipped_build(state.target_options.get("vendor_build") or "auto", vendor.TOOLCHAIN, state.log)
    if skipped is not None:
        return Staged(report=skipped)
    import onnx
    from ..npu.agreement import agreement
    from ..npu.profiles import check_model, coverage
    from ..run.parity import make_inputs
    profile, dtype, soc = _options(state)
    model = onnx.ModelProto.FromString(state.files[vendor.PREFIX + "model.onnx"])
    n = npu["seq_len"]
    inputs = {i["name"]: state.reference[f"T{n}/in/{i['name']}"] for i in state.io["inputs"]}
    calibration = [make_inputs(state.io["inputs"], length=n, seed=1 + i)  # quantize.py's seeds
                   for i in range(int(profile.quantization.get("calibration_samples", 8)))]
    built = vendor.build(model, soc=soc, dtype=dtype, calibration=calibration, simulate=[inputs], log=state.log)
    simulated = built.outputs[0]
    built.report["simulator"] = {name: _accuracy(state.reference[f"T{n}/out/{name}"], got)
                                 for name, got in simulated.items() if f"T{n}/out/{name}" in state.reference}
    for name, acc in built.report["simulator"].items():
        state.log(f"  {vendor.TOOLCHAIN} simulator vs reference ({name}): cosine {acc['cosine']:.6f}, "
                  f"max abs {acc['max_abs']:.3g}")
    placed = built.report["placement"]
    built.report["agreement"] = agreement(check_model(model, profile), placed)
    for line in built.report["agreement"]["disagreements"]:
        state.log(f"  WARNING: profile {profile.name} and {vendor.TOOLCHAIN} disagree: {line}")
    import io as _io
    buf = _io.BytesIO()
    np.savez(buf, **{f"T{n}/out/{k}": v for k, v in simulated.items()})
    vendor_cov = vendor_coverage(f"{built.report['toolkit']} build log ({soc})", npu_ops=placed["ops_npu"],
                                 cpu_ops=placed["ops_cpu"])
    npu_report = {**npu, "coverage": vendor_cov, "profile_coverage": npu["coverage"],
                  "profile_coverage_vendor_graph": coverage(check_model(model, profile))}
    return Staged(report={"vendor": built.report, "npu": npu_report},
                  files={**built.files, vendor.PREFIX + "simulator.npz": buf.getvalue()})


def finalize(state) -> Staged:
    """After the host build: partition report, model.so, and the TVM build's accuracy.

    model.so is exported here, once, and the accuracy run loads that file: a VirtualMachine
    made on the in-memory executable would link it a second time (tens of seconds), and TVM
    0.27's VM records an empty memory scope per constant in the executable it runs
    (vm.cc's `memory_scopes[i]` inserts), which exporting it afterwards logs as one
    "Scope Saving:" warning per constant, and every later load as "Scope Loaded:"."""
    import tempfile
    from pathlib import Path
    from ..npu.partition import partition
    npu = state.target_report["npu"]
    _, part = partition(state.relax, _options(state)[0])
    accuracy = dict(npu["accuracy"])
    n = npu["seq_len"]
    ref, inputs = state.reference.get(f"T{n}/out/hidden"), {
        k.split("/")[-1]: v for k, v in state.reference.items() if k.startswith(f"T{n}/in/")}
    with tempfile.TemporaryDirectory() as tmp:
        so = Path(tmp) / "model.so"
        export_library(state.executable, so, target_options=state.target_options)
        if ref is not None and state.tvm_target.kind.name == "llvm" and "mtriple" not in state.tvm_target.attrs:
            import tvm
            from tvm import relax
            vm = relax.VirtualMachine(tvm.runtime.load_module(str(so)), tvm.cpu())
            got = vm["main"](*[tvm.runtime.tensor(inputs[i["name"]]) for i in state.io["inputs"]]).numpy()
            accuracy[f"tvm_{npu['dtype'] if npu['dtype'] == 'int8' else 'fp32'}"] = _accuracy(ref, got)
        library = so.read_bytes()
    return Staged(report={"npu": {**npu, "partition": part, "accuracy": accuracy}}, files={"model.so": library})
