"""Relax rewrites a cuda build needs because TVM compiles its kernels with nvcc's
``--use_fast_math``.

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


@tvm.transform.module_pass(opt_level=0, name="PowerAsProducts")
class PowerAsProducts:  # pylint: disable=too-few-public-methods
    """x ** k for a constant whole k in 1..MAX_EXPONENT as k - 1 multiplications."""

    def transform_module(self, mod, _ctx):
        return _mutate_relax_functions(_PowerAsProducts(mod), mod, skip_failures=None)
