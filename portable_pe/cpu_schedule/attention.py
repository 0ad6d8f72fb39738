"""Attention on the CPU as one kernel: find softmax(Q·Kᵀ·c [+ bias])·V in a Relax
function and call the fused kernel (attention_tiles.py) instead.

Float32 gets attention_tiles' kernel, on AVX-512 with its wide tiles; Q is read where its
projection wrote it and the output written with the heads merged, where the graph allows
(head_layouts.py). --precision bf16 (and int8 on AMX) gets bf16_attention's kernel, whose
two products run on the AMX tiles. --precision int8 on AVX2 without VNNI takes Q·Kᵀ in
int8 (int8_attention.py: the keys quantized and packed by a kernel of their own).
"""

from __future__ import annotations

import logging

import numpy as np

import tvm
from tvm import relax
from tvm.ir import IRModule

from . import bf16_attention, bf16_pack_k, int8_attention
from .attention_tiles import WIDE_LANES, WIDE_TILE_ROWS, attention_kernel
from .bf16_isa import bf16_kernel
from .fast_math import _fast_exp  # noqa: F401 (the kernels' exp; tests import it from here)
from .head_layouts import merged_output, projection_rows
from .matmul import _register_tile
from .relax_util import (INJECTIVE, OPAQUE, _mutate_relax_functions, _tensor_type, bound_call, constant_array,
                         mark_op_pattern, rewrite_matmul)
from .tir_util import _const_int, _vector_lanes

logger = logging.getLogger(__package__)


# --------------------------------------------------------------------------------------
# Relax: find softmax(matmul(Q, Kᵀ) · c [+ bias]) @ V and call the fused kernel instead
# --------------------------------------------------------------------------------------
def _scalar_constant(expr) -> float | None:
    value = constant_array(expr)
    return float(value.reshape(())) if value is not None and value.size == 1 else None


@relax.expr_functor.mutator
class _AttentionFuser(relax.PyExprMutator):  # pylint: disable=abstract-method
    def __init__(self, mod: IRModule, target, *, bf16: bool = False, int8: bool = False, failures=None):
        super().__init__(mod)
        self.failures = failures
        # --precision bf16 on AMX: the two products on the tiles (bf16_attention)
        self.amx = bf16 and bf16_kernel(target) == "amx-bf16"
        # --precision int8 on AVX2 without VNNI: Q·Kᵀ on vpmaddubsw (int8_attention)
        self.int8 = int8 and not self.amx and int8_attention.runs_on(target)
        self.lanes = _vector_lanes(target)
        self.mi, self.nj = _register_tile(target, self.lanes, None, None)
        self.kernels: dict[tuple, relax.GlobalVar] = {}
        self.injective: set = set()  # the bf16 packs' GlobalVars (mark_op_pattern, once the builder is done)
        self.opaque: set = set()  # bf16_pack_k's kernels: hand-scheduled, FuseOps leaves them alone
        self.fused = 0
        self.values, self.users = {}, {}  # the block being visited: its bindings, their readers
        self.binding = None  # the var of the binding being visited
        self.merged: dict = {}  # a head merge's var -> the kernel's merged output it now is

    def visit_dataflow_block_(self, block):  # pylint: disable=arguments-renamed
        self.values = {b.var: b.value for b in block.bindings if isinstance(b, relax.VarBinding)}
        self.users, self.merged = relax.analysis.udchain(block), {}
        return super().visit_dataflow_block_(block)

    def visit_var_binding_(self, binding):
        if binding.var in self.merged:  # the kernel wrote this merge already
            self.set_var_remap(binding.var, self.merged[binding.var])
            return
        self.binding = binding.var
        super().visit_var_binding_(binding)

    def _bound(self, expr, op_name: str):
        """The call ``expr`` is bound to, when it is a call of ``op_name``."""
        return bound_call(self, expr, op_name)

    def visit_call_(self, call):  # pylint: disable=arguments-renamed
        return rewrite_matmul(super().visit_call_(call), self._fuse, logger, "attention not fused", self.failures)

    def _dead_rows_zeroed(self, probs):
        """(softmax output, True) for where(isnan(p), 0, p); (probs, False) otherwise."""
        where = self._bound(probs, "relax.where")
        if where is None:
            return probs, False
        cond, zero, p = where.args
        isnan = self._bound(cond, "relax.isnan")
        if isnan is None or not isnan.args[0].same_as(p) or _scalar_constant(zero) != 0.0:
            return None, False
        return p, True

    def _scaled_qk(self, logits):
        """(q, kt, scale) for matmul(q, kt) · c, or for matmul(q · a, kt · b) (torch's SDPA
        decomposition scales each side by sqrt(scale)); None otherwise."""
        scaled = self._bound(logits, "relax.multiply")
        scale = 1.0
        if scaled is not None:
            scale, logits = _scalar_constant(scaled.args[1]), scaled.args[0]
        qk = self._bound(logits, "relax.matmul")
        if scale is None or qk is None:
            return None
        sides = list(qk.args)
        for k, side in enumerate(sides):
            mul = self._bound(side, "relax.multiply")
            factor = _scalar_constant(mul.args[1]) if mul is not None else None
            if factor is not None:
                sides[k], scale = mul.args[0], scale * factor
        return sides[0], sides[1], scale

    def _fuse(self, pv):
        probs, zero_dead_rows = self._dead_rows_zeroed(pv.args[0])
        softmax = self._bound(probs, "relax.nn.softmax") if probs is not None else None
        if softmax is None:
            return None
        logits, bias = softmax.args[0], None
        add = self._bound(logits, "relax.add")
        if add is not None:
            for a, b in (add.args, add.args[::-1]):
                if self._bound(a, "relax.multiply") is not None or self._bound(a, "relax.matmul") is not None:
                    logits, bias = a, b
                    break
            else:
                return None
        found = self._scaled_qk(logits)
        if found is None:
            return None
        q, kt, scale = found
        v = pv.args[1]
        infos = [_tensor_type(x) for x in (q, kt, v, pv)]
        if any(i is None for i in infos) or any(dt != "float32" or len(shape) != 4 for dt, shape in infos):
            return None
        axis = int(softmax.attrs.axis)
        if axis not in (-1, 3):
            return None
        (_, qs), (_, ks), (_, vs), _ = infos
        heads, d, d_k, e = _const_int(qs[1]), _const_int(qs[3]), _const_int(ks[2]), _const_int(vs[3])
        if None in (heads, d, d_k, e) or d != d_k or e % self.lanes:
            return None
        ana = tvm.sym.Analyzer()
        same = lambda a, b: ana.can_prove_equal(a, b)  # noqa: E731
        if not (same(qs[0], ks[0]) and same(qs[0], vs[0]) and same(qs[1], ks[1]) and same(qs[1], vs[1])
                and same(ks[3], vs[2])):
            return None
        score_shape = [qs[0], qs[1], qs[2], ks[3]]
        layout = self._bias_layout(bias, score_shape, same)
        if layout is None:
            return None
        if bias is None:
            bias = relax.const(np.zeros((1,), "float32"))
        if self.amx and bf16_attention.fits(d, e):
            return self._amx_call(q, kt, v, bias, heads, d, e, scale, layout, zero_dead_rows, qs, vs)
        ec = 2 * self.lanes if e % (2 * self.lanes) == 0 else self.lanes
        wide = self.lanes == WIDE_LANES and e % (2 * ec) == 0
        mi = WIDE_TILE_ROWS if wide else self.mi
        # Q and the output where the projection and the next dense have them (head_layouts)
        q_found = projection_rows(self.lookup_binding, q, heads=heads, dim=d, batch=qs[0], length=qs[2])
        q, q_rows = q_found if q_found is not None else (q, None)
        merge = merged_output(self.binding, self.values, self.users, heads=heads, dim=e, batch=qs[0], length=qs[2])
        int8 = self.int8 and not wide and int8_attention.fits(d)
        key = (heads, d, e, scale, mi, self.nj, ec, layout, zero_dead_rows, q_rows, merge is not None, wide, int8)
        if key not in self.kernels:
            func = attention_kernel(heads=heads, qk_dim=d, v_dim=e, scale=scale, mi=mi, nj=self.nj, ec=ec,
                                    bias_dims=layout, zero_dead_rows=zero_dead_rows, q_rows=q_rows,
                                    merged_out=merge is not None, wide=wide, int8_scores=int8)
            self.kernels[key] = self.builder_.add_func(func, "fused_attention_int8" if int8 else "fused_attention")
        self.fused += 1
        args = [q, kt, v, *self._int8_keys(kt, heads, d, ks), bias] if int8 else [q, kt, v, bias]
        if merge is None:
            out = relax.TensorType([qs[0], qs[1], qs[2], vs[3]], "float32")
            return relax.call_tir(self.kernels[key], args, out)
        merged = self.builder_.emit(relax.call_tir(self.kernels[key], args,
                                                   relax.TensorType([qs[0], qs[2], heads * e], "float32")))
        self.merged[merge] = merged
        # the heads-first value the matmul stood for (read by nothing once the merge is
        # replaced: DeadCodeElimination drops it)
        per_head = self.builder_.emit(relax.op.reshape(merged, [qs[0], qs[2], heads, e]))
        return relax.op.permute_dims(per_head, [0, 2, 1, 3])

    def _amx_call(self, q, kt, v, bias, heads, d, e, scale, layout, zero_dead_rows, qs, vs):
        bb = self.builder_
        calls = [bb.call_te(bf16_attention.pack_q, q, scale, primfunc_name_hint="pack_q"),
                 self._packed_keys(kt, heads, d),
                 bb.call_te(bf16_attention.pack_v, v, primfunc_name_hint="pack_v")]
        # Q's and V's packs are injective (each element one read of its operand): FuseOps may
        # fuse them into the kernels that make their operands (AnnotateTIROpPattern would call
        # their clamped, guarded reads opaque). Not Kᵀ's: fused with the transpose that makes
        # Kᵀ, each packed vector would gather 16 keys' rows (measured: 17% of the sinusoidal
        # graph's time at B=8 T=512, against 6% for the transpose and the pack apart); where
        # Kᵀ transposes key rows, bf16_pack_k packs those rows instead
        self.injective |= {calls[0].args[0], calls[2].args[0]}
        packed = [bb.emit(call) for call in calls]
        key = ("amx", heads, d, e, layout, zero_dead_rows)
        if key not in self.kernels:
            func = bf16_attention.amx_attention_kernel(heads=heads, qk_dim=d, v_dim=e, bias_dims=layout,
                                                       zero_dead_rows=zero_dead_rows)
            self.kernels[key] = self.builder_.add_func(func, "fused_attention_bf16")
        self.fused += 1
        out = relax.TensorType([qs[0], qs[1], qs[2], vs[3]], "float32")
        keys = bb.emit(relax.op.zeros(relax.ShapeExpr([vs[2]]), "uint8"))  # S bytes: the key count as a shape
        return relax.call_tir(self.kernels[key], [*packed, keys, bias], out)

    def _int8_keys(self, kt, heads, d, kt_shape):
        """(kp, ks, kc): Kᵀ quantized and packed for the int8 scores (int8_attention.pack_k_kernel)."""
        key = ("pack_k_int8", heads, d)
        if key not in self.kernels:
            self.kernels[key] = self.builder_.add_func(int8_attention.pack_k_kernel(heads=heads, qk_dim=d), "pack_k_int8")
            self.opaque.add(self.kernels[key])
        batch, keys = kt_shape[0], kt_shape[3]
        blocks = int8_attention.key_blocks(keys)
        columns = blocks * int8_attention.KEY_COLUMNS
        packed = self.builder_.emit(relax.call_tir(self.kernels[key], [kt], [
            relax.TensorType([batch, heads, blocks, d // int8_attention.GROUP,
                              int8_attention.KEY_COLUMNS * int8_attention.GROUP], "int8"),
            relax.TensorType([batch, heads, columns], "float32"),
            relax.TensorType([batch, heads, columns], "int32")]))
        return [self.builder_.emit(relax.TupleGetItem(packed, i)) for i in range(3)]

    def _packed_keys(self, kt, heads, d):
        """The call that packs Kᵀ for the AMX kernel: from the rows Kᵀ transposes or the
        projection K slices (bf16_pack_k.key_source), else from Kᵀ itself (bf16_attention.pack_kt)."""
        source = bf16_pack_k.key_source(kt, heads, d, bound=self._bound, binding=self.lookup_binding)
        if source is None:
            return self.builder_.call_te(bf16_attention.pack_kt, kt, primfunc_name_hint="pack_kt")
        key = ("pack_k", heads, d, *sorted(source.options.items()))
        if key not in self.kernels:
            self.kernels[key] = self.builder_.add_func(
                bf16_pack_k.pack_k_kernel(heads=heads, head_dim=d, **source.options), "pack_k")
            self.opaque.add(self.kernels[key])
        out = relax.TensorType([source.batch, heads, bf16_pack_k.packed_keys(source.keys), d // 2, 16], "uint32")
        return relax.call_tir(self.kernels[key], source.args, out)

    @staticmethod
    def _bias_layout(bias, score_shape, same) -> tuple[str, ...] | None:
        """The kernel's ``bias_dims`` for this bias (("1",) for none), or None when the
        bias does not broadcast to the scores. The bias is passed as it is: reshaping a
        table the layers share would be one more call per layer."""
        if bias is None:
            return ("1",)
        info = _tensor_type(bias)
        if info is None or info[0] != "float32" or not 1 <= len(info[1]) <= 4:
            return None
        rank = len(info[1])
        layout = []
        for dim, full, name in zip(info[1], score_shape[4 - rank:], "bhts"[4 - rank:]):
            if _const_int(dim) == 1:
                layout.append("1")
            elif same(dim, full):
                layout.append(name)
            else:
                return None
        return tuple(layout)


@tvm.transform.module_pass(opt_level=0, name="FuseAttention")
class FuseAttention:  # pylint: disable=too-few-public-methods
    """Replace softmax(Q·Kᵀ·c [+ bias])·V (float32, 4-D) by one call of the fused kernel.

    CPU (llvm) targets only; before legalization, so the unfused ops never get
    scheduled. Intermediates the fused call no longer needs are dropped. ``bf16``
    (--precision bf16): on AMX, the kernel whose two products run on the tiles. ``int8``
    (--precision int8): on AVX2 without VNNI, Q·Kᵀ in int8 (int8_attention). A fusion
    that raises is recorded in ``failures`` (failures.PipelineFailures), when given."""

    def __init__(self, bf16: bool = False, int8: bool = False, failures=None):
        self.bf16 = bf16
        self.int8 = int8
        self.failures = failures

    def transform_module(self, mod: IRModule, _ctx) -> IRModule:
        target = tvm.target.Target.current(allow_none=True)
        if target is None or target.kind.name != "llvm":
            return mod
        fuser = _AttentionFuser(mod, target, bf16=self.bf16, int8=self.int8, failures=self.failures)
        fused = _mutate_relax_functions(fuser, mod)
        if not fuser.fused:
            return mod
        fused = mark_op_pattern(fused, {**dict.fromkeys(fuser.injective, INJECTIVE), **dict.fromkeys(fuser.opaque, OPAQUE)})
        return relax.transform.DeadCodeElimination()(fused)
