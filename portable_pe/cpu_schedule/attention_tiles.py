"""The fused float32 attention kernel: softmax(Q·Kᵀ·scale + bias)·V, scores kept in cache.

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

On AVX-512 the tiles are wide (``wide``): MI = 6 rows of 2·NJ score columns and of 2·EC
output columns, so each broadcast feeds four FMAs instead of two. Computing each row's
max while the scores are written (instead of in a pass of its own) was tried with the
wide tiles and was no faster (B=8 T=512: 14.34 -> 14.77 ms; B=8 T=128: equal).

The scratch (MI rows of S floats: 12 KiB at S = 512 with AVX-512's MI = 6) stays in
L1/L2, so the scores never reach memory. This is not online (flash) softmax: the
whole row is kept, which is fine for encoder lengths (56 KiB at S = 2048).
The kernel is written scheduled (``tirx.is_scheduled``): the schedule rules and
MetaSchedule leave it alone.
"""

from __future__ import annotations

import functools
import math

from . import int8_attention as i8
from .fast_math import _fast_exp
from .softmax_rows import inverse_row_sum_of_lanes, row_max_of_lanes
from .work_claims import CLAIM_ITEMS

# Wide tiles on AVX-512: 6 rows x 4 vectors of 16 are 24 accumulators, plus the 4
# vectors of Kᵀ or V they multiply, of the 32 registers. Against the 7 x 2-vector tiles
# (the kernel alone, 2 threads, 4 heads of 64, outputs bit for bit equal): B=8 T=512
# 15.38 -> 14.34 ms, B=8 T=128 1.254 -> 1.111, B=1 T=201 0.342 -> 0.322, B=8 T=201
# 2.890 -> 2.787. 7 wide rows were 3-4% slower than 6, 5 rows 1-7% slower.
WIDE_LANES = 16
WIDE_TILE_ROWS = 6


@functools.lru_cache(maxsize=None)  # parsing the TVMScript takes ~0.15 s; PrimFuncs are immutable
def attention_kernel(*, heads: int, qk_dim: int, v_dim: int, scale: float, mi: int, nj: int, ec: int,
                     bias_dims: tuple[str, ...] = ("1",), zero_dead_rows: bool = False,
                     q_rows: tuple[int, int] | None = None, merged_out: bool = False, wide: bool = False,
                     int8_scores: bool = False):
    """The fused PrimFunc for static heads / head dims and symbolic batch and lengths.

    ``bias_dims`` names the bias's dims, right-aligned against the scores [B, H, T, S]:
    "b", "h", "t", "s" for a dim it has, "1" for one it broadcasts (size 1), e.g.
    ("h", "t", "s") for a T5 or ALiBi table shared by the batch, ("1",) for no bias (a
    one-element zero). MI x NJ is the score tile, MI x EC the output tile.
    ``zero_dead_rows``: a row whose scores are all -inf (fully masked) gives zeros, as
    ``where(isnan(softmax(s)), 0, softmax(s))`` (torch's SDPA decomposition) does, not NaN.
    ``q_rows`` (width, offset): Q is read where the projection wrote it, a [B, T, width]
    tensor whose head h is columns offset + h·D onward, instead of a [B, H, T, D] copy;
    ``merged_out``: the output is written as [B, T, H·E], the heads merged (head_layouts.py
    says why, and why V is not read in place).
    ``wide``: the score tile is MI x 2·NJ and the output tile MI x 2·EC (two accumulator
    arrays each, so each stays a stack array the registers hold), once S >= 2·NJ; E must
    be a multiple of 2·EC. Each broadcast of Q or P then feeds four FMAs instead of two.
    ``int8_scores``: Q·Kᵀ in int8 on AVX2 (int8_attention.py) wherever there are at least
    int8_attention.INT8_MIN_KEYS keys, float32 below; the kernel then also takes the packed
    keys (kp, ks, kc: int8_attention.pack_k_kernel): (q, kt, v, kp, ks, kc, bias, o).
    """
    from tvm.script import tirx as T

    H, D, E = heads, qk_dim, v_dim

    def bias_shape(B, Tq, S):  # the bias buffer: the score dims it has, 1 for the others
        return tuple({"b": B, "h": H, "t": Tq, "s": S, "1": 1}[d] for d in bias_dims)

    def bias_at(b, h, i, j):  # its element for score (b, h, i, j); called while parsing
        return tuple({"b": b, "h": h, "t": i, "s": j, "1": 0}[d] for d in bias_dims)

    n_ec = E // ec
    neg_inf = -math.inf

    def q_shape(B, Tq):  # per head [B, H, Tq, D], or the projection's rows
        return (B, H, Tq, D) if q_rows is None else (B, Tq, q_rows[0])

    def q_at(b, h, i, d):  # element d of head h's query i (called while parsing)
        return (b, h, i, d) if q_rows is None else (b, i, q_rows[1] + h * D + d)

    def out_shape(B, Tq):
        return (B, Tq, H * E) if merged_out else (B, H, Tq, E)

    def out_at(b, h, i, e):
        return (b, i, h * E + e) if merged_out else (b, h, i, e)

    @T.macro
    def score_tile(p, acc, acc2, q, kt, bias, b, h, i0, j0, Tq, cols, cols2):
        """p[:, j0:j0 + cols + cols2] = the MI rows' scores · scale + bias: the first
        `cols` columns (at most NJ) accumulate in acc, the `cols2` after them (0 or NJ) in
        acc2; each broadcast of Q feeds (cols + cols2) / lanes FMAs."""
        for r in T.unroll(mi):
            for l in T.vectorized(cols):
                acc[r, l] = T.float32(0)
            if cols2 > 0:
                for l in T.vectorized(cols2):
                    acc2[r, l] = T.float32(0)
        for d in range(D):
            for r in T.unroll(mi):
                for l in T.vectorized(cols):
                    acc[r, l] = acc[r, l] + q[q_at(b, h, T.min(i0 + r, Tq - 1), d)] * kt[b, h, d, j0 + l]
                if cols2 > 0:
                    for l in T.vectorized(cols2):
                        acc2[r, l] = acc2[r, l] + q[q_at(b, h, T.min(i0 + r, Tq - 1), d)] * kt[b, h, d, j0 + cols + l]
        for r in T.unroll(mi):
            for l in T.vectorized(cols):
                p[r, j0 + l] = acc[r, l] * T.float32(scale) + bias[bias_at(b, h, T.min(i0 + r, Tq - 1), j0 + l)]
            if cols2 > 0:
                for l in T.vectorized(cols2):
                    p[r, j0 + cols + l] = acc2[r, l] * T.float32(scale) + bias[
                        bias_at(b, h, T.min(i0 + r, Tq - 1), j0 + cols + l)]

    @T.macro
    def softmax_rows(p, row_max, row_inv, lane, s_pad):
        """p's MI score rows (s_pad columns, -inf past S) -> exp(s - row max) in place; row_inv = 1 / row sums."""
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

    @T.macro
    def weighted_values(p, out, out2, row_inv, v, o, b, h, i0, Tq, S):
        """o's rows i0.. = p · v / row sum, EC output columns at a time (2·EC when wide)."""
        if wide:
            for c in range(n_ec // 2):
                for r in T.unroll(mi):
                    for l in T.vectorized(ec):
                        out[r, l] = T.float32(0)
                        out2[r, l] = T.float32(0)
                for j in range(S):
                    for r in T.unroll(mi):
                        for l in T.vectorized(ec):
                            out[r, l] = out[r, l] + p[r, j] * v[b, h, j, 2 * c * ec + l]
                        for l in T.vectorized(ec):
                            out2[r, l] = out2[r, l] + p[r, j] * v[b, h, j, (2 * c + 1) * ec + l]
                for r in range(mi):
                    if i0 + r < Tq:
                        for l in T.vectorized(ec):
                            o[out_at(b, h, i0 + r, 2 * c * ec + l)] = out[r, l] * row_inv[r]
                        for l in T.vectorized(ec):
                            o[out_at(b, h, i0 + r, (2 * c + 1) * ec + l)] = out2[r, l] * row_inv[r]
        else:
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
                            o[out_at(b, h, i0 + r, c * ec + l)] = out[r, l] * row_inv[r]

    @T.macro
    def float_scores(p, acc, acc2, q, kt, bias, b, h, i0, Tq, S, s_pad):
        """p[:, :S] = the MI rows' float32 scores · scale + bias (the narrow case: -inf past S)."""
        # 1. scores · scale + bias, NJ columns at a time (2·NJ when wide). The last
        #    tile ends at S, overlapping the one before (whose values it writes again
        #    unchanged), so every load is a vector in bounds. Per-lane clamped columns
        #    (the narrow case below) compile to scalar code, MI x NJ x D scalar FMAs per
        #    work item however narrow the tail: at 224 x 224 (201 tokens, 6 full blocks
        #    and 9 columns) vit_rope_2d's attention took 2.29 ms of its 4 layers with a
        #    clamped tail, 1.15 ms this way (2 threads).
        if wide and S >= 2 * nj:
            for jb in range(S // (2 * nj)):
                score_tile(p, acc, acc2, q, kt, bias, b, h, i0, jb * 2 * nj, Tq, nj, nj)
            # the last S mod 2·NJ columns: the narrowest tile that covers them, of
            # 16, 32 or 64 (at 201 tokens 9 columns: 16 instead of 64). The kernel alone,
            # B = 8, 6 heads of 64, 2 threads, paired runs against a 64-column tail:
            # 0.94 of its time at 201 tokens, 0.89 at 77, outputs bit for bit equal
            if S % (2 * nj) > nj:
                score_tile(p, acc, acc2, q, kt, bias, b, h, i0, S - 2 * nj, Tq, nj, nj)
            elif S % (2 * nj) > nj // 2:
                score_tile(p, acc, acc2, q, kt, bias, b, h, i0, S - nj, Tq, nj, 0)
            elif S % (2 * nj) > 0:
                score_tile(p, acc, acc2, q, kt, bias, b, h, i0, S - nj // 2, Tq, nj // 2, 0)
        elif S >= nj:
            for jb in range(s_pad // nj):
                score_tile(p, acc, acc2, q, kt, bias, b, h, i0, T.min(jb * nj, S - nj), Tq, nj, 0)
        else:  # fewer columns than one block
            for r in T.unroll(mi):
                for l in T.vectorized(nj):
                    acc[r, l] = T.float32(0)
            for d in range(D):
                for r in T.unroll(mi):
                    for l in range(nj):
                        acc[r, l] = acc[r, l] + q[q_at(b, h, T.min(i0 + r, Tq - 1), d)] * kt[b, h, d, T.min(l, S - 1)]
            for r in T.unroll(mi):
                for l in range(nj):
                    p[r, l] = T.if_then_else(
                        T.Cast("int64", l) < S,
                        acc[r, l] * T.float32(scale) + bias[bias_at(b, h, T.min(i0 + r, Tq - 1), T.min(l, S - 1))],
                        T.float32(neg_inf))

    @T.macro
    def quantized_queries(qa, q_mul, lane, row_max, q, b, h, i0, Tq):
        """qa[r] = the block's query row r in 8 bits, offset to uint8 (int8_attention);
        q_mul[r] = its scale times the softmax's."""
        for r in range(mi):
            for l in T.vectorized(i8.KEY_COLUMNS):
                lane[l] = T.float32(0)
            for c in range(D // i8.KEY_COLUMNS):
                for l in T.vectorized(i8.KEY_COLUMNS):
                    lane[l] = T.max(lane[l], T.fabs(q[q_at(b, h, T.min(i0 + r, Tq - 1), c * i8.KEY_COLUMNS + l)]))
            row_max_of_lanes(row_max, lane, r, i8.KEY_COLUMNS, False, 0)
            q_mul[r] = row_max[r] * T.float32(scale / i8.Q_MAX)
            # row_max[r] as the row's 127 / max|q| from here (the softmax sets it again)
            row_max[r] = T.if_then_else(row_max[r] > T.float32(0), T.float32(i8.Q_MAX) / row_max[r], T.float32(0))
            for c in range(D // i8.KEY_COLUMNS):
                for l in T.vectorized(i8.KEY_COLUMNS):
                    qa[r, c * i8.KEY_COLUMNS + l] = T.Cast("uint8", T.Cast("int32", T.round(
                        q[q_at(b, h, T.min(i0 + r, Tq - 1), c * i8.KEY_COLUMNS + l)] * row_max[r])) + i8.Q_OFFSET)

    @T.macro
    def int8_score_tile(p, iacc, qa, q_mul, kp, ks, kc, bias, b, h, i0, jt, Tq, S, tail):
        """p[:, 8·jt:8·jt + 8] = the MI rows' scores against keys 8·jt.. (int8_attention's
        products) · scale + bias; `tail`: the last block, whose keys past S read S - 1's bias."""
        for r in T.unroll(mi):
            for l in T.vectorized(i8.KEY_COLUMNS):
                iacc[r, l] = 0
        for g in range(D // i8.GROUP):
            for r in T.unroll(mi):
                iacc[r, T.ramp(T.int32(0), 1, i8.KEY_COLUMNS)] = iacc.vload([r, 0], "int32x8") + i8.dot4(
                    T.reinterpret(qa.vload([r, g * i8.GROUP], "uint8x4"), dtype="int32"),
                    kp.vload([b, h, jt, g, 0], "int8x32"))
        for r in T.unroll(mi):
            for l in T.vectorized(i8.KEY_COLUMNS):
                p[r, jt * i8.KEY_COLUMNS + l] = T.Cast("float32", iacc[r, l] - kc[b, h, jt * i8.KEY_COLUMNS + l]) * (
                    ks[b, h, jt * i8.KEY_COLUMNS + l] * q_mul[r]) + bias[bias_at(
                        b, h, T.min(i0 + r, Tq - 1),
                        T.min(jt * i8.KEY_COLUMNS + l, S - 1) if tail else jt * i8.KEY_COLUMNS + l)]

    @T.macro
    def attention_rows(q, kt, v, bias, o, kp, ks, kc, B, Tq, S):
        """The kernel's work items, each MI query rows of one (batch, head): their scores
        (int8 from the packed keys kp, ks, kc with ``int8_scores`` and at least
        INT8_MIN_KEYS keys, else float32 from Kᵀ), softmax and P·V."""
        n_rb = T.meta_var((Tq + (mi - 1)) // mi)
        # Scalars are inlined (meta_var), not assigned: TVMScript makes an assigned scalar a
        # one-element buffer (a heap workspace per work item, reloaded in every loop).
        s_pad = T.meta_var((S + (nj - 1)) // nj * nj)
        for item in T.parallel(B * H * n_rb, annotations={CLAIM_ITEMS: 1}):
            b = T.meta_var(item // (H * n_rb))
            h = T.meta_var(item // n_rb % H)
            i0 = T.meta_var(item % n_rb * mi)
            p = T.decl_buffer((mi, s_pad), "float32")
            acc = T.decl_buffer((mi, nj), "float32")
            acc2 = T.decl_buffer((mi, nj), "float32")  # the wide tile's second half
            row_max = T.decl_buffer((mi,), "float32")
            row_inv = T.decl_buffer((mi,), "float32")
            lane = T.decl_buffer((nj,), "float32")
            out = T.decl_buffer((mi, ec), "float32")
            out2 = T.decl_buffer((mi, ec), "float32")  # the wide tile's second half
            # 1. scores · scale + bias. int8 (where there are enough keys: the packing
            #    kernel skips the others) 8 keys at a time; s_pad >= 8·S8, so the tail
            #    block fits
            if int8_scores:
                if S >= i8.INT8_MIN_KEYS:
                    qa = T.decl_buffer((mi, D), "uint8")
                    q_mul = T.decl_buffer((mi,), "float32")
                    iacc = T.decl_buffer((mi, i8.KEY_COLUMNS), "int32")
                    quantized_queries(qa, q_mul, lane, row_max, q, b, h, i0, Tq)
                    for jt in range(S // i8.KEY_COLUMNS):
                        int8_score_tile(p, iacc, qa, q_mul, kp, ks, kc, bias, b, h, i0, jt, Tq, S, False)
                    if S % i8.KEY_COLUMNS > 0:
                        int8_score_tile(p, iacc, qa, q_mul, kp, ks, kc, bias, b, h, i0, S // i8.KEY_COLUMNS, Tq, S,
                                        True)
                else:
                    float_scores(p, acc, acc2, q, kt, bias, b, h, i0, Tq, S, s_pad)
            else:
                float_scores(p, acc, acc2, q, kt, bias, b, h, i0, Tq, S, s_pad)
            # the columns past S in the last block (float32's narrow case wrote them already)
            for r in range(mi):
                for l in range(s_pad - S):
                    p[r, S + l] = T.float32(neg_inf)
            softmax_rows(p, row_max, row_inv, lane, s_pad)
            weighted_values(p, out, out2, row_inv, v, o, b, h, i0, Tq, S)

    # only the kernel asked for is parsed (each takes ~0.15 s)
    if not int8_scores:
        @T.prim_func(private=True)
        def fused_attention(q_h: T.handle, kt_h: T.handle, v_h: T.handle, bias_h: T.handle, o_h: T.handle):
            T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True})
            B = T.int64()
            Tq = T.int64()
            S = T.int64()
            q = T.match_buffer(q_h, q_shape(B, Tq), "float32")
            kt = T.match_buffer(kt_h, (B, H, D, S), "float32")
            v = T.match_buffer(v_h, (B, H, S, E), "float32")
            bias = T.match_buffer(bias_h, bias_shape(B, Tq, S), "float32")
            o = T.match_buffer(o_h, out_shape(B, Tq), "float32")
            attention_rows(q, kt, v, bias, o, None, None, None, B, Tq, S)

        return fused_attention

    @T.prim_func(private=True)
    def fused_attention_int8(q_h: T.handle, kt_h: T.handle, v_h: T.handle, kp_h: T.handle, ks_h: T.handle,
                             kc_h: T.handle, bias_h: T.handle, o_h: T.handle):
        T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True})
        B = T.int64()
        Tq = T.int64()
        S = T.int64()
        q = T.match_buffer(q_h, q_shape(B, Tq), "float32")
        kt = T.match_buffer(kt_h, (B, H, D, S), "float32")  # before the packed keys: it binds S
        v = T.match_buffer(v_h, (B, H, S, E), "float32")
        kp = T.match_buffer(kp_h, (B, H, i8.key_blocks(S), D // i8.GROUP, i8.KEY_COLUMNS * i8.GROUP), "int8")
        ks = T.match_buffer(ks_h, (B, H, i8.key_blocks(S) * i8.KEY_COLUMNS), "float32")
        kc = T.match_buffer(kc_h, (B, H, i8.key_blocks(S) * i8.KEY_COLUMNS), "int32")
        bias = T.match_buffer(bias_h, bias_shape(B, Tq, S), "float32")
        o = T.match_buffer(o_h, out_shape(B, Tq), "float32")
        attention_rows(q, kt, v, bias, o, kp, ks, kc, B, Tq, S)

    return fused_attention_int8
