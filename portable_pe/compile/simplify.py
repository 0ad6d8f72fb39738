"""Simplify: onnxsim, then the simplified graph checked against the original with onnxruntime."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import onnx


# MatMul+Add -> Gemm needs 2-D operands, so onnxsim wraps every 3-D linear layer in
# Reshape/Shape/Concat chains (202 -> 246 nodes on the rope graph) that TVM fuses worse.
# fuse_attention writes com.microsoft.Attention, whose TVM converter refuses a custom
# `scale` ("custom scale is not currently supported": transformers' SigLIP at a pinned
# size); the CPU pipeline fuses attention itself (cpu_schedule/attention.py), and the
# NPU and vendor graphs must stay standard ONNX anyway.
_SKIPPED_OPTIMIZERS = ("fuse_matmul_add_bias_into_gemm", "fuse_matmul_add_bias_into_gemm_batched", "fuse_attention")


@dataclass
class SimplifyReport:
    nodes_before: int
    nodes_after: int
    ops_before: dict[str, int]
    ops_after: dict[str, int]
    max_abs_diff: float
    constant_folding: bool = True

    def summary(self) -> str:
        removed = {op: n - self.ops_after.get(op, 0) for op, n in self.ops_before.items()
                   if n > self.ops_after.get(op, 0)}
        gone = ", ".join(f"{op} -{n}" for op, n in sorted(removed.items(), key=lambda kv: -kv[1])[:6])
        return (f"{self.nodes_before} -> {self.nodes_after} nodes"
                f"{'' if self.constant_folding else ' (onnxsim without its constant folding, which failed on this graph)'}"
                f"{' (' + gone + ')' if gone else ''}; max |simplified - original| = {self.max_abs_diff:.2e}")


def op_counts(model: onnx.ModelProto) -> dict[str, int]:
    return dict(Counter(n.op_type for n in model.graph.node))


def ort_session(model, *, threads: int = 0, spin: bool = True, quiet: bool = False):
    """An onnxruntime CPU session on a ModelProto or an .onnx path. spin=False stops idle
    workers from spinning, which would steal the cores of whatever is timed next; quiet
    keeps the errors of runs expected to fail (a probe) off stderr: the caller reports them."""
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.log_severity_level = 4 if quiet else 3
    if threads:
        opts.intra_op_num_threads = threads
    if not spin:
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(source, opts, providers=["CPUExecutionProvider"])


def onnxruntime_words(err: Exception) -> str:
    """onnxruntime's message for a failed run, without its source-file prefix: the words
    after its failed check ("Attempting to broadcast an axis by a dimension other than 1.
    17 by 25")."""
    text = str(err).strip()
    status = text.find("Status Message:")
    text = text[status + len("Status Message:"):] if status >= 0 else text
    text = text.rsplit("was false.", 1)[-1]
    return " ".join(text.split())[:240]


def run_failure(session, feeds: dict) -> str | None:
    """onnxruntime's words (onnxruntime_words) where `session` cannot run `feeds`, else None:
    the probes' question, asked of the original graph before anything is trusted."""
    try:
        session.run(None, feeds)
    except Exception as err:  # pylint: disable=broad-except  # onnxruntime's own error types
        return onnxruntime_words(err)
    return None


def simplify_onnx(model: onnx.ModelProto, *, check_inputs: list[dict[str, np.ndarray]],
                  atol: float = 1e-4) -> tuple[onnx.ModelProto, SimplifyReport]:
    """onnxsim with its own check off; we check on the caller's seeded inputs instead
    (several lengths), because onnxsim's random check cannot pick valid position ids.
    `model` must be one onnxruntime runs (bf16_mul.widen_bf16_mul first: stage_simplify)."""
    import onnxsim
    try:
        simplified, ok = onnxsim.simplify(model, check_n=0, skipped_optimizers=list(_SKIPPED_OPTIMIZERS))
        folded = True
    except Exception:  # pylint: disable=broad-except  # onnxsim's own failure, not the graph's
        # onnxsim's constant folding breaks some TorchScript graphs with If subgraphs
        # (DINOv3's rope: "Nodes in a graph must be topologically sorted ... is not output of
        # any previous nodes"); legalize folds what it can follow instead
        simplified, ok = onnxsim.simplify(model, check_n=0, skip_constant_folding=True,
                                          skipped_optimizers=list(_SKIPPED_OPTIMIZERS))
        folded = False
    if not ok:
        raise RuntimeError("onnxsim could not simplify the graph")
    before, after = ort_session(model), ort_session(simplified)
    worst = 0.0
    for feeds in check_inputs:
        for a, b in zip(before.run(None, feeds), after.run(None, feeds)):
            worst = max(worst, float(np.max(np.abs(a - b))) if a.size else 0.0)
    if worst > atol:
        raise RuntimeError(f"simplified graph differs from the original by {worst:.3g} (> {atol})")
    return simplified, SimplifyReport(len(model.graph.node), len(simplified.graph.node),
                                      op_counts(model), op_counts(simplified), worst, folded)
