"""Every tensor's shape in one canonical form after the import, so that later passes agree.

One dim can reach the Relax module written two ways: Relax's concat writes a CLS token
and N patches as ``2 + N``, legalize's rebuilt reshape as ``N + 2``, and TVM's own
passes (LegalizeOps) simplify ``2 + N`` to ``N + 2`` for the outputs they make but not for
the kernels made before them (fast math). FuseTIR then refuses the fused kernel
("Inconsistent buffers ... mapped to the same relax var"). Rewriting every binding's shape,
and every shape operand (a reshape's target: Swin's window count 4 * (H // 16) * (W // 16)),
with TVM's simplifier once, right after the import, gives every pass the same form."""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator


def _canonical(ty, analyzer):
    if isinstance(ty, relax.TensorType) and isinstance(ty.shape, relax.ShapeExpr):
        dims = [analyzer.simplify(d) for d in ty.shape.values]
        if any(not d.same_as(o) for d, o in zip(dims, ty.shape.values)):
            return relax.TensorType(dims, ty.dtype, ty.vdevice)
    elif isinstance(ty, relax.TupleType):
        fields = [_canonical(f, analyzer) for f in ty.fields]
        if any(not a.same_as(b) for a, b in zip(fields, ty.fields)):
            return relax.TupleType(fields)
    return ty


@mutator
class _CanonicalShapes(PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.analyzer = tvm.sym.Analyzer()

    def visit_shape_expr_(self, op):
        """A shape operand (a reshape's target) in the same form as the shapes: LegalizeOps
        gives the kernel's output buffer the operand's form, and the binding's."""
        dims = [self.analyzer.simplify(d) for d in op.values]
        if all(d.same_as(o) for d, o in zip(dims, op.values)):
            return op
        return relax.ShapeExpr(dims)

    def visit_var_binding_(self, binding):
        value = self.visit_expr(binding.value)
        ty = _canonical(binding.var.ty, self.analyzer)
        if ty.same_as(binding.var.ty):
            self.builder_.emit_normalized(relax.VarBinding(binding.var, value))
            return
        new = type(binding.var)(binding.var.name, ty)  # a Var or a DataflowVar, as it was
        self.builder_.emit_normalized(relax.VarBinding(new, value))
        self.set_var_remap(binding.var, new)


def canonical_shapes(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with every binding's shape simplified to TVM's canonical form."""
    mutator_ = _CanonicalShapes(mod)
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            mod[gv] = mutator_.visit_expr(func)
    return mod
