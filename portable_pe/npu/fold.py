"""Fix shapes to (1, N) and fold every position computation into constants.

With positions an explicit input, every position encoding is a function of that input
alone (sin/cos of positions, table lookups, T5 buckets of position differences, ALiBi
distances). Replacing the input by the constant arange(N) makes all of it constant, and
onnxsim's constant folding turns it into tables: (N, D) for absolute encodings, (N, r/2)
cos/sin for RoPE, (H, N, N) biases for T5 and ALiBi.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections import Counter

import numpy as np
import onnx
from onnx import numpy_helper

from ..spec.io_names import is_position_input

#: ops that compute positions at run time; none may survive folding (NPUs lack them, and
#: a surviving one means the encoding still depends on something other than positions)
RUNTIME_POSITION_OPS = ("Sin", "Cos", "Range", "Log", "Shape", "CumSum", "Abs", "Greater", "Less",
                        "Where", "Clip", "Cast", "Div")


def _is_position_input(vi: onnx.ValueInfoProto) -> bool:
    t = vi.type.tensor_type
    return t.elem_type == onnx.TensorProto.INT64 and is_position_input(vi.name)


def fold_positions(model: onnx.ModelProto, *, seq_len: int, batch: int = 1) -> tuple[onnx.ModelProto, dict]:
    """The model with inputs fixed to (batch, seq_len, ...) and positions = arange(seq_len)
    folded in. Returns (model, report) where report says which inputs were folded and
    which run-time position ops disappeared."""
    import onnxsim
    if seq_len < 1:
        raise ValueError(f"--seq-len must be a positive integer, got {seq_len}")
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    initializers = {i.name for i in graph.initializer}
    folded = []
    for vi in list(graph.input):
        if vi.name in initializers:
            continue
        if _is_position_input(vi):
            if len(vi.type.tensor_type.shape.dim) != 1:
                raise ValueError(f"position input {vi.name!r} must have rank 1 (seq,), "
                                 f"got rank {len(vi.type.tensor_type.shape.dim)}")
            graph.input.remove(vi)
            graph.initializer.append(numpy_helper.from_array(np.arange(seq_len, dtype=np.int64), vi.name))
            folded.append(vi.name)
            continue
        dims = vi.type.tensor_type.shape.dim
        for axis, dim in enumerate(dims):
            if dim.dim_value:
                continue
            size = batch if axis == 0 and len(dims) >= 2 else seq_len
            dim.Clear()
            dim.dim_value = size
    # stale dynamic shapes in value_info/outputs would contradict the fixed ones
    del graph.value_info[:]
    for out in graph.output:
        for dim in out.type.tensor_type.shape.dim:
            if dim.dim_param:
                dim.Clear()
    before = Counter(n.op_type for n in graph.node)
    with _without_skipped_folds():
        simplified, ok = onnxsim.simplify(model, check_n=0, skipped_optimizers=[
            "fuse_matmul_add_bias_into_gemm", "fuse_matmul_add_bias_into_gemm_batched"])
    if not ok:
        raise RuntimeError("onnxsim could not fold the fixed-shape graph")
    _constants_to_initializers(simplified)
    after = Counter(n.op_type for n in simplified.graph.node)
    left = {op: after[op] for op in RUNTIME_POSITION_OPS if after.get(op)}
    report = {"seq_len": seq_len, "batch": batch, "folded_inputs": folded,
              "nodes_before": sum(before.values()), "nodes_after": sum(after.values()),
              "removed_ops": {op: n - after.get(op, 0) for op, n in before.items() if n > after.get(op, 0)},
              "runtime_position_ops_left": left,
              "constant_bytes": sum(numpy_helper.to_array(i).nbytes for i in simplified.graph.initializer)}
    return simplified, report


#: what onnxsim's C++ writes to stderr for a node it cannot fold yet on one pass: a vision
#: graph's patch positions come from the stem's output shape, known only after a later
#: pass, which folds them (runtime_position_ops_left says whether any stayed)
_SKIPPED_FOLD = "WARNING: failed to run "


@contextlib.contextmanager
def _without_skipped_folds():
    """stderr (the file descriptor, where C++ writes) with onnxsim's skipped-fold lines left out."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            kept = [line for line in caught.read().decode(errors="replace").splitlines(keepends=True)
                    if not line.startswith(_SKIPPED_FOLD)]
            sys.stderr.write("".join(kept))


def _constants_to_initializers(model: onnx.ModelProto) -> None:
    """Constant nodes (onnxsim keeps some the TorchScript exporter wrote) become initializers:
    the same values, and NPU compilers and op lists count only real ops. Initializers no
    node reads are dropped."""
    keep = []
    for n in model.graph.node:
        if n.op_type == "Constant" and len(n.attribute) == 1 and n.attribute[0].name == "value":
            tensor = onnx.TensorProto()
            tensor.CopyFrom(n.attribute[0].t)
            tensor.name = n.output[0]
            model.graph.initializer.append(tensor)
        else:
            keep.append(n)
    del model.graph.node[:]
    model.graph.node.extend(keep)
    used = {t for n in keep for t in n.input} | {o.name for o in model.graph.output}
    dead = [i for i in model.graph.initializer if i.name not in used]
    for init in dead:  # onnxruntime warns about each, and vendors would store them
        model.graph.initializer.remove(init)
