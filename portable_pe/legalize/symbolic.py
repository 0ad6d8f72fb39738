"""Symbolic evaluation of a graph's small integer/shape computations.

``_Sym`` evaluates every small tensor value with sympy, the dims of the graph
inputs as integer symbols (``dims``: positive, a KV cache's past length nonnegative),
and records which input axis each symbol comes from.

A dim known to be a multiple of m (an image side in whole patches: ``multiples``) is
written ``m * q`` with q a positive integer symbol (``quotients[q]`` = (dim, m, patch)), so
that sympy decides what the multiple implies: Swin's window padding
``(2 - (H // 4) % 2) % 2`` is 0 when H is a multiple of 16, and the Pad's pads become
the constant 0.
"""

from __future__ import annotations

import numpy as np
import onnx
import sympy
from onnx import helper, numpy_helper

from .bounds import bound_from_attention, bound_from_broadcast, nonnegative, under
from .dims import _dims, _past_dims
from .shapes import _BINARY, SHAPE_RULES

_BROADCASTING = set(_BINARY)


def _sign_test(test):
    """A comparison of p - q with 0, decided only where the difference is a number (a rank
    against a constant, as in the If a TorchScript export writes for a broadcast)."""
    return lambda d: bool(test(d)) if sympy.sympify(d).is_number else None


_COMPARISONS = {"Equal": None, "Greater": _sign_test(lambda d: d > 0), "Less": _sign_test(lambda d: d < 0),
                "GreaterOrEqual": _sign_test(lambda d: d >= 0), "LessOrEqual": _sign_test(lambda d: d <= 0)}
_MAX_ELEMS = 64  # only small tensors are evaluated symbolically


# --------------------------------------------------------------------------- #
# symbolic values
# --------------------------------------------------------------------------- #
class _Sym:
    """Symbolic evaluation state for one graph."""

    def __init__(self, graph: onnx.GraphProto, multiples: dict[str, int | tuple[int, int]] | None = None,
                 *, pinned: bool = False):
        self.graph = graph
        #: the image inputs are restated in whole multiples (legalize's pin_multiples): dim
        #: programs are written in H // m, not in the patch grid (dimexpr.DimEmitter._in_dims)
        self.pinned = pinned
        self.val: dict[str, np.ndarray] = {}  # object arrays of sympy exprs
        self.isint: dict[str, bool] = {}
        self.shape: dict[str, list | None] = {}
        self.elem: dict[str, int] = {}
        self.src: dict[sympy.Symbol, tuple[str, int]] = {}  # symbol -> (graph input, axis)
        # q -> (dim, m, patch) for a dim written m * q (``multiples``); dim programs are
        # written back in the dim's patch grid (dimexpr.DimEmitter._in_dims)
        self.quotients: dict[sympy.Symbol, tuple[sympy.Symbol, int, int]] = {}
        # a dim or a sum of dims -> the largest value the graph runs at (``bounds``)
        self.bounds: dict[sympy.Expr, int] = {}

        past = _past_dims(graph)
        for vi in list(graph.input) + list(graph.value_info) + list(graph.output):
            t = vi.type.tensor_type
            if vi.type.HasField("tensor_type"):
                self.elem[vi.name] = t.elem_type
                self.shape[vi.name] = _dims(t, past) if t.HasField("shape") else None
        init_names = {i.name for i in graph.initializer}
        for vi in graph.input:
            if vi.name in init_names:
                continue
            for ax, d in enumerate(self.shape.get(vi.name) or []):
                if isinstance(d, sympy.Symbol) and d not in self.src:
                    self.src[d] = (vi.name, ax)
        for name, m in (multiples or {}).items():
            m, patch = m if isinstance(m, tuple) else (m, m)
            self._as_multiple(sympy.Symbol(name, integer=True, positive=True), m, patch)
        for init in graph.initializer:
            arr = numpy_helper.to_array(init)
            self.elem[init.name] = init.data_type
            self.shape[init.name] = [sympy.Integer(d) for d in arr.shape]
            self._set_const(init.name, arr)

    def _set_const(self, name, arr):
        arr = np.asarray(arr)
        if arr.size <= _MAX_ELEMS and (
            np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)
        ):
            isint = bool(np.issubdtype(arr.dtype, np.integer))
            conv = (lambda v: sympy.Integer(int(v))) if isint else (lambda v: sympy.Float(float(v)))
            self.val[name] = np.vectorize(conv, otypes=[object])(arr) if arr.size else arr.astype(object)
            self.isint[name] = isint

    def run(self):
        # a bound learned at a broadcast decides Min/Max in values computed before it
        # (MPT's slice start): evaluate again until no new bound turns up
        for _ in range(4):
            known = dict(self.bounds)
            for node in self.graph.node:
                try:
                    self._eval(node)
                except Exception:  # pylint: disable=broad-except
                    pass  # value unknown: the node is left as it is
                self._infer_shapes(node)
            if self.bounds == known:
                break

    def _as_multiple(self, dim: sympy.Symbol, m: int, patch: int) -> None:
        """Write the input dim `dim` as m * q in every shape (see the module's docstring)."""
        if dim not in self.src or m <= 1:
            return
        q = sympy.Symbol(f"{dim.name}_over_{m}", integer=True, positive=True)
        self.quotients[q] = (dim, m, patch)
        for name, shape in self.shape.items():
            if shape:
                self.shape[name] = [d.subs(dim, m * q) if isinstance(d, sympy.Expr) else d for d in shape]

    def followed(self, dim) -> bool:
        """dim is an expression of the graph inputs' dims (not unknown, no placeholder)."""
        return dim is not None and all(s in self.src or s in self.quotients for s in sympy.sympify(dim).free_symbols)

    def _infer_shapes(self, node: onnx.NodeProto):
        """Output shapes from SHAPE_RULES, where they say more than ONNX's own inference."""
        rule = SHAPE_RULES.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        outs = [o for o in node.output]
        if rule is None or all(o in self.val for o in outs if o):
            return
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        shapes = [self.shape.get(i) if i else None for i in node.input]
        values = [self.val.get(i) if i else None for i in node.input]
        if node.op_type == "Attention":
            self._attention_bound(shapes)
        try:
            found = rule(attrs, shapes, values, len(outs))
            if node.op_type in _BROADCASTING and found[0] is not None and None in found[0] \
                    and self._learn_bound(shapes):
                shapes = [None if x is None else [None if d is None else under(d, self.bounds) for d in x]
                          for x in shapes]
                found = rule(attrs, shapes, values, len(outs))
        except Exception:  # pylint: disable=broad-except
            return  # a rule that cannot decide leaves ONNX's inferred shape
        for name, shape in zip(outs, found):
            if not name or shape is None or name in self.val:
                continue
            old = self.shape.get(name)
            if old is not None and len(old) == len(shape):
                shape = [d if self.followed(d) or o is None else o for d, o in zip(shape, old)]
            self.shape[name] = [None if d is None else under(sympy.sympify(d), self.bounds) for d in shape]

    def _learn_bound(self, shapes) -> bool:
        """A dim bound from two dims broadcast against each other (``bounds``); True if new."""
        if any(x is None for x in shapes):
            return False
        rank, new = max(len(x) for x in shapes), False
        for i in range(1, rank + 1):
            dims = [x[-i] for x in shapes if len(x) >= i and x[-i] is not None]
            for a in dims:
                for b in dims:
                    new |= self._tighten(bound_from_broadcast(a, b))
        return new

    def _tighten(self, found) -> bool:
        """Record bound (f, U) unless f already has one at most U; True if it is new."""
        if not found or found[1] >= self.bounds.get(found[0], found[1] + 1):
            return False
        self.bounds[found[0]] = found[1]
        return True

    def _attention_bound(self, shapes) -> None:
        """Attention (q, k, v, mask, past_k): the mask's last axis is the keys' length; a
        sliding window's cache makes them agree only up to a bound, as a broadcast would."""
        k, mask = shapes[1], shapes[3] if len(shapes) > 3 else None
        past = shapes[4] if len(shapes) > 4 else None
        if k is None or mask is None or len(k) != 4 or k[2] is None or mask[-1] is None:
            return
        total = k[2] if past is None else (None if past[2] is None else past[2] + k[2])
        if total is not None:
            self._tighten(bound_from_attention(mask[-1], total))

    # one node -------------------------------------------------------------
    def _eval(self, node: onnx.NodeProto):
        op, ins, outs = node.op_type, list(node.input), list(node.output)
        if node.domain not in ("", "ai.onnx"):
            return
        a = {x.name: helper.get_attribute_value(x) for x in node.attribute}
        v = [self.val.get(i) if i else None for i in ins]
        out = None
        isint = self.isint.get(ins[0]) if ins else True

        if op == "Constant":
            if "value" in a:
                arr = numpy_helper.to_array(a["value"])
            elif "value_int" in a:
                arr = np.array(a["value_int"], np.int64)
            elif "value_ints" in a:
                arr = np.array(a["value_ints"], np.int64)
            elif "value_float" in a:
                arr = np.array(a["value_float"], np.float32)
            else:
                return
            self.shape[outs[0]] = [sympy.Integer(d) for d in arr.shape]
            self._set_const(outs[0], arr)
            return
        if op == "Shape":
            shp = self.shape.get(ins[0])
            if shp is None:
                return
            # unknown dims become fresh placeholders: picking a known dim still works
            shp = [sympy.Dummy("unk", integer=True, positive=True) if d is None else d for d in shp]
            start, end = a.get("start", 0), a.get("end", None)
            out, isint = _arr(shp[start:end]), True
        elif op == "Size":
            shp = self.shape.get(ins[0])
            if shp is None or any(d is None for d in shp):
                return
            out, isint = np.array(sympy.Mul(*shp), dtype=object), True
        elif any(x is None for x, i in zip(v, ins) if i) and op != "Range":
            return
        elif op in ("Identity", "Cast", "CastLike"):
            out = v[0]
            to = a.get("to") if op == "Cast" else self.elem.get(ins[1])
            if to is not None:
                isint = _is_int_elem(to)
                if isint and not self.isint.get(ins[0], True):
                    out = _vmap(lambda e: sympy.Integer(int(e)) if e.is_number else e, out)
                elif not isint:
                    out = _vmap(lambda e: sympy.Float(float(e)) if e.is_number else e, out)
        elif op == "Gather":
            out = np.take(v[0], v[1].astype(np.int64), axis=a.get("axis", 0))
        elif op == "Slice":
            data = v[0]
            starts, ends = _ints(v[1]), _ints(v[2])
            axes = _ints(v[3]) if len(v) > 3 and v[3] is not None else list(range(len(starts)))
            steps = _ints(v[4]) if len(v) > 4 and v[4] is not None else [1] * len(starts)
            sl = [slice(None)] * data.ndim
            for s, e, ax, st in zip(starts, ends, axes, steps):
                sl[ax] = slice(s, e, st)
            out = data[tuple(sl)]
        elif op == "Concat":
            out = np.concatenate([x for x in v], axis=a.get("axis", 0))
        elif op in ("Unsqueeze", "Squeeze"):
            axes = a.get("axes") or (_ints(v[1]) if len(v) > 1 and v[1] is not None else None)
            if op == "Unsqueeze":
                out = v[0]
                rank = out.ndim + len(axes)
                for ax in sorted(x % rank for x in axes):
                    out = np.expand_dims(out, ax)
            else:
                out = np.squeeze(v[0], axis=tuple(axes) if axes is not None else None)
        elif op == "Reshape":
            shp = [int(x) for x in _ints(v[1])]
            shp = [v[0].shape[i] if d == 0 else d for i, d in enumerate(shp)]
            out = v[0].reshape(shp)
        elif op == "Transpose":  # Swin's pads: [[0, 0], [0, pad_w], ...] transposed to ONNX's order
            out = np.transpose(v[0], a.get("perm"))
        elif op in ("Add", "Sub", "Mul", "Div", "Mod", "Max", "Min", "Pow"):
            x, y = np.broadcast_arrays(v[0], v[1])
            fn = {
                "Add": lambda p, q: p + q,
                "Sub": lambda p, q: p - q,
                "Mul": lambda p, q: p * q,
                "Div": (lambda p, q: sympy.floor(p / q)) if isint else (lambda p, q: p / q),
                "Mod": lambda p, q: sympy.Mod(p, q),
                "Max": lambda p, q: sympy.Max(p, q),
                "Min": lambda p, q: sympy.Min(p, q),
                "Pow": lambda p, q: p**q,
            }[op]
            out = np.array([fn(p, q) for p, q in zip(x.ravel(), y.ravel())], dtype=object)
            out = out.reshape(x.shape)
        elif op in ("Neg", "Abs", "Floor", "Ceil", "Sqrt"):
            fn = {
                "Neg": lambda p: -p,
                "Abs": sympy.Abs,
                "Floor": sympy.floor,
                "Ceil": sympy.ceiling,
                "Sqrt": sympy.sqrt,
            }[op]
            out = _vmap(fn, v[0])
        elif op in _COMPARISONS:
            x, y = np.broadcast_arrays(v[0], v[1])
            res = []
            for p, q in zip(x.ravel(), y.ravel()):
                z = _is_zero(p - q) if op == "Equal" else _COMPARISONS[op](p - q)
                if z is None:
                    return
                res.append(sympy.Integer(int(z)))
            out, isint = np.array(res, dtype=object).reshape(x.shape), True
        elif op == "Where":
            c, x, y = np.broadcast_arrays(v[0], v[1], v[2])
            out = np.array(
                [p if bool(cc) else q for cc, p, q in zip(c.ravel(), x.ravel(), y.ravel())],
                dtype=object,
            ).reshape(c.shape)
            isint = self.isint.get(ins[1], True)
        elif op == "ConstantOfShape":
            dims = _ints(v[0])
            if int(np.prod(dims)) > _MAX_ELEMS:
                return
            fill = numpy_helper.to_array(a["value"]).ravel()[0] if "value" in a else np.float32(0)
            isint = bool(np.issubdtype(np.asarray(fill).dtype, np.integer))
            e = sympy.Integer(int(fill)) if isint else sympy.Float(float(fill))
            out = np.full([int(d) for d in dims], e, dtype=object)
        elif op == "Range":
            if any(x is None for x in v):
                return
            s, lim, d = (_rational(x.ravel()[0]) for x in v)
            if not (s.is_number and lim.is_number and d.is_number):
                n = sympy.ceiling((lim - s) / d)
                self.shape[outs[0]] = [sympy.simplify(n)]
                return
            n = max(int(np.ceil((float(lim) - float(s)) / float(d))), 0)
            if n > _MAX_ELEMS:
                return
            out = np.array([s + d * k for k in range(n)], dtype=object)
        else:
            return
        if out is None:
            return
        out = np.asarray(out, dtype=object)
        if out.size > _MAX_ELEMS:
            return
        out = _vmap(lambda e: under(sympy.simplify(e), self.bounds), out) if out.size else out
        self.val[outs[0]] = out
        self.isint[outs[0]] = bool(isint)
        self.shape[outs[0]] = [sympy.Integer(d) for d in out.shape]


def _is_zero(d):
    """d == 0 for every input (True), for none (False), or undecided (None); d >= 1 or
    d <= -1 settles it where d has a Min/Max (a sliding window's cache length)."""
    z = sympy.simplify(d).is_zero  # dims are positive symbols, past lengths nonnegative
    if z is None and (nonnegative(d - 1) or nonnegative(-d - 1)):
        return False
    return z


def _vmap(fn, arr):
    arr = np.asarray(arr, dtype=object)
    flat = [fn(x) for x in arr.ravel()]
    res = np.empty(len(flat), dtype=object)
    res[:] = flat
    return res.reshape(arr.shape)


def _rational(e):
    """Exact form of e: floats holding integers (from Cast to float) become Integers."""
    return sympy.nsimplify(e, rational=True)


def _arr(seq):
    res = np.empty(len(seq), dtype=object)
    res[:] = list(seq)
    return res


def _ints(arr) -> list[int]:
    res = []
    for e in np.asarray(arr, dtype=object).ravel():
        if not e.is_number:
            raise ValueError("symbolic")
        res.append(int(e))
    return res


def _is_int_elem(elem: int) -> bool:
    return elem in (
        onnx.TensorProto.INT64,
        onnx.TensorProto.INT32,
        onnx.TensorProto.INT16,
        onnx.TensorProto.INT8,
        onnx.TensorProto.UINT8,
        onnx.TensorProto.UINT16,
        onnx.TensorProto.UINT32,
        onnx.TensorProto.UINT64,
        onnx.TensorProto.BOOL,
    )
