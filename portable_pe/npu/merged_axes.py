"""Reshape -> Transpose -> Reshape above the NPU's rank, written on merged axes.

A window partition cuts an image into windows with a rank-6 view and a Transpose
(transformers' Swin: (1, H/w, w, W/w, w, C), perm (0, 1, 3, 2, 4, 5)), and the next Reshape
flattens the result again. Axes that stay neighbours, in order, under the permutation move
as one: merged, the same data movement is (H/w, w, W/w, w*C) with perm (0, 2, 1, 3), rank 4,
which the NPU takes ("rank reduction: no rule for Transpose" before). Only a chain whose
first view comes from a constant target and whose transposed tensor is read by Reshapes
alone is rewritten, so nothing else sees the merged shape.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from ..legalize.graph import readers as graph_readers


def merge_transposed_axes(model: onnx.ModelProto, *, max_rank: int) -> int:
    """Rewrite `model` in place; returns how many Transposes now run at rank <= max_rank."""
    inits = {i.name: i for i in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}
    readers = graph_readers(model.graph)
    merged = 0
    for node in model.graph.node:
        if node.op_type != "Transpose":
            continue
        view = producer.get(node.input[0])
        if view is None or view.op_type != "Reshape" or view.input[1] not in inits:
            continue
        shape = [int(d) for d in numpy_helper.to_array(inits[view.input[1]])]
        perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
        later = readers.get(node.output[0], [])
        if (perm is None or len(shape) <= max_rank or any(d <= 0 for d in shape) or not later
                or not all(_plain_target(r, inits) for r in later) or len(readers.get(view.output[0], [])) != 1):
            continue
        groups = _runs(perm)
        if len(groups) > max_rank:
            continue
        sizes = [int(np.prod([shape[a] for a in g])) for g in groups]  # input order
        order = sorted(range(len(groups)), key=lambda i: groups[i][0])
        new_shape = [sizes[i] for i in order]
        new_perm = [order.index(i) for i in range(len(groups))]
        target = numpy_helper.from_array(np.array(new_shape, np.int64), f"{view.input[1]}_merged_{view.name}")
        model.graph.initializer.append(target)
        view.input[1] = target.name
        for a in node.attribute:
            if a.name == "perm":
                a.ints[:] = new_perm
        merged += 1
    return merged


def _plain_target(node: onnx.NodeProto, inits: dict) -> bool:
    """A Reshape to a constant shape that copies no dim of its input (no 0): it reads the
    transposed elements in order, whatever shape they were in."""
    return (node.op_type == "Reshape" and node.input[1] in inits
            and 0 not in numpy_helper.to_array(inits[node.input[1]]).tolist())


def _runs(perm: list[int]) -> list[list[int]]:
    """perm's output order cut into runs of consecutive input axes: each run moves as one."""
    groups = [[perm[0]]]
    for axis in perm[1:]:
        if axis == groups[-1][-1] + 1:
            groups[-1].append(axis)
        else:
            groups.append([axis])
    return groups
