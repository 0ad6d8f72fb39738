"""K for the AMX attention (bf16_attention), packed straight from its rows.

The AMX kernel takes Kᵀ as 16-key panels of bf16 pairs, [B, H, S'/16, D/2, 16]: each
output vector holds one pair of head-dim values for 16 keys, so it gathers from 16 key
rows. Built from the graph's Kᵀ [B, H, D, S] (bf16_attention.pack_kt), that cost two
passes: the float32 Kᵀ (a transposed copy, transpose_tiles) and the pack; in the bf16
ALiBi graph at B = 8, T = 512 (2 threads) the two took 2.45 ms of 38 per run. Here, where
the graph makes Kᵀ by transposing a [.., S, .., D] tensor (its rows are keys), one kernel
reads 16 key rows, rounds them to bf16 pairs and transposes the 16 x 16 block of pairs in
registers (four stages of two-source shuffles, in LLVM IR), writing whole panels.

The rows come from the transpose's input as it is: [B, S, H, D] (a head split) or
[B, H, S, D] (RoPE's rotated K), or, where the head split is of a biased slice of a fused
Q/K/V projection, from the projection in place with the bias added (key_source finds
which); the panel past the last key has its missing keys zero, as pack_kt's.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import tvm
from tvm import relax

from .relax_util import _tensor_type
from .tir_util import _const_int

logger = logging.getLogger(__package__)

_KEYS = 16    # keys per panel: one AMX B-tile row of pairs
_PAIRS = 16   # pairs per 16 x 16 block (one zmm of int32)
_PAD = 32     # the key axis is padded to this (bf16_attention._KEYS)

#: the layouts the rows can come in: where (batch, key, head, dim) sit in the tensor
LAYOUTS = {"bshd": "[B, S, H, D]", "bhsd": "[B, H, S, D]"}


def kernel_name(head_dim: int, bias: bool = False) -> str:
    return f"portable_pe_pack_k16_d{head_dim}" + ("_bias" if bias else "")


def pack_ir(head_dim: int, bias: bool = False) -> str:
    """LLVM IR of kernel_name(D)(src, stride, dst): 16 rows of D float32 (``stride``
    elements apart) -> D/32 blocks of [16 pairs][16 keys] int32 at dst, in order.
    ``bias``: kernel_name(D, True)(src, stride, bias, dst) adds bias[0:D] to every row."""
    args = "ptr %src, i64 %stride, ptr %bias, ptr %dst" if bias else "ptr %src, i64 %stride, ptr %dst"
    lines = [f"define internal void @{kernel_name(head_dim, bias)}({args}) {{", "entry:"]
    for c in range(head_dim // 32):
        if bias:
            lines += [
                f"  %c{c}bp = getelementptr float, ptr %bias, i64 {32 * c}",
                f"  %c{c}blo = load <16 x float>, ptr %c{c}bp, align 4",
                f"  %c{c}bp2 = getelementptr float, ptr %c{c}bp, i64 16",
                f"  %c{c}bhi = load <16 x float>, ptr %c{c}bp2, align 4",
            ]
        rows = []
        for key in range(_KEYS):
            n = f"c{c}k{key}"
            lines += [
                f"  %{n}.o = mul i64 %stride, {key}",
                f"  %{n}.oo = add i64 %{n}.o, {32 * c}",
                f"  %{n}.p = getelementptr float, ptr %src, i64 %{n}.oo",
                f"  %{n}.lo{'0' if bias else ''} = load <16 x float>, ptr %{n}.p, align 4",
                f"  %{n}.p2 = getelementptr float, ptr %{n}.p, i64 16",
                f"  %{n}.hi{'0' if bias else ''} = load <16 x float>, ptr %{n}.p2, align 4",
            ]
            if bias:
                lines += [f"  %{n}.lo = fadd <16 x float> %{n}.lo0, %c{c}blo",
                          f"  %{n}.hi = fadd <16 x float> %{n}.hi0, %c{c}bhi"]
            lines += [
                # round to nearest even, 16 at a time (vcvtneps2bf16 on a zmm)
                f"  %{n}.blo = fptrunc <16 x float> %{n}.lo to <16 x bfloat>",
                f"  %{n}.bhi = fptrunc <16 x float> %{n}.hi to <16 x bfloat>",
                f"  %{n}.b = shufflevector <16 x bfloat> %{n}.blo, <16 x bfloat> %{n}.bhi, <32 x i32> "
                + "<" + ", ".join(f"i32 {i}" for i in range(32)) + ">",
                # little-endian: dim 2p in the low half of pair p, as bf16_attention._pair
                f"  %{n}.r = bitcast <32 x bfloat> %{n}.b to <16 x i32>",
            ]
            rows.append(f"%{n}.r")
        # transpose the 16 x 16 block: at each level h, rows i and i + h swap their
        # off-diagonal h-lane blocks (after h = 8, 4, 2, 1 the block is transposed)
        for h in (8, 4, 2, 1):
            for i in range(_KEYS):
                if i & h:
                    continue
                a, b = rows[i], rows[i + h]
                first = [j if not j & h else 16 + j - h for j in range(16)]
                second = [j + h if not j & h else 16 + j for j in range(16)]
                for mask, name in ((first, f"%c{c}t{h}_{i}"), (second, f"%c{c}t{h}_{i + h}")):
                    lines.append(f"  {name} = shufflevector <16 x i32> {a}, <16 x i32> {b}, <16 x i32> "
                                 + "<" + ", ".join(f"i32 {m}" for m in mask) + ">")
                rows[i], rows[i + h] = f"%c{c}t{h}_{i}", f"%c{c}t{h}_{i + h}"
        for pair in range(_PAIRS):
            lines += [
                f"  %c{c}s{pair}.p = getelementptr i32, ptr %dst, i64 {(c * _PAIRS + pair) * _KEYS}",
                f"  store <16 x i32> {rows[pair]}, ptr %c{c}s{pair}.p, align 4",
            ]
    lines += ["  ret void", "}", ""]
    return "\n".join(lines)


def fits(head_dim: int) -> bool:
    return head_dim % 32 == 0


@dataclass(frozen=True)
class KeySource:
    """Where K's rows are, for pack_k_kernel: its call arguments and options, and the
    batch and key count of the packed result."""
    args: list
    options: dict
    batch: object
    keys: object


def key_source(kt, heads: int, d: int, *, bound, binding) -> KeySource | None:
    """The rows `kt` (a Relax Kᵀ [B, H, D, S]) transposes, or None: a float32 [B, S, H, D]
    (a head split) or [B, H, S, D] (RoPE's rotated K); of the first, the fused projection
    it is a biased slice of where there is one. ``bound(expr, op)`` is the call `expr` is
    bound to when it calls `op`, ``binding(var)`` what `var` is bound to (the fuser's)."""
    transpose = bound(kt, "relax.permute_dims")
    axes = tuple(int(a) for a in transpose.attrs.axes) if transpose is not None and transpose.attrs.axes else None
    rows = {(0, 2, 3, 1): "bshd", (0, 1, 3, 2): "bhsd"}.get(axes)
    if rows is None or not fits(d):
        return None
    k = transpose.args[0]
    info = _tensor_type(k)
    if info is None or info[0] != "float32" or len(info[1]) != 4:
        return None
    batch, keys, h, dims = (info[1][i] for i in ((0, 1, 2, 3) if rows == "bshd" else (0, 2, 1, 3)))
    if _const_int(h) != heads or _const_int(dims) != d:
        return None
    try:
        sliced = _biased_slice(k, heads * d, batch, keys, bound, binding) if rows == "bshd" else None
    except Exception as err:  # pylint: disable=broad-except  # the rows as they are: still right
        logger.debug("cpu_schedule: K's projection not matched: %s", err)
        sliced = None
    if sliced is None:
        return KeySource([k], {"layout": rows}, batch, keys)
    qkv, offset, width, bias = sliced
    return KeySource([qkv, bias], {"layout": "qkv", "width": width, "offset": offset}, batch, keys)


def _biased_slice(k, columns: int, batch, keys, bound, binding):
    """(qkv, offset, width, bias) where `k` is reshape(split(qkv, axis=-1)[i] + bias):
    K as columns offset..offset + `columns` of a fused projection [batch, keys, width]
    plus a constant bias of `columns`; else None."""
    reshape = bound(k, "relax.reshape")
    add = bound(reshape.args[0], "relax.add") if reshape is not None else None
    if add is None:
        return None
    for part, bias in (add.args, add.args[::-1]):
        # (TVM 0.27: Relax constants are tvm.ir.GenericConst)
        bias_type = _tensor_type(bias) if isinstance(bias, tvm.ir.GenericConst) else None
        if bias_type is None or bias_type[0] != "float32" or [_const_int(n) for n in bias_type[1]] != [columns] \
                or not isinstance(part, relax.Var):
            continue
        item = binding(part)
        if not isinstance(item, relax.TupleGetItem) or not isinstance(item.tuple_value, relax.Var):
            continue
        split = bound(item.tuple_value, "relax.split")
        info = _tensor_type(split.args[0]) if split is not None else None
        if info is None or info[0] != "float32" or len(info[1]) != 3 or _const_int(info[1][2]) is None:
            continue
        same = tvm.sym.Analyzer().can_prove_equal
        if not (same(info[1][0], batch) and same(info[1][1], keys)):
            continue  # the rows are read as [batch, keys, width]: any other order is not K's
        width = _const_int(info[1][2])
        if int(split.attrs.axis) not in (-1, 2):
            continue
        sections = split.attrs.indices_or_sections
        if isinstance(sections, tvm.tirx.IntImm):
            starts = [i * width // int(sections) for i in range(int(sections) + 1)]
        else:
            starts = [0, *(int(i) for i in sections), width]
        index = int(item.index)
        if starts[index + 1] - starts[index] != columns:
            continue
        return split.args[0], starts[index], width, bias
    return None


@functools.lru_cache(maxsize=None)
def pack_k_kernel(*, heads: int, head_dim: int, layout: str, width: int = 0, offset: int = 0):
    """The PrimFunc (k [layout], kp [B, H, S'/16, D/2, 16] uint32): K's rows packed as
    bf16_attention.pack_kt packs Kᵀ, S' = S rounded up to 32. ``layout`` "qkv": the
    PrimFunc (qkv [B, S, width], bias [H * D], kp): K is qkv[..., offset:offset + H * D]
    + bias, the slice of a fused projection, read in place."""
    from tvm.script import tirx as T

    if layout not in (*LAYOUTS, "qkv"):
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)} or qkv, got {layout!r}")
    H, D = heads, head_dim
    plain, biased = kernel_name(D), kernel_name(D, bias=True)
    # the tail panel goes through the plain kernel (its copy adds the bias)
    ir = pack_ir(D) + (pack_ir(D, bias=True) if layout == "qkv" else "")
    # elements from one key's row to the next
    row_stride = {"bshd": H * D, "bhsd": D, "qkv": width}[layout]

    def k_at(k, b, h, s, d):  # called while parsing
        return {"bshd": lambda: k[b, s, h, d], "bhsd": lambda: k[b, h, s, d],
                "qkv": lambda: k[b, s, offset + h * D + d]}[layout]()

    def k_shape(B, S):
        return {"bshd": (B, S, H, D), "bhsd": (B, H, S, D), "qkv": (B, S, width)}[layout]

    @T.macro
    def pack_panels(k, bias, kp, B, S, Sb, with_bias):
        # a root block: RewriteDataflowReshape checks every one-in one-out kernel for a
        # reshape, and its check needs one
        with T.sblock("root"):
            for item in T.parallel(B * H * Sb, annotations={"pragma_import_llvm": ir}):
                b = T.meta_var(item // (H * Sb))
                h = T.meta_var(item // Sb % H)
                panel = T.meta_var(item % Sb)
                if panel * _KEYS + _KEYS <= S:
                    if with_bias:
                        T.evaluate(T.call_extern("void", biased, T.address_of(k_at(k, b, h, panel * _KEYS, 0)),
                                                 T.int64(row_stride), T.address_of(bias[h * D]),
                                                 T.address_of(kp[b, h, panel, 0, 0])))
                    else:
                        T.evaluate(T.call_extern("void", plain, T.address_of(k_at(k, b, h, panel * _KEYS, 0)),
                                                 T.int64(row_stride), T.address_of(kp[b, h, panel, 0, 0])))
                else:  # past the last key: the keys there are zero
                    rows = T.decl_buffer((_KEYS * D,), "float32")
                    for key in range(_KEYS):
                        if panel * _KEYS + key < S:
                            for d in T.vectorized(D):
                                rows[key * D + d] = k_at(k, b, h, panel * _KEYS + key, d) + (
                                    bias[h * D + d] if with_bias else T.float32(0))
                        else:
                            for d in T.vectorized(D):
                                rows[key * D + d] = T.float32(0)
                    T.evaluate(T.call_extern("void", plain, T.address_of(rows[0]), T.int64(D),
                                             T.address_of(kp[b, h, panel, 0, 0])))

    if layout == "qkv":
        @T.prim_func(private=True, s_tir=True)
        def pack_k_qkv(k_h: T.handle, bias_h: T.handle, kp_h: T.handle):
            T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True})
            B = T.int64()
            S = T.int64()
            Sb = T.int64()
            k = T.match_buffer(k_h, k_shape(B, S), "float32")
            bias = T.match_buffer(bias_h, (H * D,), "float32")
            kp = T.match_buffer(kp_h, (B, H, Sb, D // 2, _KEYS), "uint32")
            pack_panels(k, bias, kp, B, S, Sb, True)
        return pack_k_qkv

    @T.prim_func(private=True, s_tir=True)
    def pack_k(k_h: T.handle, kp_h: T.handle):
        T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True})
        B = T.int64()
        S = T.int64()
        Sb = T.int64()
        k = T.match_buffer(k_h, k_shape(B, S), "float32")
        kp = T.match_buffer(kp_h, (B, H, Sb, D // 2, _KEYS), "uint32")
        pack_panels(k, None, kp, B, S, Sb, False)
    return pack_k


def packed_keys(keys, pad: int = _PAD):
    """Sb, the panel count, for `keys` keys (a PrimExpr): S rounded up to `pad`, over 16."""
    return (keys + (pad - 1)) // pad * pad // _KEYS
