"""float32 sine and cosine on cuda with their argument reduced to [-pi, pi] first.

TVM compiles CUDA kernels with nvcc's ``--use_fast_math``, where ``sinf`` is ``__sinf``,
whose error grows with the argument. A sinusoidal table computed in the kernel takes
sin(position x frequency), up to the sequence length in radians: the sinusoidal graph on
an H200 was 2.8e-05 from PyTorch at T=300 where every other graph was within 5.3e-06, and
with the argument reduced first (a Relax rewrite then, measured on the same H200) 1.7e-06.

That rewrite changed the kernels before the tuning database is applied, and MetaSchedule
could not reload a database record of the rewritten kernel ("parallel_for_dynamic error").
Here the reduction is part of lowering the intrinsic, when the kernel becomes CUDA source:
every schedule, database lookup and PrimFunc stays as it was. The reduction is Cody-Waite
with 2 pi in three parts, the first with 8 significant bits so that k x it is exact in
float32 for |k| < 2**16.
"""

from __future__ import annotations

import math

import tvm
from tvm import tirx

#: 2 pi as C1 + C2 + C3 (C1 = 6.28125 has 8 significant bits)
TWO_PI_PARTS = (6.28125, 0.0019353071693331003, 1.0253131677018246e-11)
_LOWERING_ATTR = "cuda.FLowerIntrinsic"
#: above TVM's own registration, which this wraps
_PLEVEL = 20


def reduced_argument(x: tirx.PrimExpr) -> tirx.PrimExpr:
    """x - k * 2 pi with k = round(x / 2 pi), for a float32 `x`: in [-pi, pi], same sine and cosine."""
    f32 = "float32"
    k = tirx.round(x * tirx.const(1 / (2 * math.pi), f32))
    r = x
    for part in TWO_PI_PARTS:
        r = r - k * tirx.const(part, f32)
    return r


def _wrapping(tvm_lowering, make):
    def lower(call):
        x = call.args[0]
        if str(x.ty) != "float32":  # TVM 0.27: an expression's type is `ty`
            return tvm_lowering(call)
        return tvm_lowering(make(reduced_argument(x)))
    return lower


#: the ops whose lowering this process has wrapped (TVM keeps one registration per level)
_WRAPPED: set[str] = set()


def register() -> None:
    """Lower tirx.sin and tirx.cos on cuda through the reduction (once per process)."""
    for name, make in (("tirx.sin", tirx.sin), ("tirx.cos", tirx.cos)):
        op = tvm.ir.Op.get(name)
        current = op.get_attr(_LOWERING_ATTR)
        if name in _WRAPPED or current is None:
            continue
        op.set_attr(_LOWERING_ATTR, _wrapping(current, make), plevel=_PLEVEL)
        _WRAPPED.add(name)
