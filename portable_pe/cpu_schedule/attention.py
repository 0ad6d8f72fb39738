"""One kernel for softmax(Q·Kᵀ·scale + bias)·V on the CPU, scores kept in cache.

Unfused, attention is three kernels (QK^T with the scale, softmax, P@V) and the
[B, H, T, S] scores make three round trips through memory: at B=8 T=512 with 4
heads that is 32 MiB written, read, written and read again per layer, and the two matmuls pad
copies of their operands because T is symbolic. Here each parallel work item
takes a block of MI query rows of one (batch, head) and

1. computes their score rows into a [MI, S] scratch (an MI x NJ register tile,
   one broadcast Q element feeding NJ/lanes FMAs against a contiguous Kᵀ row),
   adds scale and bias, pads the columns past S with -inf;
2. turns each row into exp(s - max) in place and keeps 1/sum;
3. accumulates P·V in an MI x EC register tile and scales it by 1/sum.

The scratch (MI rows of S floats: 14 KiB at S = 512 with AVX-512's MI = 7) stays in
L1/L2, so the scores never reach memory. This is not online (flash) softmax: the
whole row is kept, which is fine for encoder lengths (56 KiB at S = 2048).
The kernel is written scheduled (``tirx.is_scheduled``): the schedule rules and
MetaSchedule leave it alone.
"""

from __future__ import annotations

import functools
import logging
import math

import numpy as np

import tvm
from tvm import relax
from tvm.ir import IRModule

from . import bf16_attention, bf16_pack_k
from .bf16_isa import bf16_kernel
from .fast_math import _fast_exp  # noqa: F401 (the kernels' exp; tests import it from here)
from .matmul import _register_tile
from .relax_util import INJECTIVE, OPAQUE, _mutate_relax_functions, _tensor_type, bound_call, mark_op_pattern, rewrite_matmul
from .softmax_rows import inverse_row_sum_of_lanes, row_max_of_lanes
from .tir_util import _const_int, _vector_lanes

logger = logging.getLogger(__package__)


@functools.lru_cache(maxsize=None)  # parsing the TVMScript takes ~0.15 s; PrimFuncs are immutable
def attention_kernel(*, heads: int, qk_dim: int, v_dim: int, scale: float, mi: int, nj: int, ec: int,
                     bias_dims: tuple[str, ...] = ("1",), zero_dead_rows: bool = False):
    """The fused PrimFunc for static heads / head dims and symbolic batch and lengths.

    ``bias_dims`` names the bias's dims, right-aligned against the scores [B, H, T, S]:
    "b", "h", "t", "s" for a dim it has, "1" for one it broadcasts (size 1), e.g.
    ("h", "t", "s") for a T5 or ALiBi table shared by the batch, ("1",) for no bias (a
    one-element zero). MI x NJ is the score tile, MI x EC the output tile.
    ``zero_dead_rows``: a row whose scores are all -inf (fully masked) gives zeros, as
    ``where(isnan(softmax(s)), 0, softmax(s))`` (torch's SDPA decomposition) does, not NaN.
    """
    from tvm.script import tirx as T

    H, D, E = heads, qk_dim, v_dim

    def bias_shape(B, Tq, S):  # the bias buffer: the score dims it has, 1 for the others
        return tuple({"b": B, "h": H, "t": Tq, "s": S, "1": 1}[d] for d in bias_dims)

    def bias_at(b, h, i, j):  # its element for score (b, h, i, j); called while parsing
        return tuple({"b": b, "h": h, "t": i, "s": j, "1": 0}[d] for d in bias_dims)

    n_ec = E // ec
    neg_inf = -math.inf

    @T.prim_func(private=True)
    def fused_attention(q_h: T.handle, kt_h: T.handle, v_h: T.handle, bias_h: T.handle, o_h: T.handle):
        T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True})
        B = T.int64()
        Tq = T.int64()
        S = T.int64()
        q = T.match_buffer(q_h, (B, H, Tq, D), "float32")
        kt = T.match_buffer(kt_h, (B, H, D, S), "float32")
        v = T.match_buffer(v_h, (B, H, S, E), "float32")
        bias = T.match_buffer(bias_h, bias_shape(B, Tq, S), "float32")
        o = T.match_buffer(o_h, (B, H, Tq, E), "float32")
        n_rb = T.meta_var((Tq + (mi - 1)) // mi)
        # Scalars are inlined (meta_var), not assigned: TVMScript makes an assigned scalar a
        # one-element buffer (a heap workspace per work item, reloaded in every loop).
        s_pad = T.meta_var((S + (nj - 1)) // nj * nj)
        for item in T.parallel(B * H * n_rb):
            b = T.meta_var(item // (H * n_rb))
            h = T.meta_var(item // n_rb % H)
            i0 = T.meta_var(item % n_rb * mi)
            p = T.decl_buffer((mi, s_pad), "float32")
            acc = T.decl_buffer((mi, nj), "float32")
            row_max = T.decl_buffer((mi,), "float32")
            row_inv = T.decl_buffer((mi,), "float32")
            lane = T.decl_buffer((nj,), "float32")
            out = T.decl_buffer((mi, ec), "float32")
            # 1. scores · scale + bias, NJ columns at a time. The last block ends at S,
            #    overlapping the one before (whose values it writes again unchanged), so
            #    every load is a vector in bounds. Per-lane clamped columns (the narrow
            #    case below) compile to scalar code, MI x NJ x D scalar FMAs per work item
            #    however narrow the tail: at 224 x 224 (201 tokens, 6 full blocks and 9
            #    columns) vit_rope_2d's attention took 2.29 ms of its 4 layers with a
            #    clamped tail, 1.15 ms this way (2 threads).
            if S >= nj:
                for jb in range(s_pad // nj):
                    j0 = T.meta_var(T.min(jb * nj, S - nj))
                    for r in T.unroll(mi):
                        for l in T.vectorized(nj):
                            acc[r, l] = T.float32(0)
                    for d in range(D):
                        for r in T.unroll(mi):
                            for l in T.vectorized(nj):
                                acc[r, l] = acc[r, l] + q[b, h, T.min(i0 + r, Tq - 1), d] * kt[b, h, d, j0 + l]
                    for r in T.unroll(mi):
                        for l in T.vectorized(nj):
                            p[r, j0 + l] = acc[r, l] * T.float32(scale) + bias[
                                bias_at(b, h, T.min(i0 + r, Tq - 1), j0 + l)]
                for r in range(mi):
                    for l in range(s_pad - S):
                        p[r, S + l] = T.float32(neg_inf)
            else:  # fewer columns than one block
                for r in T.unroll(mi):
                    for l in T.vectorized(nj):
                        acc[r, l] = T.float32(0)
                for d in range(D):
                    for r in T.unroll(mi):
                        for l in range(nj):
                            acc[r, l] = acc[r, l] + q[b, h, T.min(i0 + r, Tq - 1), d] * kt[b, h, d, T.min(l, S - 1)]
                for r in T.unroll(mi):
                    for l in range(nj):
                        p[r, l] = T.if_then_else(
                            T.Cast("int64", l) < S,
                            acc[r, l] * T.float32(scale) + bias[bias_at(b, h, T.min(i0 + r, Tq - 1), T.min(l, S - 1))],
                            T.float32(neg_inf))
            # 2. p = exp(s - row max) in place, 1/row sum kept
            for r in range(mi):
                for l in T.vectorized(nj):
                    lane[l] = T.float32(neg_inf)
                for jb in range(s_pad // nj):
                    for l in T.vectorized(nj):
                        lane[l] = T.max(lane[l], p[r, jb * nj + l])
                row_max_of_lanes(row_max, lane, r, nj, zero_dead_rows, 0)
                for jb in range(s_pad // nj):
                    for l in T.vectorized(nj):
                        p[r, jb * nj + l] = _fast_exp(p[r, jb * nj + l] - row_max[r])
                        lane[l] = lane[l] + p[r, jb * nj + l]
                inverse_row_sum_of_lanes(row_inv, lane, r, nj, zero_dead_rows, 0)
            # 3. out = p · v / row sum, EC output columns at a time
            for c in range(n_ec):
                for r in T.unroll(mi):
                    for l in T.vectorized(ec):
                        out[r, l] = T.float32(0)
                for j in range(S):
                    for r in T.unroll(mi):
                        for l in T.vectorized(ec):
                            out[r, l] = out[r, l] + p[r, j] * v[b, h, j, c * ec + l]
                for r in range(mi):
                    if i0 + r < Tq:
                        for l in T.vectorized(ec):
                            o[b, h, i0 + r, c * ec + l] = out[r, l] * row_inv[r]

    return fused_attention


# --------------------------------------------------------------------------------------
# Relax: find softmax(matmul(Q, Kᵀ) · c [+ bias]) @ V and call the fused kernel instead
# --------------------------------------------------------------------------------------
def _scalar_constant(expr) -> float | None:
    # TVM 0.27: Relax constants are tvm.ir.GenericConst, their tensor in ``value``
    if isinstance(expr, tvm.ir.GenericConst) and expr.value.numpy().size == 1:
        return float(expr.value.numpy().reshape(()))
    return None


@relax.expr_functor.mutator
class _AttentionFuser(relax.PyExprMutator):  # pylint: disable=abstract-method
    def __init__(self, mod: IRModule, target, *, bf16: bool = False, failures=None):
        super().__init__(mod)
        self.failures = failures
        # --precision bf16 on AMX: the two products on the tiles (bf16_attention)
        self.amx = bf16 and bf16_kernel(target) == "amx-bf16"
        self.lanes = _vector_lanes(target)
        self.mi, self.nj = _register_tile(target, self.lanes, None, None)
        self.kernels: dict[tuple, relax.GlobalVar] = {}
        self.injective: set = set()  # the bf16 packs' GlobalVars (mark_op_pattern, once the builder is done)
        self.opaque: set = set()  # bf16_pack_k's kernels: hand-scheduled, FuseOps leaves them alone
        self.fused = 0

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
        key = (heads, d, e, scale, self.mi, self.nj, ec, layout, zero_dead_rows)
        if key not in self.kernels:
            func = attention_kernel(heads=heads, qk_dim=d, v_dim=e, scale=scale, mi=self.mi, nj=self.nj, ec=ec,
                                    bias_dims=layout, zero_dead_rows=zero_dead_rows)
            self.kernels[key] = self.builder_.add_func(func, "fused_attention")
        self.fused += 1
        out = relax.TensorType([qs[0], qs[1], qs[2], vs[3]], "float32")
        return relax.call_tir(self.kernels[key], [q, kt, v, bias], out)

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
    (--precision bf16): on AMX, the kernel whose two products run on the tiles. A fusion
    that raises is recorded in ``failures`` (failures.PipelineFailures), when given."""

    def __init__(self, bf16: bool = False, failures=None):
        self.bf16 = bf16
        self.failures = failures

    def transform_module(self, mod: IRModule, _ctx) -> IRModule:
        target = tvm.target.Target.current(allow_none=True)
        if target is None or target.kind.name != "llvm":
            return mod
        fuser = _AttentionFuser(mod, target, bf16=self.bf16, failures=self.failures)
        fused = _mutate_relax_functions(fuser, mod)
        if not fuser.fused:
            return mod
        fused = mark_op_pattern(fused, {**dict.fromkeys(fuser.injective, INJECTIVE), **dict.fromkeys(fuser.opaque, OPAQUE)})
        return relax.transform.DeadCodeElimination()(fused)
