"""Small Relax helpers shared by the passes that rewrite Relax functions before legalization."""

from __future__ import annotations

import logging

from tvm import relax
from tvm.ir import IRModule

logger = logging.getLogger(__package__)


def _tensor_type(expr):
    """(dtype, dims) of a Relax tensor expression with a known shape, else None.

    TVM 0.27: Relax expressions carry ``ty`` (a TensorType), not ``struct_info``."""
    ty = getattr(expr, "ty", None)
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    return str(ty.dtype), list(ty.shape.values)


def _mutate_relax_functions(mutator: relax.PyExprMutator, mod: IRModule, *,
                            skip_failures: str | None = None) -> IRModule:
    """``mod`` with every Relax function passed through ``mutator``.

    With ``skip_failures`` (what the pass does, for the log), a function the mutator
    raises on is left as it was and the others are still rewritten; without it, the
    error propagates."""
    for gv, func in mod.functions_items():
        if not isinstance(func, relax.Function):
            continue
        try:
            mutator.builder_.update_func(gv, mutator.visit_expr(func))
        except Exception as err:  # pylint: disable=broad-except
            if skip_failures is None:
                raise
            logger.debug("cpu_schedule: %s skipped for %s: %s", skip_failures, gv.name_hint, err)
    return mutator.builder_.get()
