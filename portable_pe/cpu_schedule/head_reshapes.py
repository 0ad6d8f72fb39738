"""Head splits and merges that fuse when the sequence length is symbolic.

An encoder's q/k/v path is ``matmul -> split -> add bias -> reshape [B, T, H*Dh] ->
[B, T, H, Dh] -> transpose`` (and after attention the reverse merge). With a symbolic
T, TOPI's reshape indexes its input through the flattened offset, divided and reduced
modulo T; TVM's pattern analysis calls a load index with a variable the store does not
have opaque (``IsInjectivePattern``), so FuseOps keeps every such reshape apart, and the
split (a tuple) is never fused either. On the rope encoder that was a split kernel and
three bias-add kernels per layer, each a pass over [B, T, 768] floats (about 4% of the
run at B=8 T=512).

This pass, before legalization, writes the same operations with indices that say what
they are: ``out[..., h, d] = x[..., h*Dh + d]`` for a head split,
``out[..., c] = x[..., c // Dh, c % Dh]`` for a merge, and each output of a split along
a static axis as a strided_slice. FuseOps then folds them into their neighbours (the
RoPE kernel, the transposes). Fully static functions are left alone: there TOPI's
reshape is already injective, and tuned workloads were hashed from that form.

A take of consecutive constant indices is a slice too: DINOv3's export picks the CLS and
register tokens out of each head's rows with ``Gather(indices=[0, 1, 2, 3, 4])`` before the
patch tokens are rotated. TOPI's take loads through the index tensor, which the pattern
analysis calls opaque, so the head split feeding both the take and the rotation stayed a
kernel of its own (a pass over q and one over k per layer); as a strided_slice the split,
the prefix, the rotation and their concatenation are one kernel.
"""

from __future__ import annotations

import tvm
from tvm import relax, tirx
from tvm.ir import IRModule

from .relax_util import _mutate_relax_functions, _tensor_type, call_of, same_dims
from .tir_util import _const_int


def _shape(expr):
    info = _tensor_type(expr)
    return None if info is None else info[1]


def _symbolic(shape) -> bool:
    return any(_const_int(d) is None for d in shape)


def split_bounds(split, width) -> list[int] | None:
    """The section bounds [0, ..., width] of a relax.split call over an axis `width` long,
    or None where the width is not a constant or n equal parts do not divide it."""
    width = _const_int(width)
    if width is None:
        return None
    sections = split.attrs.indices_or_sections
    if isinstance(sections, (tirx.IntImm, int)):  # n equal parts
        n = int(sections)
        return None if width % n else [width // n * i for i in range(n + 1)]
    return [0, *(int(s) for s in sections), width]


def _split_last(x, heads: int, head_dim: int):
    from tvm import te
    shape = [*x.shape[:-1], heads, head_dim]
    return te.compute(shape, lambda *i: x(*i[:-2], i[-2] * head_dim + i[-1]), name="split_heads")


def _merge_last(x, head_dim: int):
    from tvm import te
    shape = [*x.shape[:-2], x.shape[-2] * head_dim]
    return te.compute(shape, lambda *i: x(*i[:-1], i[-1] // head_dim, i[-1] % head_dim), name="merge_heads")


@relax.expr_functor.mutator
class _HeadReshapeRewriter(relax.PyExprMutator):  # pylint: disable=abstract-method
    def __init__(self, mod: IRModule):
        super().__init__(mod)
        self.rewritten = 0

    def visit_call_(self, call):  # pylint: disable=arguments-renamed
        call = super().visit_call_(call)
        if getattr(call.op, "name", None) == "relax.take":
            return self._take_as_slice(call)
        if getattr(call.op, "name", None) != "relax.reshape":
            return call
        src, dst = _shape(call.args[0]), _shape(call)
        if src is None or dst is None or not (_symbolic(src) or _symbolic(dst)):
            return call
        if len(dst) == len(src) + 1 and same_dims(src[:-1], dst[:-2]):
            heads, head_dim, width = _const_int(dst[-2]), _const_int(dst[-1]), _const_int(src[-1])
            if None not in (heads, head_dim, width) and heads * head_dim == width:
                self.rewritten += 1
                return self.builder_.call_te(_split_last, call.args[0], heads, head_dim,
                                             primfunc_name_hint="split_heads")
        if len(src) == len(dst) + 1 and same_dims(src[:-2], dst[:-1]):
            heads, head_dim, width = _const_int(src[-2]), _const_int(src[-1]), _const_int(dst[-1])
            if None not in (heads, head_dim, width) and heads * head_dim == width:
                self.rewritten += 1
                return self.builder_.call_te(_merge_last, call.args[0], head_dim,
                                             primfunc_name_hint="merge_heads")
        return call

    def _take_as_slice(self, call):
        """take(x, [a, a + 1, ..., b - 1], axis) as x[a:b] on that axis, x symbolic. Only a
        take in "fast" mode (the ONNX importer's): it trusts its indices to be in range, as
        the slice is told to (assume_inbound); "clip" and "wrap" define what lies past the
        axis, a slice does not. (The analyzer could not prove the range here anyway: the
        token count is a fresh variable by now, dim_vars.)"""
        indices, src = call.args[1], _shape(call.args[0])
        if not isinstance(indices, tvm.ir.GenericConst) or src is None or not _symbolic(src) \
                or str(call.attrs.mode) != "fast":
            return call
        values = indices.value.numpy()
        if values.ndim != 1 or not values.size or values.dtype.kind not in "iu" or values[0] < 0:
            return call
        begin, end = int(values[0]), int(values[0]) + values.size
        if (values != range(begin, end)).any():
            return call
        axis = int(call.attrs.axis) % len(src)
        self.rewritten += 1
        return relax.op.strided_slice(call.args[0], axes=[axis], begin=[begin], end=[end], assume_inbound=True)

    def visit_tuple_getitem_(self, op):  # pylint: disable=arguments-renamed
        op = super().visit_tuple_getitem_(op)
        tup = op.tuple_value
        split = self.lookup_binding(tup) if isinstance(tup, relax.Var) else None
        if call_of(split, "relax.split") is None:
            return op
        src = _shape(split.args[0])
        if src is None or not _symbolic(src):
            return op
        axis = int(split.attrs.axis) % len(src)
        bounds = split_bounds(split, src[axis])
        if bounds is None:
            return op
        i = int(op.index)
        self.rewritten += 1
        return relax.op.strided_slice(split.args[0], axes=[axis], begin=[bounds[i]], end=[bounds[i + 1]],
                                      assume_inbound=True)


@tvm.transform.module_pass(opt_level=0, name="FusableHeadReshapes")
class FusableHeadReshapes:  # pylint: disable=too-few-public-methods
    """Rewrite head splits/merges and splits of symbolic-length tensors so they fuse."""

    def transform_module(self, mod: IRModule, _ctx) -> IRModule:
        rewriter = _HeadReshapeRewriter(mod)
        rewritten = _mutate_relax_functions(rewriter, mod, skip_failures="head reshapes")
        if not rewriter.rewritten:
            return mod
        return relax.transform.DeadCodeElimination()(rewritten)
