"""Each compound tensor dim of a pixel graph gets a variable of its own.

A vision graph's token count is arithmetic on its input dims: 224x224 pixels in 16-pixel
patches with a CLS and 4 register tokens is ``H // 16 * (W // 16) + 5`` rows. Every kernel
over the tokens then carries that expression in its buffer shapes and loop bounds, and
TVM's simplifier cannot cancel it where it compacts a matmul's accumulator tile (it cannot
prove ``(H // 16 * (W // 16) + 11) // 7`` positive, as it does ``(T + 6) // 7``): the
tile's index stays symbolic and LLVM keeps the accumulators on the stack, one load and one
store per FMA. Measured on vit_rope_2d's first MLP matmul (201 x 256 x 1024, one core):
4.8 ms with the expression against 1.5 ms for the same kernel over a text encoder's ``T``.

So, first in the CPU pipeline, each dim that is not affine in the input dims (a floor
division, a product of two dims) is bound to a new variable by a ``match_cast`` where it
first appears, and every later shape is written with that variable: the kernels then see
``n`` and ``n + 5`` as a text graph sees ``T``. Each later appearance is checked against the
variable at run time by the same match_cast, so a wrong shape still fails loudly. Graphs
whose dims are all affine (every text graph) are returned unchanged.

TVM 0.27's FuseTIR cannot pass a variable a match_cast defined to a kernel that needs it as
a scalar ("All shape inputs are expected to be single tirx var"), so every dim that is not
a variable or a constant is named, ``n + 5`` included; and where TVM still cannot fuse the
named module (seen on two Hugging Face exports, Pixtral and BEiT), WithNamedDims runs the
fusion passes on the module as imported instead: slower kernels, the same numbers.

A match_cast is also where FuseOps stops, so two places avoid one: a slice whose length is
a named dim ends at ``begin + name`` (then Relax infers the name itself), and a value whose
one reader is a transpose leaves the cast to the transpose's result (the two then fuse).
Both come from DINOv3's prefix tokens around its 2D RoPE; with both, and its prefix take as
a slice (head_reshapes), each layer's q and k head split, rotation and Kᵀ are two kernels
where they were seven. Where FuseTIR refuses what they make (our learned, sin-cos and
relative-bias ViTs refuse the first: _slice_ends_by_length says why), WithNamedDims names
the module again without them, one at a time.
"""

from __future__ import annotations

import logging

import tvm
from tvm_ffi import structural_equal
from tvm import relax, tirx
from tvm.relax.expr_functor import PyExprMutator, mutator

from .tir_util import _const_int

logger = logging.getLogger(__package__)

#: calls of PrimFuncs whose buffer shapes were fixed when they were made
_PRIM_FUNC_CALLS = ("relax.call_tir", "relax.call_tir_inplace", "relax.call_dps_packed")

_STRIDED_SLICE = tvm.ir.Op.get("relax.strided_slice")
_PERMUTE_DIMS = tvm.ir.Op.get("relax.permute_dims")

_BINARY = (tirx.Add, tirx.Sub, tirx.Mul, tirx.FloorDiv, tirx.FloorMod, tirx.Min, tirx.Max, tirx.Div, tirx.Mod)


def _is_affine(dim) -> bool:
    """Whether `dim` is a constant plus integer multiples of dim variables."""
    if isinstance(dim, (tirx.IntImm, tirx.Var)):
        return True
    free = tirx.analysis.undefined_vars(dim, [])
    return bool(tvm.sym.detect_linear_equation(dim, free)) if free else True


class _Names:
    """Compound dims met so far and their variables; rewrites a dim with them."""

    def __init__(self):
        self.analyzer = tvm.sym.Analyzer()
        self.exprs: list = []
        self.vars: list = []

    def rewrite(self, dim):
        """`dim` with every named subexpression replaced by its variable, simplified."""
        if isinstance(dim, _BINARY):
            a, b = self.rewrite(dim.a), self.rewrite(dim.b)
            if not (a.same_as(dim.a) and b.same_as(dim.b)):
                dim = type(dim)(a, b)
        for expr, var in zip(self.exprs, self.vars):
            if structural_equal(dim, expr):
                return var
        return dim

    def canonical(self, dim):
        return self.rewrite(self.analyzer.simplify(self.rewrite(dim)))

    def name(self, dim) -> tirx.Var:
        var = tirx.Var(f"n{len(self.vars)}", "int64")
        self.exprs.append(dim)
        self.vars.append(var)
        return var

    def expand(self, dim):
        """`dim` in the input dims: each variable replaced by the expression it names (itself
        written with the names before it)."""
        if isinstance(dim, _BINARY):
            a, b = self.expand(dim.a), self.expand(dim.b)
            return dim if a.same_as(dim.a) and b.same_as(dim.b) else type(dim)(a, b)
        for expr, var in zip(self.exprs, self.vars):
            if dim.same_as(var):
                return self.expand(expr)
        return dim

    def named_as(self, dim):
        """The variable that names the value of `dim`, if one does."""
        value = self.analyzer.simplify(self.expand(dim))
        for expr, var in zip(self.exprs, self.vars):
            if structural_equal(value, self.analyzer.simplify(self.expand(expr))):
                return var
        return None


def _type_with(ty, rewrite):
    if isinstance(ty, relax.TensorType) and isinstance(ty.shape, relax.ShapeExpr):
        dims = [rewrite(d) for d in ty.shape.values]
        if any(not d.same_as(o) for d, o in zip(dims, ty.shape.values)):
            return relax.TensorType(dims, ty.dtype, ty.vdevice)
    elif isinstance(ty, relax.TupleType):
        fields = [_type_with(f, rewrite) for f in ty.fields]
        if any(not a.same_as(b) for a, b in zip(fields, ty.fields)):
            return relax.TupleType(fields)
    elif isinstance(ty, relax.ShapeType) and ty.values is not None:
        values = [rewrite(d) for d in ty.values]
        if any(not d.same_as(o) for d, o in zip(values, ty.values)):
            return relax.ShapeType(values)
    return ty


@mutator
class _NameCompoundDims(PyExprMutator):
    def __init__(self, mod, slice_lengths: bool = True):
        super().__init__(mod)
        self.names = _Names()
        #: whether slices get their ends written by length (_slice_ends_by_length)
        self.slice_lengths = slice_lengths
        #: bindings whose one use is a transpose: their match_cast waits for it (visit_var_binding_)
        self.cast_after_transpose: set = set()

    def visit_shape_expr_(self, op):
        values = [self.names.canonical(v) for v in op.values]
        if all(v.same_as(o) for v, o in zip(values, op.values)):
            return op
        return relax.ShapeExpr(values)

    def visit_tuple_(self, op):
        # strided_slice's bounds: a tuple whose fields are bare PrimExprs
        tup = super().visit_tuple_(op)
        fields = [self.names.canonical(f) if tvm.ir.is_prim_expr(f) else f for f in tup.fields]
        if all(a.same_as(b) for a, b in zip(fields, tup.fields)):
            return tup
        return relax.Tuple(fields, tup.span)

    def visit_call_(self, op):
        if isinstance(op.op, tvm.ir.Op) and op.op.name in _PRIM_FUNC_CALLS:
            return self._prim_func_call(op)
        call = super().visit_call_(op)
        # TVM 0.27: a scalar argument is a bare PrimExpr (no PrimValue node)
        args = [self.names.canonical(a) if tvm.ir.is_prim_expr(a) else a for a in call.args]
        if self.slice_lengths and call.op.same_as(_STRIDED_SLICE):
            args = self._slice_ends_by_length(args)
        ty_args = [_type_with(t, self.names.canonical) for t in call.ty_args]
        if all(a.same_as(b) for a, b in zip([*args, *ty_args], [*call.args, *call.ty_args])):
            return call
        return relax.Call(call.op, args, call.attrs, ty_args, call.span)

    def _slice_ends_by_length(self, args):
        """A slice whose length is a named dim gets its end written as begin + that name.

        DINOv3's patch tokens are ``x[:, :, 5:n3]`` with ``n3`` naming ``H // 16 * (W // 16)
        + 5``: Relax infers the length as ``n3 - 5``, which is not the patch count's name
        ``n2``, so the binding would take a match_cast, and FuseOps fuses nothing across one:
        the slice stayed a copy of its own (1.2% of DINOv3-S at B = 8). Ended at ``5 + n2``,
        the slice is inferred as ``n2`` long and fuses into the rotation that reads it.

        Where no buffer of the kernel it fuses into has ``n2`` as a dim of its own (our ViTs
        with learned or sin-cos positions split the patch tokens off and concatenate them
        back unrotated), FuseTIR needs ``n2`` as a shape input and refuses ("All shape
        inputs are expected to be single tirx var"): WithNamedDims then names the module
        again without this rewrite."""
        axes, begins, ends = args[1:4]
        strides = args[4] if len(args) > 4 else None
        if not all(isinstance(t, relax.Tuple) for t in (axes, begins, ends)):
            return args
        new_ends = list(ends.fields)
        for i, (begin, end) in enumerate(zip(begins.fields, ends.fields)):
            step = strides.fields[i] if isinstance(strides, relax.Tuple) else None
            if isinstance(end, tirx.IntImm) or (step is not None and _const_int(step) != 1) \
                    or (isinstance(begin, tirx.IntImm) and begin.value < 0):
                # a constant end (or "to the end") is no name's; with a stride, or a begin
                # counted from the end, the length is not end - begin
                continue
            length = self.names.named_as(end - begin)
            if length is not None:
                new_ends[i] = begin + length
        if all(a.same_as(b) for a, b in zip(new_ends, ends.fields)):
            return args
        return [*args[:3], relax.Tuple(new_ends), *args[4:]]

    def _prim_func_call(self, op):
        """A call of a PrimFunc the import made (emit_te): its buffers keep the shapes they
        were written with, so its tensors go in cast back to them (checked at run time) and
        its result comes out as written; the binding names the result's dims."""
        args = []
        for old in op.args[1].fields:
            if tvm.ir.is_prim_expr(old):  # a scalar the PrimFunc takes as it was
                args.append(old)
                continue
            new = self.visit_expr(old)
            if not structural_equal(new.ty, old.ty) and _known_shape(old.ty):
                new = self.builder_.match_cast(new, old.ty)
            args.append(new)
        rest = [self.visit_expr(a) for a in op.args[2:]]
        return relax.Call(op.op, [op.args[0], relax.Tuple(args), *rest], op.attrs, op.ty_args, op.span)

    def visit_var_binding_(self, binding):
        value = self.builder_.normalize(self.visit_expr(binding.value))
        declared = _type_with(binding.var.ty, self.names.canonical)
        if not (isinstance(binding.var, relax.DataflowVar) and _known_shape(declared)):
            new = type(binding.var)(binding.var.name, declared)
            self.builder_.emit_normalized(relax.VarBinding(new, value))
            self.set_var_remap(binding.var, new)
            return
        for dim in declared.shape.values:
            if not isinstance(dim, (tirx.IntImm, tirx.Var)) and not any(
                    structural_equal(dim, e) for e in self.names.exprs):
                self.names.name(dim)
        wanted = _type_with(declared, self.names.canonical)
        if structural_equal(value.ty, wanted):
            new = relax.DataflowVar(binding.var.name, wanted)
            self.builder_.emit_normalized(relax.VarBinding(new, value))
            self.set_var_remap(binding.var, new)
            return
        if binding.var in self.cast_after_transpose and _known_shape(value.ty) \
                and all(_is_affine(d) for d in value.ty.shape.values):
            # DINOv3's keys: concat(prefix, rotated patches) is 5 + n2 long where the name is
            # n3, and the transpose to Kᵀ reads it. A match_cast between the two keeps FuseOps
            # from putting the transpose in the rotation's kernel (a copy of K per layer, 0.8%
            # of the run at B = 8); the transpose's result takes the cast instead
            new = relax.DataflowVar(binding.var.name, value.ty)
            self.builder_.emit_normalized(relax.VarBinding(new, value))
            self.set_var_remap(binding.var, new)
            return
        # a dim met here for the first time, or a shape the new names hide from Relax's
        # inference ((n4, 32) * (n2, 32) is not provably (n2, 32)): bind it, checked at run time
        made = relax.DataflowVar(binding.var.name + "_dims", value.ty)
        self.builder_.emit_normalized(relax.VarBinding(made, value))
        named = relax.DataflowVar(binding.var.name, wanted)
        self.builder_.emit_normalized(relax.MatchCast(named, made, wanted))
        self.set_var_remap(binding.var, named)


def _used_once_by_a_transpose(func: relax.Function) -> set:
    """The dataflow variables of `func` whose one use is a permute_dims' operand."""
    bindings = {}
    users: dict = {}
    for block in func.body.blocks:
        if not isinstance(block, relax.DataflowBlock):
            continue
        bindings.update((b.var, b) for b in block.bindings)
        for var, uses in relax.analysis.udchain(block).items():
            users.setdefault(var, []).extend(uses)
    found = set()
    for var, uses in users.items():
        if len(uses) != 1 or uses[0] not in bindings:
            continue
        value = bindings[uses[0]].value
        if isinstance(value, relax.Call) and value.op.same_as(_PERMUTE_DIMS) and value.args[0].same_as(var):
            found.add(var)
    return found


def _known_shape(ty) -> bool:
    return isinstance(ty, relax.TensorType) and isinstance(ty.shape, relax.ShapeExpr)


def name_compound_dims(mod: tvm.IRModule, slice_lengths: bool = True,
                       casts_after_transposes: bool = True) -> tvm.IRModule:
    """`mod` with each tensor dim that is not a variable or a constant bound to a variable
    of its own where it first appears (the module docstring says why), if some dim is not
    affine in the input dims; `mod` itself otherwise (text graphs: ``T``, ``past + T``).
    `slice_lengths` and `casts_after_transposes` turn on the two rewrites that avoid a
    match_cast (the module docstring)."""
    if not _has_compound_dims(mod):
        return mod
    mod = mod.clone()
    mutator_ = _NameCompoundDims(mod, slice_lengths)
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            mutator_.cast_after_transpose = _used_once_by_a_transpose(func) if casts_after_transposes else set()
            mod[gv] = mutator_.visit_expr(func)
    return mod


def _has_compound_dims(mod: tvm.IRModule) -> bool:
    found = []

    def visit(expr):
        ty = getattr(expr, "ty", None)
        if _known_shape(ty):
            found.extend(not _is_affine(d) for d in ty.shape.values)

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return any(found)


@tvm.transform.module_pass(opt_level=0, name="WithNamedDims")
class WithNamedDims:  # pylint: disable=too-few-public-methods
    """`passes` (the fusion passes) on the module with its compound dims named; where TVM
    cannot fuse that, named again without the slice-length rewrite, then without the casts
    moved after transposes too (as named before those two existed); where it cannot fuse
    any, on the module as it came (the module docstring says why)."""

    #: (slice_lengths, casts_after_transposes) of each naming tried, and what follows a refusal
    NAMINGS = (((True, True), "naming it again without slice ends by length"),
               ((False, True), "naming it again without casts after transposes"),
               ((False, False), "fusing it as imported"))

    def __init__(self, passes):
        self.passes = tvm.transform.Sequential(list(passes))

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        refused = None  # the named module TVM could not fuse last
        for (slice_lengths, casts_after_transposes), then in self.NAMINGS:
            try:
                named = name_compound_dims(mod, slice_lengths, casts_after_transposes)
            except Exception as err:  # pylint: disable=broad-except  # the plain module is still right
                logger.info("cpu_schedule: compound dims left as expressions: %s", err)
                return self.passes(mod)
            if named.same_as(mod):
                return self.passes(mod)
            if refused is not None and structural_equal(named, refused):
                continue  # the rewrite left out had not fired: the same module, refused again
            try:
                return self.passes(named)
            except Exception as err:  # pylint: disable=broad-except
                refused = named
                first = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
                logger.info("cpu_schedule: TVM cannot fuse the module with named dims (%s); %s", first, then)
        return self.passes(mod)
