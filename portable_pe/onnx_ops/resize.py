"""Resize to sizes that are dims of the input (a learned position table resized to the
image's patch grid), which TVM 0.27's converter takes only as constants ("int(val.value)"
of each size). 4-D, sizes given (not scales), a constant or empty ROI: relax's resize2d,
whose size may be symbolic; anything else goes to TVM's converter."""

from __future__ import annotations

import tvm
from tvm import relax, tirx
from tvm.relax.frontend.onnx import onnx_frontend as _fe

_MODES = {"nearest": "nearest_neighbor", "linear": "linear", "cubic": "cubic"}


def _text(attr, name: str, default: str) -> str:
    value = attr.get(name, default)
    return value.decode("ascii") if isinstance(value, bytes) else value


class Resize(_fe.Resize):
    @classmethod
    def _impl_v18(cls, bb, inputs, attr, params):
        x = inputs[0]
        sizes = inputs[3] if len(inputs) > 3 else None
        scales = inputs[2] if len(inputs) > 2 else None
        roi = inputs[1] if len(inputs) > 1 else None
        symbolic = isinstance(sizes, relax.ShapeExpr) and not all(isinstance(v, tirx.IntImm) for v in sizes.values)
        roi_empty = roi is None or (isinstance(roi, tvm.ir.GenericConst) and roi.value.numpy().size == 0)
        if not (symbolic and scales is None and roi_empty and len(x.ty.shape) == 4):
            return super()._impl_v18(bb, inputs, attr, params)
        return relax.op.image.resize2d(
            x, size=relax.ShapeExpr(list(sizes.values)[2:]), roi=[0.0] * 4, layout="NCHW",
            method=_MODES[_text(attr, "mode", "nearest")],
            coordinate_transformation_mode=_text(attr, "coordinate_transformation_mode", "half_pixel"),
            rounding_method=_text(attr, "nearest_mode", "round_prefer_floor"),
            cubic_alpha=attr.get("cubic_coeff_a", -0.75), cubic_exclude=attr.get("exclude_outside", 0),
            extrapolation_value=attr.get("extrapolation_value", 0.0))
