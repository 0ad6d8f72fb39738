"""Simplify: onnxsim, then the simplified graph checked against the original with onnxruntime."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import onnx


# MatMul+Add -> Gemm needs 2-D operands, so onnxsim wraps every 3-D linear layer in
# Reshape/Shape/Concat chains (202 -> 246 nodes on the rope graph) that TVM fuses worse.
_SKIPPED_OPTIMIZERS = ("fuse_matmul_add_bias_into_gemm", "fuse_matmul_add_bias_into_gemm_batched")


@dataclass
class SimplifyReport:
    nodes_before: int
    nodes_after: int
    ops_before: dict[str, int]
    ops_after: dict[str, int]
    max_abs_diff: float

    def summary(self) -> str:
        removed = {op: n - self.ops_after.get(op, 0) for op, n in self.ops_before.items()
                   if n > self.ops_after.get(op, 0)}
        gone = ", ".join(f"{op} -{n}" for op, n in sorted(removed.items(), key=lambda kv: -kv[1])[:6])
        return (f"{self.nodes_before} -> {self.nodes_after} nodes"
                f"{' (' + gone + ')' if gone else ''}; max |simplified - original| = {self.max_abs_diff:.2e}")


def op_counts(model: onnx.ModelProto) -> dict[str, int]:
    return dict(Counter(n.op_type for n in model.graph.node))


def ort_session(model, *, threads: int = 0, spin: bool = True):
    """An onnxruntime CPU session on a ModelProto or an .onnx path. spin=False stops idle
    workers from spinning, which would steal the cores of whatever is timed next."""
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if threads:
        opts.intra_op_num_threads = threads
    if not spin:
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(source, opts, providers=["CPUExecutionProvider"])


def simplify_onnx(model: onnx.ModelProto, *, check_inputs: list[dict[str, np.ndarray]],
                  atol: float = 1e-4) -> tuple[onnx.ModelProto, SimplifyReport]:
    """onnxsim with its own check off; we check on the caller's seeded inputs instead
    (several lengths), because onnxsim's random check cannot pick valid position ids."""
    import onnxsim
    from .bf16_mul import widen_bf16_mul
    model, _ = widen_bf16_mul(model)  # before anything runs it: onnxruntime has no bf16 Mul
    simplified, ok = onnxsim.simplify(model, check_n=0, skipped_optimizers=list(_SKIPPED_OPTIMIZERS))
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
                                      op_counts(model), op_counts(simplified), worst)
