"""Div of a dim value by a positive constant as floor division, the form TVM's own shape
inference writes.

TVM 0.27 imports an integer Div of PrimValues as ``truncdiv``; its conv2d and pooling
shape rules write the same quotient as ``floordiv`` (``H // 16``). In one graph the two
forms of one dim (a patch stem's output, and the reshape legalize rebuilt from ``H / 16``)
are not structurally equal, and FuseTIR refuses a kernel that sees both ("Inconsistent
buffers ... mapped to the same relax var"). For a numerator that cannot be negative the
two quotients are the same number, so a dim value over a positive constant imports as
``floordiv``; anything else keeps TVM's converter."""

from __future__ import annotations

import tvm
from tvm import relax, tirx
from tvm.relax.frontend.onnx import onnx_frontend as _fe

from .minmax import _scalar


def _nonnegative(expr) -> bool:
    """True when `expr` cannot be negative: dims (shape variables), non-negative constants,
    and sums, products, quotients, minima and maxima of those."""
    if isinstance(expr, tirx.IntImm):
        return expr.value >= 0
    if isinstance(expr, tirx.Var):
        return True  # a PrimValue variable of the import is a tensor dim
    if isinstance(expr, (tirx.Add, tirx.Mul, tirx.FloorDiv, tirx.Div, tirx.Min, tirx.Max)):
        return _nonnegative(expr.a) and _nonnegative(expr.b)
    return False


class Div(_fe.Div):
    @classmethod
    def _impl_v7(cls, bb, inputs, attr, params):
        if any(tvm.ir.is_prim_expr(x) for x in inputs):
            lhs, rhs = (_scalar(x) for x in inputs)
            if lhs is not None and isinstance(rhs, tirx.IntImm) and rhs.value > 0 and _nonnegative(lhs):
                return relax.prim_value(tirx.floordiv(lhs, rhs))
        return super()._impl_v7(bb, inputs, attr, params)
