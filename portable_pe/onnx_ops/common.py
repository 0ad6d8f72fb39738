"""Small Relax helpers shared by the converters."""

from __future__ import annotations

import numpy as np
from tvm import relax, tirx


def _shape(bb: relax.BlockBuilder, x: relax.Expr, what: str) -> list:
    """Static-or-symbolic shape of x as a list of PrimExpr; match_casts if unknown."""
    ty = x.ty
    if not isinstance(ty, relax.TensorType) or ty.ndim < 0:
        raise ValueError(f"{what}: input rank must be known")
    if isinstance(ty.shape, relax.ShapeExpr):
        return list(ty.shape.values)
    dims = [tirx.Var(f"{what}_d{i}", "int64") for i in range(ty.ndim)]
    bb.match_cast(x, relax.TensorType(dims, ty.dtype))
    return dims


def _c(value, dtype):
    return relax.const(np.asarray(value, dtype=dtype), dtype)


def _dtype(x) -> str:
    return str(x.ty.dtype)


def _slice_last(bb, x, begin, end, stride=1):
    return bb.normalize(
        relax.op.strided_slice(x, axes=[len(x.ty.shape.values) - 1], begin=[begin], end=[end], strides=[stride])
    )
