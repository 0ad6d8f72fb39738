"""Gather with constant indices as a plain Relax take."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend as _fe

from .common import _c


class Gather(_fe.Gather):
    """TVM's Gather, without the run-time index normalization when the indices are
    constants.

    TVM 0.27 wraps every Gather's indices in ``where(indices < 0, indices + dim,
    indices)``, computed from ``shape_to_tensor(shape_of(data))``: scalar tensor ops
    even for a constant index. The interleaved RoPE pair split (``Gather(x, 0, axis=-1)``
    and ``Gather(x, 1, axis=-1)``) has 16 of them, and in a static-shape build
    ``FoldConstant`` compiled each step of each with LLVM: 2.6 s of the rope_interleaved
    compile. A constant index is normalized here, in numpy, when its axis is static or
    it is not negative; anything else goes to TVM's converter.

    A shape whose values are known only at run time (``Shape`` of a tensor of unknown
    shape, e.g. after a Pad by computed amounts: Swin's window padding) is a Relax shape
    value that TVM's Gather hands to ``shape_of`` ("shape_of expects a tensor input, but
    received R.Shape"); it is gathered from as the tensor of its values here."""

    @classmethod
    def _impl_v13(cls, bb, inputs, attr, params):
        data, indices = inputs[0], inputs[1]
        if isinstance(data.ty, relax.ShapeType) and not isinstance(data, relax.ShapeExpr):
            data = bb.normalize(relax.op.shape_to_tensor(data))
            return super()._impl_v13(bb, [data, *inputs[1:]], attr, params)
        if not isinstance(indices, tvm.ir.GenericConst) or isinstance(data, (relax.ShapeExpr, tvm.ir.GenericConst)):
            return super()._impl_v13(bb, inputs, attr, params)
        ty = data.ty
        if not isinstance(ty, relax.TensorType) or ty.ndim < 0:
            return super()._impl_v13(bb, inputs, attr, params)
        axis = attr.get("axis", 0)
        axis = axis + ty.ndim if axis < 0 else axis
        index = indices.value.numpy()
        extent = ty.shape.values[axis] if isinstance(ty.shape, relax.ShapeExpr) else None
        if isinstance(extent, tvm.tirx.IntImm):
            extent = int(extent)
            if ((index < -extent) | (index >= extent)).any():
                raise ValueError(f"Gather: indices {index.tolist()} out of range for axis {axis} "
                                 f"of extent {extent}")
            index = np.where(index < 0, index + extent, index)
        elif (index < 0).any():
            return super()._impl_v13(bb, inputs, attr, params)
        return relax.op.take(data, _c(index, str(index.dtype)), axis)
