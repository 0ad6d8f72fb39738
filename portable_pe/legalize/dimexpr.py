"""Emit a symbolic dim expression (sympy, over the graph inputs' dims) as ONNX nodes that
TVM's Relax importer turns back into the same expression.

The importer keeps a dim symbolic only along a few paths: ``Shape`` of a tensor gives a
``ShapeExpr``; ``Gather`` of one element of it a ``PrimValue``; ``Add``/``Sub``/``Mul``/
``Div`` of PrimValues and constants stay PrimValues (``T + 1``, ``(T + 3) // 4``);
``Unsqueeze`` of a PrimValue and ``Concat`` of those pieces give a ``ShapeExpr`` again,
which Reshape, Expand, ConstantOfShape, Tile and Slice take as it is. So any dim
expression is written as

    Shape(input) -> Gather(axis)  per symbol        (PrimValue T)
    Add / Mul / Div / Mod chains                     (PrimValue 2 * T + 1)
    Unsqueeze(0) -> Concat                           (ShapeExpr [B, 2 * T + 1, 8])

and, where a plain tensor is wanted (a Range offset, a position compared with an
index), ``Cast`` of that ShapeExpr (the importer's ``shape_to_tensor``). Every node is
standard ONNX, so onnxruntime runs the rewritten graph as it ran the original.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import sympy
from onnx import helper


class NotExpressible(ValueError):
    """A dim expression with no importer-friendly form (a symbol not from an input,
    a non-integer coefficient)."""


class DimEmitter:
    """Writes dim programs into ``rw.prefix`` (they depend on graph inputs only).

    ``rw`` supplies ``fresh(base)``, ``const(array)``, ``prefix`` (a node list),
    ``cache`` (a dict), ``sym.src`` (symbol -> (input name, axis)) and ``sym.quotients``
    (q -> (dim, m, patch): a dim known to be m * q, written back in the dim, ``_in_dims``).
    """

    def __init__(self, rw):
        self.rw = rw

    # ------------------------------------------------------------------ helpers
    def _node(self, op, inputs, key=None, **attrs) -> str:
        if key is not None and key in self.rw.cache:
            return self.rw.cache[key]
        name = self.rw.fresh(op.lower())
        self.rw.prefix.append(helper.make_node(op, inputs, [name], name=name, **attrs))
        if key is not None:
            self.rw.cache[key] = name
        return name

    def _in_dims(self, e):
        """e with each quotient symbol q (a dim H known to be m * q) written back in the patch
        grid G = floor(H / p), the dim TVM's conv shape rule gives for a stem of stride p:
        q = G * p / m exactly, so Swin's 16 * q_h * q_w (m = 16, p = 4) is G_h * G_w, 2 * q_h
        is G_h / 2 (TVM: H // 8), and a ViT's q_h * q_w (m = p = 8) is floor(H/8) * floor(W/8);
        H * W // 64 would be the same number in a form TVM cannot match with those.

        Where the image is restated as m * floor(H / m) ahead of its consumers (``sym.pinned``,
        ``_Rewriter.pin_multiples``), q is floor(H / m): every shape TVM derives (the stem's
        grid, a window count, a -1 in a reshape) is then a polynomial in floor(H / m) too, and
        TVM's simplifier sees a foreign Swin's tokens equal to its windows times their area,
        which in H alone (H // 4 * (W // 4) against H // 8 * (W // 8) * 4) are equal only for
        multiples of 8."""
        e = sympy.sympify(e)
        quotients = self.rw.sym.quotients
        if not (quotients and e.free_symbols & set(quotients)):
            return e
        if self.rw.sym.pinned:
            form = {q: sympy.floor(dim / m) for q, (dim, m, _) in quotients.items()}
        else:
            form = {q: sympy.floor(dim / p) * sympy.Rational(p, m) for q, (dim, m, p) in quotients.items()}
        return sympy.expand(e.subs(form))

    def expressible(self, e) -> bool:
        e = self._in_dims(e)
        return all(s in self.rw.sym.src for s in e.free_symbols)

    # ------------------------------------------------------------------ scalars
    def scalar(self, e) -> str:
        """A 0-d int64 tensor holding e (the importer sees a PrimValue)."""
        e = self._in_dims(e)
        key = ("scalar", e)
        if key in self.rw.cache:
            return self.rw.cache[key]
        if e.is_Integer:
            name = self.rw.const(np.array(int(e), np.int64))
        elif e.is_Symbol:
            if e not in self.rw.sym.src:
                raise NotExpressible(f"{e} is not a dim of a graph input")
            src, axis = self.rw.sym.src[e]
            shape = self._node("Shape", [src], key=("shape_of", src))
            name = self._node("Gather", [shape, self.rw.const(np.array(axis, np.int64))], axis=0)
        elif e.is_Add:
            name = self._chain("Add", e.as_ordered_terms())
        elif e.is_Mul:
            coeff, rest = e.as_coeff_Mul()
            if not coeff.is_Integer:
                return self._floor_div(e, exact=True)
            factors = ([coeff] if coeff != 1 else []) + list(sympy.Mul.make_args(rest))
            name = self._chain("Mul", factors)
        elif e.is_Pow and e.exp.is_Integer and int(e.exp) > 0:
            name = self._chain("Mul", [e.base] * int(e.exp))
        elif isinstance(e, sympy.floor):
            name = self._floor_div(e.args[0])
        elif isinstance(e, sympy.ceiling):
            num, den = _fraction(e.args[0])
            name = self._floor_div((num + den - 1) / den)
        elif isinstance(e, sympy.Mod):
            name = self._node("Mod", [self.scalar(e.args[0]), self.scalar(e.args[1])])
        elif isinstance(e, (sympy.Max, sympy.Min)):
            name = self._chain("Max" if isinstance(e, sympy.Max) else "Min", list(e.args))
        else:
            raise NotExpressible(f"no dim program for {e}")
        self.rw.cache[key] = name
        return name

    def _chain(self, op, terms) -> str:
        names = [self.scalar(t) for t in terms]
        acc = names[0]
        for name in names[1:]:
            acc = self._node(op, [acc, name])
        return acc

    def _floor_div(self, e, exact=False) -> str:
        """floor(num / den) with den a positive integer; ONNX's integer Div truncates,
        which is the floor where num >= 0 (and exact where den divides num)."""
        num, den = _fraction(e)
        if not (den.is_Integer and int(den) > 0):
            raise NotExpressible(f"no integer dim program for {e}")
        num, den = self._divided_into_grids(num, den)
        if den == 1:
            return self.scalar(num)
        if isinstance(num, sympy.floor) and _fraction(num.args[0])[1].is_Integer:
            # floor(floor(x / d) / k) = floor(x / (d k)) for integers: one Div, the form TVM's
            # simplifier gives the result (H // 24, where H // 8 // 3 would leave two forms of
            # one dim, which FuseTIR refuses: a patch grid cut into windows of 3 patches)
            inner, d = _fraction(num.args[0])
            return self._floor_div(inner / (d * den))
        num_name = self.scalar(num)
        if not (exact or num.is_nonnegative):  # floor for any sign: (num - num mod den) / den
            num_name = self._node("Sub", [num_name, self._node("Mod", [num_name, self.scalar(den)])])
        return self._node("Div", [num_name, self.scalar(den)])

    def _divided_into_grids(self, num, den):
        """(num', den') with num / den = num' / den': den's factors moved into the factors of
        num known to be multiples of them. floor(H / 8) with H a multiple of 24 is 3 *
        floor(H / 24), so Swin's window count floor(H/8) * floor(W/8) / 9 is written
        floor(H/24) * floor(W/24), the form TVM gives the windows a graph gathers with an
        index of that shape; (H // 8 * (W // 8)) // 9 is the same number in a form TVM cannot
        tell equal to it."""
        multiple = {dim: m for dim, m, _ in self.rw.sym.quotients.values()}
        left, factors = int(den), []
        for f in sympy.Mul.make_args(num):
            if multiple and left > 1 and isinstance(f, sympy.floor):
                x, d = _fraction(f.args[0])
                if x in multiple and d.is_Integer and multiple[x] % int(d) == 0:
                    g = math.gcd(left, multiple[x] // int(d))
                    f, left = sympy.floor(x / (int(d) * g)), left // g
            factors.append(f)
        return (sympy.Mul(*factors), sympy.Integer(left)) if left != int(den) else (num, den)

    # ------------------------------------------------------------------ shapes
    def vector(self, dims) -> str:
        """A 1-D int64 tensor [len(dims)]; the importer sees a ShapeExpr of these dims."""
        dims = [self._in_dims(d) for d in dims]
        key = ("vector", tuple(dims))
        if key in self.rw.cache:
            return self.rw.cache[key]
        pieces = [self._piece(d) for d in dims]
        # consecutive constants travel as one initializer
        merged, run = [], []
        for d, p in zip(dims, pieces):
            if d.is_Integer:
                run.append(int(d))
                continue
            if run:
                merged.append(self.rw.const(np.array(run, np.int64)))
                run = []
            merged.append(p)
        if run:
            merged.append(self.rw.const(np.array(run, np.int64)))
        name = merged[0] if len(merged) == 1 and not all(d.is_Integer for d in dims) else \
            self._node("Concat", merged, axis=0)
        self.rw.cache[key] = name
        return name

    def _piece(self, d) -> str | None:
        if d.is_Integer:
            return None
        if d.is_Symbol and d in self.rw.sym.src:  # Shape(start, end): a one-dim ShapeExpr
            src, axis = self.rw.sym.src[d]
            return self._node("Shape", [src], key=("dim", src, axis), start=axis, end=axis + 1)
        return self._node("Unsqueeze", [self.scalar(d), self.rw.const(np.array([0], np.int64))])

    def unsimplified(self, value, total) -> str:
        """[value] as the one-dim ShapeExpr ``total - (total - value)``: the same number, in a
        form TVM's importer keeps symbolic (a slice bound it then takes as in range)."""
        diff = self._node("Sub", [self.scalar(total), self.scalar(sympy.expand(total - value))])
        return self._node("Unsqueeze", [diff, self.rw.const(np.array([0], np.int64))])

    # ------------------------------------------------------------------ tensors
    def tensor(self, values: np.ndarray, elem: int) -> str:
        """A data tensor of ONNX type ``elem`` holding the symbolic ``values``."""
        values = np.asarray(values, dtype=object)
        flat = [sympy.sympify(v) for v in values.ravel()]
        if not all(v.is_integer or (sympy.nsimplify(v, rational=True).is_integer) for v in flat):
            raise NotExpressible(f"non-integer symbolic values {flat}")
        flat = [sympy.nsimplify(v, rational=True) for v in flat]
        as_int = self._node("Cast", [self.vector(flat)], key=("int_tensor", tuple(flat)),
                            to=onnx.TensorProto.INT64)
        shaped = as_int if values.ndim == 1 else self._node(
            "Reshape", [as_int, self.rw.const(np.array(values.shape, np.int64))],
            key=("reshaped", tuple(flat), values.shape))
        if elem == onnx.TensorProto.INT64:
            return shaped
        return self._node("Cast", [shaped], key=("cast", tuple(flat), values.shape, elem), to=elem)


def _fraction(e):
    num, den = sympy.fraction(sympy.together(sympy.sympify(e)))
    return sympy.expand(num), den
