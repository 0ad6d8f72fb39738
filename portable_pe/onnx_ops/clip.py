"""Clip as Relax maximum/minimum (TVM 0.27 emits TE helper PrimFuncs)."""

from __future__ import annotations

import numpy as np
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend as _fe

from .common import _dtype


class Clip(_fe.Clip):
    """TVM's Clip, with Relax maximum/minimum ops where TVM emits TE helper PrimFuncs.

    TVM 0.27 converts Clip with ``bb.emit_te(topi.maximum, ...)``: a PrimFunc written for
    the symbolic shape that main calls directly. A tuned compile binds batch and seq in a
    copy of main (tune.specialize), but such a helper keeps its symbolic buffers, and
    FuseTIR then stops ("Inconsistent buffers compute and A mapped to the same relax
    var"): that is what kept t5_bias and hybrid (T5 bucketing clips the relative
    distance) from being tuned. As Relax ops they are legalized after the binding."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        x = inputs[0]
        dtype = _dtype(x)
        x = bb.emit(relax.op.maximum(x, relax.const(float(attr.get("min", -np.inf)), dtype)))
        return bb.emit(relax.op.minimum(x, relax.const(float(attr.get("max", np.inf)), dtype)))

    @classmethod
    def _impl_v13(cls, bb, inputs, attr, params):
        x = inputs[0]
        if inputs[1] is not None:
            x = bb.emit(relax.op.maximum(x, cls._sanitize_nan_clip_bound(bb, inputs[1], for_min=True)))
        if inputs[2] is not None:
            x = bb.emit(relax.op.minimum(x, cls._sanitize_nan_clip_bound(bb, inputs[2], for_min=False)))
        return x
