"""Rank-5 -> rank-4: drop the unit batch axis where a graph goes above the profile's rank.

Interleaved RoPE views q/k as (B, H, T, r/2, 2) pairs. With the batch fixed to 1 the
same computation runs on (H, T, r/2, 2): the Reshape that makes the rank-5 tensor drops
its leading 1, and every op downstream keeps working on one axis less (positive axes
shift by one, constants that spell out the batch axis lose it) until a Reshape with an
explicit target shape restores the full rank. Ops this pass does not know stop it and
leave the graph unchanged there, so the profile check reports them.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

_ELEMENTWISE = {"Add", "Sub", "Mul", "Div", "Neg", "Tanh", "Sigmoid", "Erf", "Sqrt"}
_AXIS_ATTR = {"Gather": "axis", "Concat": "axis", "Softmax": "axis"}


def _rank_map(model) -> dict[str, list]:
    inferred = onnx.shape_inference.infer_shapes(model)
    g = inferred.graph
    out = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim] for vi in [*g.input, *g.value_info, *g.output]}
    out.update({i.name: list(i.dims) for i in g.initializer})
    return out


def drop_unit_batch_axis(model: onnx.ModelProto, *, max_rank: int) -> int:
    """Rewrite `model` in place; returns how many tensors lost their batch axis."""
    shapes = _rank_map(model)
    inits = {i.name: i for i in model.graph.initializer}
    dropped: set[str] = set()
    for n in model.graph.node:
        ins = [t for t in n.input if t in dropped]
        if n.op_type == "Reshape" and not ins:
            shape = numpy_helper.to_array(inits[n.input[1]]) if n.input[1] in inits else None
            if shape is not None and len(shape) > max_rank and shape[0] == 1:
                new = numpy_helper.from_array(shape[1:].astype(np.int64), n.input[1] + f"_nb_{n.name}")
                model.graph.initializer.append(new)
                n.input[1] = new.name
                dropped.add(n.output[0])
            continue
        if not ins or n.op_type == "Reshape":  # a Reshape consuming one restores the full shape
            continue
        rank = len(shapes.get(n.output[0], [])) or len(shapes[ins[0]])
        if n.op_type in _AXIS_ATTR:
            for a in n.attribute:
                if a.name == _AXIS_ATTR[n.op_type] and a.i >= 0:
                    a.i -= 1
            if n.op_type == "Concat" and len(ins) != len([t for t in n.input if t]):
                raise ValueError(f"rank reduction: Concat {n.name} mixes batch-less and full inputs")
        elif n.op_type == "Unsqueeze":
            axes = numpy_helper.to_array(inits[n.input[1]])
            new = numpy_helper.from_array(np.where(axes >= 0, axes - 1, axes).astype(np.int64), n.input[1] + f"_nb_{n.name}")
            model.graph.initializer.append(new)
            n.input[1] = new.name
        elif n.op_type in _ELEMENTWISE:
            for i, t in enumerate(n.input):
                if t in dropped or len(shapes.get(t, [])) < rank:
                    continue  # right-aligned broadcasting never sees the batch axis
                if t not in inits or shapes[t][0] != 1:
                    raise ValueError(f"rank reduction: {n.op_type} {n.name} input {t} spells out the batch axis")
                arr = numpy_helper.to_array(inits[t])[0]
                new = numpy_helper.from_array(arr, t + f"_nb_{n.name}")
                model.graph.initializer.append(new)
                n.input[i] = new.name
        else:
            raise ValueError(f"rank reduction: no rule for {n.op_type} node {n.name}")
        dropped.update(n.output)
    return len(dropped)
