"""Attention's head merge written as a concatenation of the heads, in the graph RKNN is handed.

An encoder merges its heads as a transpose and a view:

    O [.., H, T, D] -> Transpose (.., T, H, D) -> Reshape [.., T, H*D]

The same tensor is the heads side by side on the last axis:

    O -> Split along H into H x [.., 1, T, D] -> Reshape each [.., T, D] -> Concat on the last axis

data movement only, so exact.

Why, for RKNN: RKNN-Toolkit2 2.5.0's fp16 build of transformers' Swin (the tiny config of
portable_pe/hf/vision.py, 2 x 2 windows: heads [196, 4, 4, 8]) computed the transposed
merge wrong in the whole graph (its own float "golden" execution, accuracy_analysis, had
the Reshape's output at cosine 0.197 while the Transpose alone, cut as an output, was
right), and the output came out at cosine 0.997184 against PyTorch; the same two ops
alone, or after one MatMul, were right, so the fault was not reduced to a small case.
Written as a concatenation, the same file builds 181 ops on the NPU (169 before), 0 on
the CPU, RKNN's layer-table cycle sum is unchanged (338,115) and the simulator's output
is at cosine 1.000000 (max abs 4.4e-3 of ~4); int8 0.996676 -> 0.999458. The transposed
form also cost precision in transformers' ViT and DINOv2 (fp16 cosine 0.999997 and
0.999993, max abs 0.036 and 0.101 -> 1.000000 and 0.0038). The text graphs and
portable-pe's vision graphs build to the same op counts, cycles and cosines either way.

Also tried: folding the merge into the output projection (a per-head MatMul against the
weight viewed [H, D, C], then ReduceSum over H). Right as well, but RKNN lowers that
batched MatMul with Transposes: Swin's cycle sum 338,115 -> 664,085, HF ViT's int8
246,910 -> 454,176, and in portable-pe's own Swin a [4, 4, 49, 256] Transpose went to the
CPU (wider than the NPU's 8176).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..legalize.graph import readers as graph_readers

#: the suffix of a rewritten merge's Concat node, by which a report counts them
CONCAT_OF_HEADS = "_concat_of_heads"


def concat_head_merges(model: onnx.ModelProto) -> int:
    """Rewrite `model` in place; returns how many head merges became concatenations. Only
    a Transpose whose one reader is the merging Reshape is rewritten: nothing else sees
    the change."""
    from .profiles import _shapes
    g = model.graph
    readers = graph_readers(g)
    shapes = _shapes(model)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    replaced: dict[int, list[onnx.NodeProto]] = {}
    dropped: set[int] = set()
    targets: set[str] = set()  # the merging Reshapes' shape inputs
    for transpose in g.node:
        reshape = _merging_reshape(transpose, readers, shapes)
        if reshape is None:
            continue
        *batch, heads, tokens, dim = shapes[transpose.input[0]]
        stem = transpose.name or transpose.output[0]  # names are unique; a node's may be empty
        head_axis = len(batch)
        parts = [f"{stem}_head{h}" for h in range(heads)]
        views = [f"{part}_view" for part in parts]
        target = numpy_helper.from_array(np.array([*batch, tokens, dim], np.int64), f"{stem}_head_view")
        g.initializer.append(target)
        replaced[id(reshape)] = [
            _split(g, transpose.input[0], parts, head_axis, opset, name=f"{stem}_split_heads"),
            *(helper.make_node("Reshape", [part, target.name], [view], name=view) for part, view in zip(parts, views)),
            helper.make_node("Concat", views, [reshape.output[0]], axis=len(batch) + 1,
                             name=f"{stem}{CONCAT_OF_HEADS}")]
        dropped.add(id(transpose))
        targets.add(reshape.input[1])
    if not replaced:
        return 0
    nodes = []
    for n in g.node:
        if id(n) in replaced:
            nodes.extend(replaced[id(n)])
        elif id(n) not in dropped:
            nodes.append(n)
    del g.node[:]
    g.node.extend(nodes)
    unread = targets - {name for n in g.node for name in n.input}
    for init in [i for i in g.initializer if i.name in unread]:
        g.initializer.remove(init)
    del g.value_info[:]  # the transposed tensors are gone
    return len(replaced)


def _split(g, data: str, outs: list[str], axis: int, opset: int, *, name: str) -> onnx.NodeProto:
    """Split into equal parts of one along `axis`: the sizes an input from opset 13 on, an
    attribute before."""
    if opset < 13:
        return helper.make_node("Split", [data], outs, axis=axis, split=[1] * len(outs), name=name)
    sizes = numpy_helper.from_array(np.ones(len(outs), np.int64), f"{name}_sizes")
    g.initializer.append(sizes)
    return helper.make_node("Split", [data, sizes.name], outs, axis=axis, name=name)


def _merging_reshape(transpose, readers, shapes):
    """The Reshape that, with `transpose`, merges heads (module docstring), else None."""
    if transpose.op_type != "Transpose":
        return None
    heads_in = shapes.get(transpose.input[0])
    if not heads_in or len(heads_in) < 4 or None in heads_in:
        return None
    rank = len(heads_in)
    perm = next((list(a.ints) for a in transpose.attribute if a.name == "perm"), None)
    if perm != [*range(rank - 3), rank - 2, rank - 3, rank - 1]:  # (.., H, T, D) -> (.., T, H, D)
        return None
    later = readers.get(transpose.output[0], [])
    if len(later) != 1 or later[0].op_type != "Reshape":
        return None
    *batch, heads, tokens, dim = heads_in
    if shapes.get(later[0].output[0]) != [*batch, tokens, heads * dim]:
        return None
    return later[0]
