"""NPU-style targets: the bundle's model.onnx is the NPU-ready graph (static (1, N),
position encodings folded to constants, ops rewritten for the profile, QDQ int8), and
model.so is a TVM build of that same graph for the host CPU (llvm, or arm with --host arm).

legalize_onnx does the NPU work; it fails with a per-node report when the profile still
refuses nodes after rewriting, and records coverage and int8 accuracy for the manifest.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from . import llvm

HOSTS = ("llvm", "arm")


def _host(options):
    from . import get_backend
    from ..targets import load_target
    host = options.get("host") or "llvm"
    if host not in HOSTS:
        raise ValueError(f"--host {host!r} is not a host for the npu target; valid: {', '.join(HOSTS)}")
    return get_backend(host), (load_target(host) if host != "llvm" else None)


def tvm_target(spec, *, profile=None, seq_len=None, host=None):
    backend, host_spec = _host({"host": host})
    return backend.tvm_target(host_spec) if host_spec is not None else llvm.tvm_target(spec)


#: the NPU graph is always int8 (QDQ); quant.PRECISIONS
PRECISIONS = ("int8",)


def relax_pipeline(target):
    # the host CPU pipeline (arm's is llvm's): its int8 lowering (cpu_schedule.quant_matmul)
    # runs the QDQ matmuls as integer kernels instead of float matmuls on dequantized copies
    return llvm.relax_pipeline(target)


def export_library(executable, path) -> None:
    # an arm host's model.so must be linked by the cross compiler: the host backend knows how
    target = getattr(executable, "_portable_pe_host", None)
    (target or llvm).export_library(executable, path)


def _accuracy(reference: np.ndarray, got: np.ndarray) -> dict:
    r, g = reference.astype(np.float64).ravel(), got.astype(np.float64).ravel()
    return {"cosine": float(r @ g / (np.linalg.norm(r) * np.linalg.norm(g))),
            "max_abs": float(np.max(np.abs(r - g))), "max_ref": float(np.max(np.abs(r)))}


def legalize_onnx(model, state):
    from ..compile import describe_io
    from ..npu.fold import fold_positions
    from ..npu.profiles import check_model, coverage, format_blockers, load_profile
    from ..npu.quantize import quantize_int8
    from ..npu.rewrite import rewrite_for_profile
    from ..parity import TOLERANCES
    from ..simplify import ort_session
    opts = state.target_options
    profile = load_profile(opts.get("profile") or "generic_int8")
    seq_len = int(opts.get("seq_len") or 128)
    profile.check_seq_len(seq_len)
    if state.spec is not None and state.spec.max_length < seq_len:
        raise ValueError(f"--seq-len {seq_len} exceeds graph {state.name!r}'s max length {state.spec.max_length}")
    folded, fold_report = fold_positions(model, seq_len=seq_len, batch=profile.batch)
    state.log(f"  npu: fixed (1, {seq_len}); folded {fold_report['folded_inputs']}; "
              f"{fold_report['nodes_before']} -> {fold_report['nodes_after']} nodes")
    before = [v for v in check_model(folded, profile) if not v.allowed]
    rewritten, rewrite_report = rewrite_for_profile(folded, profile)
    after = [v for v in check_model(rewritten, profile) if not v.allowed]
    state.log(f"  npu: profile {profile.name}: {len(before)} disallowed node(s) before rewriting, "
              f"{len(after)} after ({rewrite_report['rewritten']})")
    if after:
        raise ValueError(format_blockers(check_model(rewritten, profile), profile))
    quantized = quantize_int8(rewritten, profile)
    verdicts = check_model(quantized, profile, quantized=True)
    if any(not v.allowed for v in verdicts):
        raise ValueError("after int8 quantization: " + format_blockers(verdicts, profile))
    cov = coverage(verdicts)
    state.log(f"  npu: {cov['nodes_npu']}/{cov['nodes_total']} nodes, "
              f"{cov['macs_npu'] / 1e6:.1f}/{cov['macs_total'] / 1e6:.1f} MMACs on the NPU")
    state.io = describe_io(quantized, None)  # static (1, N): the reference runs at N only
    # outputs stay float32, but their error is int8's: judge them by the int8 row
    state.target = dataclasses.replace(state.target, tolerance={
        **state.target.tolerance, "float32": dict(TOLERANCES["int8"])})
    accuracy = {}
    if state.spec is not None:
        from ..parity import make_inputs, torch_reference
        inputs = make_inputs(state.io["inputs"], length=seq_len)
        ref = torch_reference(state.spec.to_dict())(inputs)["hidden"]
        got = ort_session(quantized).run(None, inputs)[0]
        fp32 = ort_session(rewritten).run(None, inputs)[0]
        accuracy = {"onnxruntime_int8": _accuracy(ref, got), "onnxruntime_fp32_rewritten": _accuracy(ref, fp32)}
    state.target_report["npu"] = {"profile": profile.name, "profile_source": profile.source, "seq_len": seq_len,
                 "fold": fold_report, "rewrite": rewrite_report,
                 "disallowed_before_rewrite": len(before), "disallowed_after_rewrite": len(after),
                 "coverage": cov, "accuracy": accuracy,
                 "size_bytes": {"fp32": len(rewritten.SerializeToString()), "int8": len(quantized.SerializeToString())}}
    return quantized


def finalize(state) -> dict:
    """After the host build: partition report and the TVM build's accuracy, for the manifest."""
    from ..npu.partition import partition
    from ..npu.profiles import load_profile
    _, state.target_report["npu"]["partition"] = partition(state.relax, load_profile(state.target_report["npu"]["profile"]))
    n = state.target_report["npu"]["seq_len"]
    ref, inputs = state.reference.get(f"T{n}/out/hidden"), {
        k.split("/")[-1]: v for k, v in state.reference.items() if k.startswith(f"T{n}/in/")}
    if ref is not None and state.tvm_target.kind.name == "llvm" and "mtriple" not in state.tvm_target.attrs:
        import tvm
        from tvm import relax
        vm = relax.VirtualMachine(state.executable, tvm.cpu())
        got = vm["main"](*[tvm.runtime.tensor(inputs[i["name"]]) for i in state.io["inputs"]]).numpy()
        state.target_report["npu"]["accuracy"]["tvm_int8"] = _accuracy(ref, got)
    state.executable._portable_pe_host = _host(state.target_options)[0]  # for export_library
    return {"npu": state.target_report["npu"]}
