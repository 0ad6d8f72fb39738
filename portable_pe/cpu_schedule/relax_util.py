"""Small Relax helpers shared by the passes that rewrite Relax functions before legalization."""

from __future__ import annotations

import logging

import tvm
from tvm import relax
from tvm.ir import IRModule

logger = logging.getLogger(__package__)


def constant_array(expr):
    """A Relax constant's value as a numpy array; None for anything else (TVM 0.27: Relax
    constants are tvm.ir.GenericConst, their tensor in ``value``)."""
    return expr.value.numpy() if isinstance(expr, tvm.ir.GenericConst) else None


def _tensor_type(expr):
    """(dtype, dims) of a Relax tensor expression with a known shape, else None.

    TVM 0.27: Relax expressions carry ``ty`` (a TensorType), not ``struct_info``."""
    ty = getattr(expr, "ty", None)
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    return str(ty.dtype), list(ty.shape.values)


def same_dims(a, b) -> bool:
    """Two shapes of one rank whose dims are provably equal, one by one (symbolic ones too)."""
    ana = tvm.sym.Analyzer()
    return len(a) == len(b) and all(ana.can_prove_equal(x, y) for x, y in zip(a, b))


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


#: tvm.relax OpPatternKind values, for kernels AnnotateTIROpPattern would misjudge
INJECTIVE = 2
OUT_ELEMWISE_FUSABLE = 4
OPAQUE = 8


def mark_op_pattern(mod: IRModule, kinds: dict) -> IRModule:
    """`mod` with each PrimFunc of `kinds` ({GlobalVar: OpPatternKind}) marked: AnnotateTIROpPattern
    keeps a pattern already set, and FuseOps fuses by it. Done once a pass's builder is
    finished: marking a call_te's PrimFunc as it is emitted keeps the builder from sharing
    one PrimFunc between same-shaped calls (one copy per layer, each its own kernel)."""
    for gv, kind in kinds.items():
        mod[gv] = mod[gv].with_attr("op_pattern", kind)
    return mod


def call_of(value, op_name: str):
    """`value` when it is a call of the Relax op `op_name`, else None."""
    return value if isinstance(value, relax.Call) and getattr(value.op, "name", None) == op_name else None


def bound_call(mutator, expr, op_name: str):
    """The call `expr` is bound to in `mutator`'s function, when it is a call of `op_name`."""
    return call_of(mutator.lookup_binding(expr), op_name) if isinstance(expr, relax.Var) else None


def rewrite_matmul(call, rewrite, log, kept: str, failures=None):
    """`rewrite(call)` for a relax.matmul call, or the call as it was: when the rewrite does
    not apply (None) or fails (logged at debug level as `kept`: the float path stays correct;
    recorded in `failures`, a failures.PipelineFailures, when given)."""
    if getattr(call.op, "name", None) != "relax.matmul":
        return call
    try:
        rewritten = rewrite(call)
    except Exception as err:  # pylint: disable=broad-except
        log.debug("cpu_schedule: %s: %s", kept, err)
        if failures is not None:
            failures.rewrite(kept, err)
        rewritten = None
    return call if rewritten is None else rewritten
