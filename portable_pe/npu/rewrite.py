"""Rewrite ops a profile lacks into ops it has, on the folded fp32 graph.

Each rule fires only when the profile refuses the original form, so a permissive profile
keeps the graph as exported. Rules (and why they are exact or not):

    Gelu               -> Erf form (exact) if the profile has Erf; else, with Sigmoid and
                          Abs, x*sigmoid(x*(c0 + c1|x| + c2 x^2)) (a minimax fit: max
                          |error| 1.4e-4 over all reals, 3.4x below the tanh form's); else
                          the tanh approximation (max |error| 4.7e-4)
    Erf (foreign GELUs, x*0.5*(1 + erf(x/sqrt2)), come as a lone Erf)
                       -> tanh(u*(e0 + e1|u| + e2 u^2)) when the profile has Tanh and Abs
                          (a minimax fit: max |error| 1.7e-4 in erf, 2.5e-4 in such a GELU)
    LayerNormalization -> ReduceMean/Sub/Mul/Add/Sqrt/Div (exact up to rounding)
    Split              -> one Slice per output (exact)
    Slice, step k > 1  -> Reshape (P, D/k, k, S), Slice one column of the k, Reshape back,
                          when the profile allows only step 1 (exact: data movement only;
                          HF RoFormer takes pairs with x[..., ::2] and x[..., 1::2])
    Softmax on axis a  -> Transpose(a<->k), Softmax(axis=k), Transpose back, when the
                          profile allows only axis k (exact)
    rank-5 tensors     -> the unit batch axis dropped between the Reshape that makes them
                          and the Reshape that ends them (exact; batch is fixed to 1)
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .profiles import Profile, _attr


class _Graph:
    """Small helper to emit nodes and constants with fresh names."""

    def __init__(self, model: onnx.ModelProto):
        self.model, self.g = model, model.graph
        self.count = Counter()

    def name(self, stem: str) -> str:
        self.count[stem] += 1
        return f"npu_{stem}_{self.count[stem]}"

    def const(self, value, dtype=np.float32) -> str:
        name = self.name("const")
        self.g.initializer.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def node(self, op: str, inputs: list[str], out: str | None = None, **attrs) -> str:
        out = out or self.name(op.lower())
        self.new.append(helper.make_node(op, inputs, [out], name=self.name(f"n_{op.lower()}"), **attrs))
        return out


#: Gelu(x) ~ x * sigmoid(x * (c0 + c1|x| + c2 x^2)): logit(Phi(x)) is odd, ~1.5958 x near 0
#: and ~x^2/2 far out, which a polynomial in |x| follows with positive coefficients (so
#: sigmoid's argument grows monotonically and the form stays right for any |x|, in fp16
#: too). Minimax fit on [-40, 40] against the exact erf form: max |error| 1.39e-4.
SIGMOID_GELU = (1.585125252348186, 0.021176360626728938, 0.06276230460226112)


def _gelu(G, n, p: Profile) -> bool:
    x, y = n.input[0], n.output[0]
    if "Erf" not in p.ops and {"Sigmoid", "Abs", "Mul", "Add"} <= set(p.ops):
        c0, c1, c2 = SIGMOID_GELU
        a = G.node("Abs", [x])
        h = G.node("Add", [G.node("Mul", [a, G.node("Add", [G.node("Mul", [a, G.const(c2)]), G.const(c1)])]), G.const(c0)])
        G.node("Mul", [x, G.node("Sigmoid", [G.node("Mul", [x, h])])], out=y)
        return True
    if "Erf" in p.ops:
        e = G.node("Erf", [G.node("Mul", [x, G.const(1 / math.sqrt(2))])])
    elif "Tanh" in p.ops:
        cube = G.node("Mul", [x, G.node("Mul", [x, x])])
        inner = G.node("Add", [x, G.node("Mul", [cube, G.const(0.044715)])])
        e = G.node("Tanh", [G.node("Mul", [inner, G.const(math.sqrt(2 / math.pi))])])
    else:
        return False
    G.node("Mul", [G.node("Mul", [x, G.const(0.5)]), G.node("Add", [e, G.const(1.0)])], out=y)
    return True


#: erf(u) ~ tanh(u * (e0 + e1|u| + e2 u^2)), the same idea as SIGMOID_GELU fitted to erf
#: itself (minimax on [-30, 30]): max |error| 1.71e-4, half the tanh-GELU form's 3.6e-4.
TANH_ERF = (1.1259380720990024, 0.009695932829375517, 0.09448484436816773)


def _erf(G, n, p: Profile) -> bool:
    if not {"Tanh", "Abs", "Mul", "Add"} <= set(p.ops):
        return False
    e0, e1, e2 = TANH_ERF
    u = n.input[0]
    a = G.node("Abs", [u])
    h = G.node("Add", [G.node("Mul", [a, G.node("Add", [G.node("Mul", [a, G.const(e2)]), G.const(e1)])]), G.const(e0)])
    G.node("Tanh", [G.node("Mul", [u, h])], out=n.output[0])
    return True


def _layer_norm(G, n, p: Profile) -> bool:
    if not {"ReduceMean", "Sub", "Mul", "Add"} <= set(p.ops):
        return False
    x, scale = n.input[0], n.input[1]
    bias = n.input[2] if len(n.input) > 2 and n.input[2] else None
    axis, eps = _attr(n, "axis"), _attr(n, "epsilon")
    axes = G.const([-1 if axis in (None, -1) else axis], np.int64)
    mean = G.node("ReduceMean", [x, axes], keepdims=1)
    d = G.node("Sub", [x, mean])
    var = G.node("ReduceMean", [G.node("Mul", [d, d]), axes], keepdims=1)
    var_eps = G.node("Add", [var, G.const(1e-5 if eps is None else eps)])
    if {"Sqrt", "Div"} <= set(p.ops):
        normed = G.node("Div", [d, G.node("Sqrt", [var_eps])])
    elif "Pow" in p.ops:
        normed = G.node("Mul", [d, G.node("Pow", [var_eps, G.const(-0.5)])])
    else:
        return False
    scaled = G.node("Mul", [normed, scale], out=None if bias else n.output[0])
    if bias:
        G.node("Add", [scaled, bias], out=n.output[0])
    return True


def _split(G, n, p: Profile, shapes, consts) -> bool:
    if "Slice" not in p.ops or len(n.input) < 2 or n.input[1] not in consts:
        return False
    axis = _attr(n, "axis") or 0
    start = 0
    for out, size in zip(n.output, consts[n.input[1]].tolist()):
        G.node("Slice", [n.input[0], G.const([start], np.int64), G.const([start + size], np.int64),
                         G.const([axis], np.int64)], out=out)
        start += size
    return True


def _softmax(G, n, p: Profile, shapes, consts) -> bool:
    allowed = p.ops.get("Softmax", {}).get("attr_axis")
    rank = len(shapes.get(n.input[0]) or [])
    if not allowed or not rank:
        return False
    axis, target = (_attr(n, "axis") if _attr(n, "axis") is not None else -1) % rank, allowed[0]
    perm = list(range(rank))
    perm[axis], perm[target] = perm[target], perm[axis]  # a swap is its own inverse
    t = G.node("Transpose", [n.input[0]], perm=perm)
    G.node("Transpose", [G.node("Softmax", [t], axis=target)], out=n.output[0], perm=perm)
    return True


def _slice_step(G, n, p: Profile, shapes, consts) -> bool:
    """x[..., start::k, ...] along one axis of length D (k | D, start < k, to the end) as a
    strided view: (P, D, S) -> (P, D/k, k, S), take column `start`, reshape back."""
    shape = shapes.get(n.input[0])
    if len(n.input) < 5 or any(t not in consts for t in n.input[1:5]) or not shape or None in shape:
        return False
    starts, ends, axes, steps = (consts[t].tolist() for t in n.input[1:5])
    if len(steps) != 1 or steps[0] <= 1:
        return False
    k, axis = int(steps[0]), int(axes[0]) % len(shape)
    size, start = shape[axis], int(starts[0]) % max(shape[axis], 1)
    if size % k or start >= k or min(int(ends[0]), size) != size:
        return False
    lead, tail = int(np.prod(shape[:axis], dtype=np.int64)), int(np.prod(shape[axis + 1:], dtype=np.int64))
    view = G.node("Reshape", [n.input[0], G.const([lead, size // k, k, tail], np.int64)])
    one = G.node("Slice", [view, G.const([start], np.int64), G.const([start + 1], np.int64), G.const([2], np.int64)])
    G.node("Reshape", [one, G.const([*shape[:axis], size // k, *shape[axis + 1:]], np.int64)], out=n.output[0])
    return True


def refused(n, p: Profile, shapes, consts=None) -> bool:
    """Does the profile refuse this node as it stands (op or an attr constraint)?"""
    if n.op_type not in p.ops:
        return True
    if n.op_type == "Slice" and "attr_steps" in p.ops["Slice"]:
        steps = (consts or {}).get(n.input[4]) if len(n.input) > 4 else None
        return steps is not None and any(int(s) not in p.ops["Slice"]["attr_steps"] for s in steps.tolist())
    if n.op_type == "Softmax" and "attr_axis" in p.ops["Softmax"]:
        rank = len(shapes.get(n.input[0]) or []) or 1
        axis = _attr(n, "axis")
        return (-1 if axis is None else axis) % rank not in p.ops["Softmax"]["attr_axis"]
    return False


def rewrite_for_profile(model: onnx.ModelProto, profile: Profile) -> tuple[onnx.ModelProto, dict]:
    """The model with refused ops rewritten; report counts what was rewritten."""
    from .merged_axes import merge_transposed_axes
    from .rank import drop_unit_batch_axis
    from .profiles import _shapes
    model = onnx.ModelProto.FromString(model.SerializeToString())
    del model.graph.value_info[:]  # onnxsim's inferred shapes go stale once ranks change
    transposes = merge_transposed_axes(model, max_rank=profile.max_rank)
    dropped = drop_unit_batch_axis(model, max_rank=profile.max_rank)
    del model.graph.value_info[:]
    shapes = _shapes(model)
    consts = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    G = _Graph(model)
    rules = {"Gelu": lambda n: _gelu(G, n, profile), "Erf": lambda n: _erf(G, n, profile),
             "LayerNormalization": lambda n: _layer_norm(G, n, profile),
             "Split": lambda n: _split(G, n, profile, shapes, consts),
             "Softmax": lambda n: _softmax(G, n, profile, shapes, consts),
             "Slice": lambda n: _slice_step(G, n, profile, shapes, consts)}
    done, nodes = Counter(), []
    for n in model.graph.node:
        G.new = []
        if n.op_type in rules and refused(n, profile, shapes, consts) and rules[n.op_type](n):
            nodes.extend(G.new)
            done[n.op_type] += 1
        else:
            nodes.append(n)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    onnx.checker.check_model(model)
    return model, {"rewritten": dict(done), "rank_reduced_tensors": dropped, "transposes_on_merged_axes": transposes}
