"""--precision bf16 with AMX: the fused attention's two matmuls on AMX tiles.

The float32 kernel (attention.py) computes softmax(Q·Kᵀ·scale + bias)·V per block of
query rows with FMAs. Here, per 32 query rows of one (batch, head):

1. S [32, S'] = Q16 x K16 on AMX (amx_tiles' micro-kernel, S'/32 blocks in one call),
   Q scaled before it was rounded (pack_q); where a [.., T, S] bias covers the item's
   32 rows and S is a multiple of 32, the tiles start from the bias block instead of
   zero, so the bias costs tile loads and no pass over the scores (with _item_indices'
   head-major order, ALiBi's and T5's bf16 graphs ran 6-8% faster at B = 8, T = 512 on
   2 threads, as fast as with the bias left out);
2. per row, in float32: the bias (unless the tiles added it) and the row max in one
   pass (-inf past the last key), then exp(s - max), its sum, and the probabilities
   rounded to bf16 (vcvtneps2bf16) for the second matmul in a second;
3. O [32, E] = P16 x V16 on AMX, scaled by 1/sum in float32.

Q, Kᵀ and V come rounded to bf16 and laid out for the tiles by three small kernels
(``pack_*``, one pass over each, which FuseOps may fuse into the kernels that make them):
Q with its rows padded to 32, Kᵀ and V in the VNNI pairs layout the micro-kernel takes
as its B operand, their key axis padded to 32 with zeros. The scores, the softmax and
the output scaling stay float32; what is bf16 is the operands of the two products, as in
a bf16 linear layer (bf16_linear). Needs head dims that are multiples of 32.
"""

from __future__ import annotations

import functools
import math
import operator

from tvm import te, tirx

from .fast_math import _fast_exp
from .amx_tiles import AMX_IR, amx_scope_call
from .bf16_isa import BF16_ROUND_IR
from .bf16_linear import bf16_bits_expr
from .softmax_rows import inverse_row_sum_of_lanes, row_max_of_lanes
from .work_claims import CLAIM_ITEMS

_ROWS = 32   # query rows per work item: one AMX block
_KEYS = 32   # the key axis is padded to this (one AMX block of S, and K-steps of P x V)
_INTERLEAVED = 4  # score rows whose max chains run side by side


def fits(qk_dim: int, v_dim: int) -> bool:
    return qk_dim % 32 == 0 and v_dim % 32 == 0


def _padded(n, to: int):
    return (n + (to - 1)) // to * to


def pack_q(q: te.Tensor, scale: float) -> te.Tensor:
    """[B, H, T, D] float32 -> Q·scale as [B, H, T', D] bf16 bits, T' = T rounded up to 32
    (zero rows). The scores come out scaled; for a power-of-two scale (1/sqrt(64) = 1/8)
    the rounding is that of Q itself."""
    b, h, t, d = q.shape
    factor = tirx.const(scale, "float32")
    return te.compute((b, h, _padded(t, _ROWS), d),
                      lambda i, j, r, c: tirx.if_then_else(
                          r < t, bf16_bits_expr(q[i, j, tirx.min(r, t - 1), c] * factor), tirx.const(0, "uint16")),
                      name="pack_q")


def _pair(low, high):
    """Two bf16 bit patterns as one uint32, the first in the low half: in memory, the
    [..., 16, 2] pairs layout (x86 is little-endian), written as one contiguous vector."""
    return tirx.bitwise_or(tirx.shift_left(bf16_bits_expr(high, dtype="uint32"), tirx.const(16, "uint32")),
                           bf16_bits_expr(low, dtype="uint32"))


def pack_kt(kt: te.Tensor) -> te.Tensor:
    """Kᵀ [B, H, D, S] -> [B, H, S'/16, D/2, 16] uint32 (= [..., 16, 2] bf16): 16 keys per
    panel, the head dim in pairs (what one AMX B tile row holds), S' = S rounded up to 32
    (zero keys). Each output vector reads two contiguous rows of Kᵀ."""
    b, h, d, s = kt.shape

    def element(i, j, panel, pair, lane):
        key = panel * 16 + lane
        whole = _pair(kt[i, j, pair * 2, key], kt[i, j, pair * 2 + 1, key])
        # The last panel's keys past S read clamped and come out 0. That needs a Select
        # over the lanes (TVM scalarizes an if_then_else whose condition varies across
        # lanes), and a clamped index is a gather; so only the last panel takes that path
        # (its condition is the same for every lane), and whole panels load plain vectors.
        safe = tirx.min(key, s - 1)
        last = tirx.Select(key < s, _pair(kt[i, j, pair * 2, safe], kt[i, j, pair * 2 + 1, safe]),
                           tirx.const(0, "uint32"))
        return tirx.if_then_else(panel * 16 + 16 <= s, whole, last)
    return te.compute((b, h, _padded(s, _KEYS) // 16, d // 2, 16), element, name="pack_kt")


def pack_v(v: te.Tensor) -> te.Tensor:
    """V [B, H, S, E] -> [B, H, E/16, S'/2, 16] uint32 (= [..., 16, 2] bf16): 16 output
    columns per panel, the key axis in pairs, S' = S rounded up to 32 (zero rows: their
    probabilities are 0). Each output vector reads two contiguous rows of V."""
    b, h, s, e = v.shape

    def element(i, j, panel, pair, lane):
        first, second = pair * 2, pair * 2 + 1
        col = panel * 16 + lane
        low = tirx.if_then_else(first < s, v[i, j, tirx.min(first, s - 1), col], tirx.const(0.0, "float32"))
        high = tirx.if_then_else(second < s, v[i, j, tirx.min(second, s - 1), col], tirx.const(0.0, "float32"))
        return _pair(low, high)
    return te.compute((b, h, e // 16, _padded(s, _KEYS) // 2, 16), element, name="pack_v")


_SHARED_BIAS_IN_L2 = 1 << 20  # bytes


def _item_indices(item, *, batch, heads: int, row_blocks, bias_dims: tuple[str, ...], bias_shape):
    """(b, h, row block) of work item ``item``, a block of 32 query rows of one (batch
    item, head), as PrimExprs.

    Items run batch-major, (batch, head, row block): a core then reads the Q, K and V of
    the batch items that the kernels before wrote on it, from its own L2. A float32 bias
    shared by the batch (``bias_dims`` without "b": T5's and ALiBi's [H, T, S]) is then read
    again for every batch item; once it no longer stays in L2 beside the operands (over
    1 MiB: [4, 512, 512] is 4 MiB), the items run head-major, (head, batch, row block), so
    one head's bias serves the B items from L2. Measured, ALiBi and T5 bf16 at B = 8 on 2
    threads: head-major 4% faster at T = 512 and 3-4% slower at T = 128. (The float32
    kernel's items, mostly compute, ran 1-6% slower head-major at T = 512: it stays
    batch-major.)"""
    batch_major = (item // (heads * row_blocks), item // row_blocks % heads)
    if bias_dims == ("1",) or "b" in bias_dims:
        b, h = batch_major
    else:
        head_major = functools.reduce(operator.mul, bias_shape, 4) > _SHARED_BIAS_IN_L2
        b = tirx.if_then_else(head_major, item // row_blocks % batch, batch_major[0])
        h = tirx.if_then_else(head_major, item // (batch * row_blocks), batch_major[1])
    return b, h, item % row_blocks


@functools.lru_cache(maxsize=None)
def amx_attention_kernel(*, heads: int, qk_dim: int, v_dim: int, bias_dims: tuple[str, ...] = ("1",), zero_dead_rows: bool = False):
    """The fused PrimFunc (same bias and dead-row contract as attention_tiles.attention_kernel),
    over the packed operands (Q already scaled by pack_q). The key count ``S`` comes as the
    shape of ``keys``, S bytes (TVM 0.27's call_tir passes no scalars): passing Kᵀ for it
    would keep Kᵀ alive beside its packed copy, and FuseOps could not fuse the pack into
    the kernel that makes Kᵀ."""
    from tvm.script import tirx as T

    H, D, E = heads, qk_dim, v_dim
    lanes = 16
    neg_inf = -math.inf
    has_bias = bias_dims != ("1",)  # ("1",): no bias (a one-element zero)
    # a bias with a row per query and a column per key: full tiles start from it (amx_tiles)
    tile_bias = has_bias and bias_dims[-2:] == ("t", "s")

    def bias_shape(B, Tq, S):
        return tuple({"b": B, "h": H, "t": Tq, "s": S, "1": 1}[d] for d in bias_dims)

    def bias_at(b, h, i, j):
        return tuple({"b": b, "h": h, "t": i, "s": j, "1": 0}[d] for d in bias_dims)

    @T.macro
    def group_max(p, lane4, bias, b, h, i0, r4, S, Tq, chunks, add_bias):
        """Rows r4*4 .. r4*4+3 of p (`chunks` of 16 keys): + bias (add_bias), -inf past
        key S, their maxima into lane4 (one 16-lane chain per row)."""
        for l in T.vectorized(_INTERLEAVED * lanes):
            lane4[l] = T.float32(neg_inf)
        for jb in range(S // lanes):
            for rr in T.unroll(_INTERLEAVED):
                for l in T.vectorized(lanes):
                    if add_bias:
                        p[r4 * _INTERLEAVED + rr, jb * lanes + l] = p[r4 * _INTERLEAVED + rr, jb * lanes + l] + bias[
                            bias_at(b, h, T.min(i0 + r4 * _INTERLEAVED + rr, Tq - 1), jb * lanes + l)]
                    lane4[rr * lanes + l] = T.max(lane4[rr * lanes + l], p[r4 * _INTERLEAVED + rr, jb * lanes + l])
        for jb in range(S // lanes, chunks):
            for rr in T.unroll(_INTERLEAVED):
                for l in T.vectorized(lanes):
                    p[r4 * _INTERLEAVED + rr, jb * lanes + l] = T.if_then_else(
                        jb * lanes + l < S,
                        p[r4 * _INTERLEAVED + rr, jb * lanes + l] + bias[bias_at(
                            b, h, T.min(i0 + r4 * _INTERLEAVED + rr, Tq - 1), T.min(jb * lanes + l, S - 1))],
                        T.float32(neg_inf))
                    lane4[rr * lanes + l] = T.max(lane4[rr * lanes + l], p[r4 * _INTERLEAVED + rr, jb * lanes + l])

    @T.prim_func(private=True)
    def fused_attention_bf16(q_h: T.handle, kp_h: T.handle, vp_h: T.handle, keys_h: T.handle, bias_h: T.handle,
                             o_h: T.handle):
        T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True})
        B = T.int64()
        Tp = T.int64()
        Tq = T.int64()
        S = T.int64()
        Sb = T.int64()
        Sh = T.int64()
        q = T.match_buffer(q_h, (B, H, Tp, D), "uint16")
        kp = T.match_buffer(kp_h, (B, H, Sb, D // 2, 16), "uint32")  # bf16 pairs
        vp = T.match_buffer(vp_h, (B, H, E // 16, Sh, 16), "uint32")
        T.match_buffer(keys_h, (S,), "uint8")  # its shape is the key count; nothing is read
        bias = T.match_buffer(bias_h, bias_shape(B, Tq, S), "float32")
        o = T.match_buffer(o_h, (B, H, Tq, E), "float32")
        n_rb = T.meta_var(Tp // 32)
        s_pad = T.meta_var(Sb * 16)
        for item in T.parallel(B * H * n_rb, annotations={"pragma_import_llvm": AMX_IR + BF16_ROUND_IR,
                                                          CLAIM_ITEMS: 1}):
            b, h, rb = T.meta_var(_item_indices(item, batch=B, heads=H, row_blocks=n_rb, bias_dims=bias_dims,
                                                bias_shape=bias_shape(B, Tq, S)))
            i0 = T.meta_var(rb * 32)
            # the item's rows and keys fill whole tiles: they start from the bias block
            direct = T.meta_var(tile_bias and i0 + 32 <= Tq and S % 32 == 0)
            p = T.decl_buffer((32, s_pad), "float32")
            p16 = T.decl_buffer((32, s_pad), "uint16")
            out = T.decl_buffer((32, E), "float32")
            row_max = T.decl_buffer((32,), "float32")
            row_inv = T.decl_buffer((32,), "float32")
            lane4 = T.decl_buffer((_INTERLEAVED * lanes,), "float32")
            e = T.decl_buffer((lanes,), "float32")
            T.evaluate(amx_scope_call("begin"))  # the item's tile scope (amx_tiles)
            # 1. S = Q Kᵀ on the tiles (byte strides: rows of p, of q, one 16-key panel of kp),
            #    from zero, or from the bias block where the item's 32 rows and the keys
            #    fill whole tiles (the tiles load it: no pass over p adds it)
            if direct:
                T.evaluate(T.call_extern("int32", "portable_pe_amx_bf16_onto", T.address_of(p[0, 0]), s_pad * 4,
                                         T.address_of(bias[bias_at(b, h, i0, 0)]), S * 4,
                                         T.address_of(q[b, h, i0, 0]), T.int64(D * 2),
                                         T.address_of(kp[b, h, 0, 0, 0]), T.int64(D * 32),
                                         T.int64(D // 32), s_pad // 32))
            else:
                T.evaluate(T.call_extern("int32", "portable_pe_amx_bf16", T.address_of(p[0, 0]), s_pad * 4,
                                         T.address_of(q[b, h, i0, 0]), T.int64(D * 2),
                                         T.address_of(kp[b, h, 0, 0, 0]), T.int64(D * 32),
                                         T.int64(D // 32), s_pad // 32, T.int64(0)))
            # 2. per four rows: the bias added (unless the tiles did) and the row max in one
            #    pass, -inf past the last key; four independent max chains (one row's chain
            #    waits out max's latency at every chunk); then per row exp(s - max) with its
            #    sum (in the row's lanes of lane4), and the bf16 probabilities (vcvtneps2bf16)
            for r4 in range(32 // _INTERLEAVED):
                if direct:
                    group_max(p, lane4, bias, b, h, i0, r4, S, Tq, s_pad // lanes, False)
                else:
                    group_max(p, lane4, bias, b, h, i0, r4, S, Tq, s_pad // lanes, has_bias)
                for rr in range(_INTERLEAVED):
                    r = T.meta_var(r4 * _INTERLEAVED + rr)
                    row_max_of_lanes(row_max, lane4, r, lanes, zero_dead_rows, rr * lanes)
                    for jb in range(s_pad // lanes):
                        for l in T.vectorized(lanes):  # e in registers: only its sum and bf16 copy are kept
                            e[l] = _fast_exp(p[r, jb * lanes + l] - row_max[r], degree=5, nonpositive=True)
                            lane4[rr * lanes + l] = lane4[rr * lanes + l] + e[l]
                        p16[r, T.ramp(jb * lanes, 1, lanes)] = T.call_extern(
                            "uint16x16", "portable_pe_bf16x16", e.vload([0], "float32x16"))
                    inverse_row_sum_of_lanes(row_inv, lane4, r, lanes, zero_dead_rows, rr * lanes)
            # 3. O = P V on the tiles (rows of out, of p16, one 16-column panel of vp)
            T.evaluate(T.call_extern("int32", "portable_pe_amx_bf16", T.address_of(out[0, 0]), T.int64(E * 4),
                                     T.address_of(p16[0, 0]), s_pad * 2,
                                     T.address_of(vp[b, h, 0, 0, 0]), Sh * 64,
                                     s_pad // 32, T.int64(E // 32), T.int64(0)))
            T.evaluate(amx_scope_call("end"))
            for r in range(32):
                if i0 + r < Tq:
                    for c in range(E // lanes):
                        for l in T.vectorized(lanes):
                            o[b, h, i0 + r, c * lanes + l] = out[r, c * lanes + l] * row_inv[r]

    return fused_attention_bf16
