"""Symbolic output shapes of ONNX nodes: dims are sympy expressions of the graph inputs' dims.

ONNX's own shape inference gives up on a dim as soon as it is a compound expression
(``T + 1``, ``past + T``, ``ceil(T / 4) * 4``) and writes a fresh ``unk__`` name; from
there on a chain of reshapes cannot be followed. Each rule here maps the input shapes
(and, where a shape depends on them, the symbolic values of small int inputs) to the
output shapes, so every dim stays an exact expression of the input dims.

``SHAPE_RULES``: op_type -> rule(attrs, shapes, values, n_out) -> [shape | None per output].
A shape is a list of sympy expressions, ``None`` in place of a dim that is not known.
"""

from __future__ import annotations

import sympy

from .dim_algebra import _ax, _n, _vals, broadcast, rule_registry
from .shapes_spatial import SPATIAL_RULES

INT_BIG = 2**31 - 1  # Slice ends at or past this mean "to the end"

SHAPE_RULES, _rule = rule_registry()


# --------------------------------------------------------------------------- #
# elementwise
# --------------------------------------------------------------------------- #
_UNARY = """Identity Cast CastLike Neg Abs Exp Log Sqrt Reciprocal Sin Cos Tan Tanh Sigmoid Erf
Relu Gelu Softplus Softsign Not IsNaN IsInf Floor Ceil Round Sign Softmax LogSoftmax Hardmax
HardSigmoid HardSwish Elu LeakyRelu Selu Celu Mish ThresholdedRelu Clip Trilu CumSum
Atan Asin Acos Sinh Cosh Asinh Acosh Atanh BitwiseNot Shrink QuantizeLinear DequantizeLinear
RotaryEmbedding""".split()


@_rule(*_UNARY)
def _unary(attrs, shapes, values, n_out):
    return [shapes[0]]


@_rule("Dropout")
def _dropout(attrs, shapes, values, n_out):
    return [shapes[0]] * n_out


_BINARY = """Add Sub Mul Div Pow Mod Max Min Sum Mean Equal Less LessOrEqual Greater GreaterOrEqual
And Or Xor BitwiseAnd BitwiseOr BitwiseXor BitShift PRelu Where""".split()


@_rule(*_BINARY)
def _broadcast(attrs, shapes, values, n_out):
    return [broadcast(*shapes)]


@_rule("LayerNormalization", "RMSNormalization", "SimplifiedLayerNormalization")
def _norm(attrs, shapes, values, n_out):
    x = shapes[0]
    if x is None:
        return [None] * n_out
    axis = _ax(attrs.get("axis", -1), len(x))
    stat = x[:axis] + [sympy.Integer(1)] * (len(x) - axis)
    return [x] + [stat] * (n_out - 1)


# --------------------------------------------------------------------------- #
# shape-moving ops
# --------------------------------------------------------------------------- #
@_rule("Shape")
def _shape(attrs, shapes, values, n_out):
    if shapes[0] is None:
        return [None]
    rank = len(shapes[0])
    start, end = attrs.get("start", 0), attrs.get("end", rank)
    start, end = (min(max(_ax(v, rank), 0), rank) for v in (start, end))
    return [[sympy.Integer(max(end - start, 0))]]


@_rule("Size")
def _size(attrs, shapes, values, n_out):
    return [[]]


@_rule("Transpose")
def _transpose(attrs, shapes, values, n_out):
    x = shapes[0]
    if x is None:
        return [None]
    perm = attrs.get("perm") or list(reversed(range(len(x))))
    return [[x[p] for p in perm]]


@_rule("Unsqueeze")
def _unsqueeze(attrs, shapes, values, n_out):
    axes = attrs.get("axes") or [_n(e) for e in (_vals(values[1]) or [None])]
    if shapes[0] is None or None in axes:
        return [None]
    rank = len(shapes[0]) + len(axes)
    axes = sorted(_ax(a, rank) for a in axes)
    it = iter(shapes[0])
    return [[sympy.Integer(1) if i in axes else next(it) for i in range(rank)]]


@_rule("Squeeze")
def _squeeze(attrs, shapes, values, n_out):
    x = shapes[0]
    if x is None:
        return [None]
    axes = attrs.get("axes")
    if axes is None and len(values) > 1 and values[1] is not None:
        axes = [_n(e) for e in _vals(values[1])]
    if axes is None:
        if any(d is None or not d.is_number for d in x):
            return [None]
        return [[d for d in x if int(d) != 1]]
    if None in axes:
        return [None]
    axes = {_ax(a, len(x)) for a in axes}
    return [[d for i, d in enumerate(x) if i not in axes]]


@_rule("Flatten")
def _flatten(attrs, shapes, values, n_out):
    x = shapes[0]
    if x is None or None in x:
        return [None]
    axis = _ax(attrs.get("axis", 1), len(x))
    return [[sympy.Mul(*x[:axis]), sympy.Mul(*x[axis:])]]


@_rule("Reshape")
def _reshape(attrs, shapes, values, n_out):
    target = _vals(values[1])
    if target is None:
        return [[None] * shapes[1][0] if shapes[1] and _n(shapes[1][0]) is not None else None]
    x = shapes[0]
    out = []
    for i, d in enumerate(target):
        if _n(d) == 0 and not attrs.get("allowzero", 0):
            d = x[i] if x is not None and i < len(x) else None
        out.append(d)
    if any(_n(d) == -1 for d in out):
        k = next(i for i, d in enumerate(out) if _n(d) == -1)
        rest = [d for i, d in enumerate(out) if i != k]
        if x is None or None in x or None in rest:
            out[k] = None
        else:
            out[k] = sympy.cancel(sympy.Mul(*x) / sympy.Mul(*rest))
    return [out]


@_rule("Concat")
def _concat(attrs, shapes, values, n_out):
    if any(s is None for s in shapes):
        return [None]
    axis = _ax(attrs.get("axis", 0), len(shapes[0]))
    out = list(shapes[0])
    out[axis] = None if any(s[axis] is None for s in shapes) else sympy.Add(*[s[axis] for s in shapes])
    for i in range(len(out)):
        if i != axis:
            out[i] = next((s[i] for s in shapes if s[i] is not None), None)
    return [out]


@_rule("Split")
def _split(attrs, shapes, values, n_out):
    x = shapes[0]
    if x is None:
        return [None] * n_out
    axis = _ax(attrs.get("axis", 0), len(x))
    sizes = attrs.get("split") or (_vals(values[1]) if len(values) > 1 and values[1] is not None else None)
    if sizes is None:
        if x[axis] is None:
            return [None] * n_out
        n = attrs.get("num_outputs", n_out)
        part = sympy.ceiling(x[axis] / n)
        sizes = [part] * (n - 1) + [x[axis] - part * (n - 1)]
    res = []
    for s in sizes:
        shape = list(x)
        shape[axis] = sympy.sympify(s)
        res.append(shape)
    return res


def slice_dim(dim, start, end, step):
    """Length of dim[start:end:step] under ONNX Slice clamping, or None.

    With a symbolic dim, a constant bound is clamped exactly: ``x[-k:]`` of a past length
    that may be shorter than k starts at ``Max(0, past - k)`` (a sliding window's cache),
    ``x[:k]`` ends at ``Min(k, dim)``; what the dims' lows decide, ``bounds.under`` drops
    later. A symbolic bound is clamped only where the comparison is decided for every
    value of the symbols; otherwise it is taken as in range (as torch.export assumes of
    the sizes it traced: a length sliced at k is at least k)."""
    if step is None or dim is None or not step.is_number or int(step) == 0:
        return None
    step = int(step)
    if dim.is_number and start.is_number and end.is_number:
        lo, hi = max(int(start), -INT_BIG), max(min(int(end), INT_BIG), -INT_BIG - 1)
        return sympy.Integer(len(range(int(dim))[lo:hi:step]))
    if step < 0:
        return None

    def norm(v):
        if v.is_number and int(v) >= INT_BIG:
            return dim
        if v.is_number and not dim.is_number:
            return sympy.Max(0, dim + v) if int(v) < 0 else sympy.Min(v, dim)
        v = dim + v if v.is_number and int(v) < 0 else v
        over = sympy.expand(v - dim)
        return dim if over.is_number and int(over) >= 0 else v

    return sympy.expand(sympy.ceiling((norm(end) - norm(start)) / step))


@_rule("Slice")
def _slice(attrs, shapes, values, n_out):
    x = shapes[0]
    starts, ends = _vals(values[1]), _vals(values[2])
    if x is None or starts is None or ends is None:
        return [None]
    axes = _vals(values[3]) if len(values) > 3 and values[3] is not None else list(range(len(starts)))
    steps = _vals(values[4]) if len(values) > 4 and values[4] is not None else [1] * len(starts)
    out = list(x)
    for s, e, a, st in zip(starts, ends, axes, steps):
        if _n(a) is None:
            return [None]
        a = _ax(_n(a), len(x))
        out[a] = slice_dim(x[a], sympy.sympify(s), sympy.sympify(e), sympy.sympify(st))
    return [out]


@_rule("Gather")
def _gather(attrs, shapes, values, n_out):
    x, idx = shapes[0], shapes[1]
    if x is None or idx is None:
        return [None]
    axis = _ax(attrs.get("axis", 0), len(x))
    return [x[:axis] + idx + x[axis + 1:]]


@_rule("GatherElements")
def _gather_elements(attrs, shapes, values, n_out):
    return [shapes[1]]


@_rule("GatherND")
def _gather_nd(attrs, shapes, values, n_out):
    x, idx = shapes[0], shapes[1]
    if x is None or idx is None or idx[-1] is None or not idx[-1].is_number:
        return [None]
    b = attrs.get("batch_dims", 0)
    return [idx[:-1] + x[b + int(idx[-1]):]]


@_rule("ScatterND", "ScatterElements")
def _scatter(attrs, shapes, values, n_out):
    return [shapes[0]]


@_rule("Expand")
def _expand(attrs, shapes, values, n_out):
    target = _vals(values[1])
    if target is None:
        return [None]
    return [broadcast(shapes[0], [sympy.sympify(d) for d in target])]


@_rule("ConstantOfShape")
def _constant_of_shape(attrs, shapes, values, n_out):
    target = _vals(values[0])
    return [None if target is None else [sympy.sympify(d) for d in target]]


@_rule("Range")
def _range(attrs, shapes, values, n_out):
    v = [_vals(x) for x in values[:3]]
    if any(x is None for x in v):
        return [[None]]
    start, limit, delta = (sympy.nsimplify(x[0], rational=True) for x in v)
    return [[sympy.expand(sympy.ceiling((limit - start) / delta))]]  # taken as >= 0


@_rule("Tile")
def _tile(attrs, shapes, values, n_out):
    reps = _vals(values[1])
    if shapes[0] is None or reps is None:
        return [None]
    return [[None if d is None else d * r for d, r in zip(shapes[0], reps)]]


@_rule("Pad")
def _pad(attrs, shapes, values, n_out):
    x = shapes[0]
    pads = attrs.get("pads") or _vals(values[1] if len(values) > 1 else None)
    if x is None or pads is None:
        return [None]
    axes = _vals(values[3]) if len(values) > 3 and values[3] is not None else list(range(len(x)))
    out = list(x)
    n = len(axes)
    for k, a in enumerate(axes):
        a = _ax(int(a), len(x))
        out[a] = None if x[a] is None else x[a] + pads[k] + pads[k + n]
    return [out]


@_rule("MatMul")
def _matmul(attrs, shapes, values, n_out):
    a, b = shapes
    if a is None or b is None:
        return [None]
    a2, b2 = (a if len(a) > 1 else [sympy.Integer(1)] + a), (b if len(b) > 1 else b + [sympy.Integer(1)])
    batch = broadcast(a2[:-2], b2[:-2])
    if batch is None:
        return [None]
    out = batch + ([a2[-2]] if len(a) > 1 else []) + ([b2[-1]] if len(b) > 1 else [])
    return [out]


@_rule("Gemm")
def _gemm(attrs, shapes, values, n_out):
    a, b = shapes[0], shapes[1]
    if a is None or b is None:
        return [None]
    m = a[1] if attrs.get("transA", 0) else a[0]
    n = b[0] if attrs.get("transB", 0) else b[1]
    return [[m, n]]


@_rule("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2",
       "ReduceLogSumExp", "ReduceSumSquare", "ArgMax", "ArgMin")
def _reduce(attrs, shapes, values, n_out):
    x = shapes[0]
    if x is None:
        return [None]
    if "axis" in attrs or attrs.get("axes") is not None:
        axes = [attrs["axis"]] if "axis" in attrs else attrs["axes"]
    elif len(values) > 1 and values[1] is not None:
        axes = [_n(e) for e in _vals(values[1])]
    else:
        axes = list(range(len(x))) if not attrs.get("noop_with_empty_axes", 0) else []
    if any(a is None for a in axes):
        return [None]
    axes = {_ax(a, len(x)) for a in axes}
    keep = attrs.get("keepdims", 1)
    return [[sympy.Integer(1) if i in axes else d for i, d in enumerate(x) if keep or i not in axes]]


@_rule("Attention")
def _attention(attrs, shapes, values, n_out):
    q, k, v = shapes[0], shapes[1], shapes[2]
    past = shapes[4] if len(shapes) > 4 else None
    if q is None or k is None or v is None:
        return [None] * n_out
    if len(q) == 3:  # (B, S, hidden): heads from the attributes
        hv = attrs.get("kv_num_heads", 0)
        out = [q[0], q[1], None if not hv or v[2] is None else v[2] / hv * attrs.get("q_num_heads", 0)]
        return [out] + [None] * (n_out - 1)
    out = [q[0], q[1], q[2], v[3]]
    total = k[2] if past is None or past[2] is None or k[2] is None else past[2] + k[2]
    present_k = [k[0], k[1], total, k[3]]
    present_v = [v[0], v[1], total, v[3]]
    return [out, present_k, present_v][:n_out] + [None] * max(n_out - 3, 0)


# image ops (a patch stem's Conv, pools, Resize): shapes_spatial.py
SHAPE_RULES.update(SPATIAL_RULES)
