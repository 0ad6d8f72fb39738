"""Relax rewrites a cuda build needs because TVM compiles its kernels with nvcc's
``--use_fast_math``.

Sine and cosine: fast math makes ``sinf`` ``__sinf``, whose error grows with the argument.
A sinusoidal table computed in the kernel takes sin(position x frequency), up to the
sequence length in radians, and the sinusoidal graph on an H200 was 2.8e-05 from PyTorch at
T=300 where every other graph was within 5.3e-06. The argument is reduced to [-pi, pi]
first (Cody-Waite: 2 pi in three parts, so k x the first is exact), where ``__sinf`` is
accurate to about 4e-7.

Under fast math ``powf(x, y)`` is ``__powf``: ``exp2(y * log2(x))``, NaN for every negative
x even where y is a whole number. ``x ** 2`` is how exported RMSNorms square
(transformers' PixtralRMSNorm), so Pixtral's vision tower built for cuda returned NaN for
every output on an H200, from both exporters, where its CPU build and onnxruntime were
right. A power by a small whole constant is written here as products, which fast math
leaves exact; other powers stay as they are (NaN for a negative base is then the
exact-math answer too, except for a whole exponent beyond MAX_EXPONENT).
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..cpu_schedule.relax_util import _mutate_relax_functions

#: the largest whole exponent written as products (x**4 = three multiplies)
MAX_EXPONENT = 4


def whole_exponent(expr) -> int | None:
    """The exponent when `expr` is a scalar constant holding a whole number in
    1..MAX_EXPONENT, else None."""
    if not isinstance(expr, tvm.ir.expr.Constant):  # TVM 0.27: relax.const makes one
        return None
    value = expr.value.numpy()
    if value.size != 1:
        return None
    value = float(value.reshape(()))
    return int(value) if value.is_integer() and 1 <= value <= MAX_EXPONENT else None


@relax.expr_functor.mutator
class _PowerAsProducts(relax.PyExprMutator):  # pylint: disable=abstract-method
    def visit_call_(self, call):  # pylint: disable=arguments-renamed
        call = super().visit_call_(call)
        if getattr(call.op, "name", None) != "relax.power" or len(call.args) != 2:
            return call
        n = whole_exponent(call.args[1])
        if n is None:
            return call
        base = call.args[0]
        product = base
        for _ in range(n - 1):
            product = relax.op.multiply(product, base)
        return product


#: 2 pi as C1 + C2 + C3: C1 has 8 significant bits, so k * C1 is exact in float32 for |k| < 2**16
_TWO_PI_PARTS = (6.28125, 0.0019353071693331003, 1.0253131677018246e-11)


def _reduced(x, fn):
    """fn(x) for float32 `x` (a te.Tensor), with x reduced to [-pi, pi] first."""
    from tvm import te, tirx
    f32 = "float32"

    def body(*i):
        k = tirx.round(x(*i) * tirx.const(1 / 6.283185307179586, f32))
        r = x(*i)
        for part in _TWO_PI_PARTS:
            r = r - k * tirx.const(part, f32)
        return fn(r)
    return te.compute(x.shape, body, name="reduced")


_REDUCED = {"sin": lambda x: _reduced(x, tvm.tirx.sin), "cos": lambda x: _reduced(x, tvm.tirx.cos)}


@relax.expr_functor.mutator
class _ReducedSinCos(relax.PyExprMutator):  # pylint: disable=abstract-method
    def visit_call_(self, call):  # pylint: disable=arguments-renamed
        call = super().visit_call_(call)
        name = getattr(call.op, "name", None)
        if name not in ("relax.sin", "relax.cos"):
            return call
        ty = getattr(call.args[0], "ty", None)
        if ty is None or str(getattr(ty, "dtype", "")) != "float32":
            return call
        op = name.split(".")[1]
        return self.builder_.call_te(_REDUCED[op], call.args[0], primfunc_name_hint=f"{op}_reduced")


@tvm.transform.module_pass(opt_level=0, name="ReducedSinCos")
class ReducedSinCos:  # pylint: disable=too-few-public-methods
    """float32 sin and cos with their argument reduced to [-pi, pi] first."""

    def transform_module(self, mod, _ctx):
        return _mutate_relax_functions(_ReducedSinCos(mod), mod, skip_failures=None)


@tvm.transform.module_pass(opt_level=0, name="PowerAsProducts")
class PowerAsProducts:  # pylint: disable=too-few-public-methods
    """x ** k for a constant whole k in 1..MAX_EXPONENT as k - 1 multiplications."""

    def transform_module(self, mod, _ctx):
        return _mutate_relax_functions(_PowerAsProducts(mod), mod, skip_failures=None)
