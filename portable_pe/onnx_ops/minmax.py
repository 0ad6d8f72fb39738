"""Max/Min of dim values (PrimValues) as one PrimValue, the way TVM 0.27 keeps Add/Sub/Mul/Div.

TVM's Max/Min converters broadcast tensors and read each input's ``.shape``; a dim value
(``Shape -> Gather`` of an input's dims, a PrimValue) has none ("'PrimType' object has no
attribute 'shape'"). A bound that depends on two dims, such as a sliding window's offset
``max(0, past + T - W)``, cannot be decided for every input, so legalize writes it as a
Max of dim values (``legalize.dimexpr``): here it becomes ``tirx.max``, and the shapes it
feeds stay symbolic. Tensor inputs go to TVM's own converters."""

from __future__ import annotations

import functools

import tvm
from tvm import relax, tirx
from tvm.relax.frontend.onnx import onnx_frontend as _fe


def _scalar(expr):
    """expr as a PrimExpr (a dim value, or a one-element integer constant), else None."""
    if tvm.ir.is_prim_expr(expr):
        return expr
    if isinstance(expr, tvm.ir.GenericConst):
        data = expr.value.numpy()
        if data.size == 1 and data.dtype.kind in "iu":
            return tirx.const(int(data.item()), str(data.dtype))
    return None


def _fold(fn, inputs):
    scalars = [_scalar(x) for x in inputs]
    if any(tvm.ir.is_prim_expr(x) for x in inputs) and all(s is not None for s in scalars):
        return relax.prim_value(functools.reduce(fn, scalars))
    return None


class Max(_fe.Max):
    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        folded = _fold(tirx.max, inputs)
        return folded if folded is not None else super()._impl_v1(bb, inputs, attr, params)


class Min(_fe.Min):
    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        folded = _fold(tirx.min, inputs)
        return folded if folded is not None else super()._impl_v1(bb, inputs, attr, params)
