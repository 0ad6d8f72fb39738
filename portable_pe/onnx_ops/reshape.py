"""Reshape of a dim value (a PrimValue) into the shape-like value it stands for.

Where torch.export computes a size from the image's dims (``h // 8``, the patch count of
a vision tower), the exported graph reshapes that scalar to ``[1]`` (or ``[1]`` back to a
scalar) before concatenating it into a target shape. TVM 0.27 keeps such a dim value as a
PrimValue, and its Reshape converter takes tensors only ("Reshape expects the input data
to be a Tensor. However, the given input is ir.PrimType"). A dim value reshaped to one
element is the one-dim ShapeExpr that TVM's own Unsqueeze makes of it, and a one-dim
ShapeExpr reshaped to a scalar is its dim value; anything else goes to TVM's converter,
with a dim value first made a tensor.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend as _fe


def _target(shape, params) -> list[int] | None:
    const = _fe.get_constant(shape, params)
    return const.value.numpy().tolist() if isinstance(const, tvm.ir.GenericConst) else None


class Reshape(_fe.Reshape):
    @classmethod
    def _impl_v13(cls, bb, inputs, attr, params):
        data, target = inputs[0], _target(inputs[1], params)
        if tvm.ir.is_prim_expr(data) and target is not None:
            if target == []:
                return data
            if target in ([1], [-1]):
                return relax.ShapeExpr([data])
            data = bb.normalize(relax.op.shape_to_tensor(relax.ShapeExpr([data])))
        elif isinstance(data, relax.ShapeExpr) and len(data.values) == 1 and target == []:
            return relax.prim_value(data.values[0])
        return super()._impl_v13(bb, [data, *inputs[1:]], attr, params)
