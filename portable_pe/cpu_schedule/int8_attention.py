"""Attention's Q·Kᵀ in int8 for `--precision int8` on AVX2 without VNNI (the ``avx2-u8s7``
kernel of int8_isa), at INT8_MIN_KEYS keys and more: the scores' multiply-adds at
vpmaddubsw's 32 per instruction, where the float32 kernel does 8 per FMA. Softmax and P·V
stay float32 (attention_tiles).

Quantization, dynamic and per row, so no calibration is needed for activations that
depend on the input:

* each key row k_j (its D elements) to 7 bits: k_j ~ ks_j · kq_j with kq in [-64, 64] and
  ks_j = max|k_j| / 64, done once per layer by ``pack_k_kernel``, which also packs kq
  for the instruction: [B, H, S/8, D/4, 32], each 32-byte vector 8 keys by 4 of their
  elements, and keeps kc_j = 128 · sum(kq_j);
* each query row q_i to 8 bits inside the attention kernel: q_i ~ qs_i · qq_i with qq in
  [-127, 127], stored offset by 128 as uint8 (vpmaddubsw's unsigned operand).

Then q_i·k_j ~ qs_i · ks_j · (sum(uint8(qq_i + 128) · kq_j) - kc_j), exactly in int32:
a uint8 x int7 pair sums to at most 255 · 64 · 2 = 32640, so vpmaddubsw's int16 never
saturates (int8_isa says why that needs 7-bit weights). Measured on the seven sequence
graphs in PyTorch (scripts/int8_attention_error.py, B = 8 T = 512 and B = 1 T = 128), this
rounding alone moves their outputs by 1 - cosine = 6e-9 to 1.1e-7 against float32
attention, against 4e-5 from the weights' int8 rounding. P·V stays float32: in int8 too
(P to 8 bits, V per channel to 7) it moved them by up to 1.4e-6, more than the 1e-6 by
which an int8 build's cosine may trail onnxruntime int8's (whose attention is float32).
"""

from __future__ import annotations

import functools

from tvm.script import tirx as T

from .int8_isa import int8_isa
from .work_claims import CLAIM_ITEMS

#: keys per packed vector (8 int32 lanes of 4 products each) and elements per lane
KEY_COLUMNS = 8
GROUP = 4
#: the fewest keys for which the scores run in int8 (a run-time test in both kernels; fewer
#: take attention_tiles' float32 scores). Below it the scores are a small part of attention
#: and the packing kernel costs about what they save (whole int8 bundles at B = 8 T = 128:
#: 0.97 to 1.02 of the float32 scores' time, against 0.87 to 0.92 at T = 512), and the
#: rounding costs more accuracy at short sequences (scripts/int8_attention_error.py: 1 -
#: cosine 1e-7 at 18 tokens, 7e-9 at 300): the tiny ViT test graph's int8 build, at 18
#: tokens with int8 scores, trailed onnxruntime int8's cosine by 2.2e-6.
INT8_MIN_KEYS = 256
#: the quantized keys' range (7 bits: vpmaddubsw exact) and the queries' (8 bits, offset)
K_MAX = 64
Q_MAX = 127
Q_OFFSET = 128

_PMADDUBSW = "llvm.x86.avx2.pmadd.ub.sw"
_PMADDWD = "llvm.x86.avx2.pmadd.wd"


def runs_on(target) -> bool:
    """Whether an int8 build for `target` takes int8 scores: its int8 kernel is avx2-u8s7
    (AVX2 without VNNI). Elsewhere attention stays float32, or bf16 on AMX."""
    return int8_isa(target).name == "avx2-u8s7"


def fits(qk_dim: int) -> bool:
    """Whether the kernel takes this head dim: a multiple of 8 (the queries are quantized 8
    elements at a time, the keys packed 4 at a time), as 32, 40, 64, 80 and 128 are."""
    return qk_dim % KEY_COLUMNS == 0


def key_blocks(keys):
    """S8: the packed keys' blocks of 8 for `keys` keys (a PrimExpr or int)."""
    return (keys + (KEY_COLUMNS - 1)) // KEY_COLUMNS


def dot4(q_group, k_vector):
    """int32x8: lane l = the 4 uint8 of ``q_group`` (one int32) times key l's 4 int7 in
    ``k_vector`` (int8x32), summed: vpmaddubsw into int16 pairs, vpmaddwd by ones."""
    pairs = T.call_llvm_pure_intrin(T.llvm_lookup_intrinsic_id(_PMADDUBSW),
                                    T.reinterpret(T.broadcast(q_group, KEY_COLUMNS), dtype="uint8x32"), k_vector,
                                    dtype="int16x16")
    return T.call_llvm_pure_intrin(T.llvm_lookup_intrinsic_id(_PMADDWD), pairs, T.broadcast(T.int16(1), 16),
                                   dtype="int32x8")


def _interleaved(groups):
    """int8x32: 4 int8x8 vectors (element e of each of 8 keys) as the 8 keys' 4 elements
    in turn (key-major), one shuffle: the packed layout's order."""
    import tvm  # pylint: disable=import-outside-toplevel
    return tvm.tirx.Shuffle(list(groups), [e * KEY_COLUMNS + l for l in range(KEY_COLUMNS) for e in range(GROUP)])


def _quantized(values, inv):
    """int32x8: float32x8 `values` times `inv`, rounded to nearest (even)."""
    return T.Cast("int32x8", T.round(values * inv))


@functools.lru_cache(maxsize=None)
def pack_k_kernel(*, heads: int, qk_dim: int):
    """Kᵀ [B, H, D, S] float32 -> (kp [B, H, S8, D/4, 32] int8, ks [B, H, 8·S8] float32,
    kc [B, H, 8·S8] int32), the module docstring's key quantization: kp[b, h, t, g] holds
    keys 8t..8t+7, each by its elements 4g..4g+3. Keys past S (the last block's padding)
    get kq = 0, ks = 0 and kc = 0. A whole block is quantized 8 keys at a time and packed
    by one shuffle per vector; the partial one element by element. Under INT8_MIN_KEYS
    keys it writes nothing (the attention kernel's scores are float32 then)."""
    H, D = heads, qk_dim
    n_groups = D // GROUP
    n = KEY_COLUMNS

    @T.prim_func(private=True, s_tir=True)
    def pack_k_int8(kt_h: T.handle, kp_h: T.handle, ks_h: T.handle, kc_h: T.handle):
        T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True})
        B = T.int64()
        S = T.int64()
        kt = T.match_buffer(kt_h, (B, H, D, S), "float32")
        kp = T.match_buffer(kp_h, (B, H, key_blocks(S), n_groups, n * GROUP), "int8")
        ks = T.match_buffer(ks_h, (B, H, key_blocks(S) * n), "float32")
        kc = T.match_buffer(kc_h, (B, H, key_blocks(S) * n), "int32")
        # a root block (s_tir), as a kernel of blocks has: RewriteDataflowReshape checks
        # every one-input kernel for a reshape and expects one
        with T.sblock("root"):
            for item in T.parallel(T.if_then_else(S >= INT8_MIN_KEYS, B * H * key_blocks(S), T.int64(0)),
                                   annotations={CLAIM_ITEMS: 1}):
                b = T.meta_var(item // (H * key_blocks(S)))
                h = T.meta_var(item // key_blocks(S) % H)
                jt = T.meta_var(item % key_blocks(S))
                top = T.decl_buffer((n,), "float32")
                inv = T.decl_buffer((n,), "float32")
                total = T.decl_buffer((n,), "int32")
                rows = T.decl_buffer((GROUP, n), "int32")
                for l in T.vectorized(n):
                    top[l] = T.float32(0)
                    total[l] = 0
                if jt * n + n <= S:  # a whole block: contiguous loads, vector stores
                    for d in range(D):
                        for l in T.vectorized(n):
                            top[l] = T.max(top[l], T.fabs(kt[b, h, d, jt * n + l]))
                    for l in T.vectorized(n):
                        inv[l] = T.if_then_else(top[l] > T.float32(0), T.float32(K_MAX) / top[l], T.float32(0))
                    for g in range(n_groups):
                        # the group's 4 rows of 8 keys, quantized once for the pack and the sums
                        for e in T.unroll(GROUP):
                            rows[e, T.ramp(T.int32(0), 1, n)] = _quantized(
                                kt.vload([b, h, g * GROUP + e, jt * n], "float32x8"), inv.vload([0], "float32x8"))
                        kp[b, h, jt, g, T.ramp(T.int64(0), 1, n * GROUP)] = _interleaved(
                            [T.Cast("int8x8", rows.vload([e, 0], "int32x8")) for e in range(GROUP)])
                        for e in T.unroll(GROUP):
                            total[T.ramp(T.int32(0), 1, n)] = total.vload([0], "int32x8") + rows.vload([e, 0], "int32x8")
                else:  # the last, partial block: its keys past S stay 0
                    for d in range(D):
                        for l in range(n):
                            if jt * n + l < S:
                                top[l] = T.max(top[l], T.fabs(kt[b, h, d, jt * n + l]))
                    for l in range(n):
                        inv[l] = T.if_then_else(top[l] > T.float32(0), T.float32(K_MAX) / top[l], T.float32(0))
                    for g in range(n_groups):
                        for l in range(n):
                            for e in range(GROUP):
                                kp[b, h, jt, g, l * GROUP + e] = T.Cast("int8", T.Cast("int32", T.round(
                                    kt[b, h, g * GROUP + e, T.min(jt * n + l, S - 1)] * inv[l])))
                                total[l] = total[l] + T.Cast("int32", kp[b, h, jt, g, l * GROUP + e])
                for l in T.vectorized(n):
                    ks[b, h, jt * n + l] = top[l] * T.float32(1.0 / K_MAX)
                    kc[b, h, jt * n + l] = total[l] * Q_OFFSET

    return pack_k_int8
