"""The write side of transpose_tiles on x86: each whole tile of 16 positions copied out
transposed in 8 x 8 register blocks, by a kernel in LLVM IR.

transpose_tiles' copy reads its tile [16 positions, D] back one element at a time, and the
stored dim's run-time tail puts a predicate on every element, so LLVM leaves it scalar.
The tail cannot be split off by the schedule (loop_partition refuses a dynamic extent), so
transpose_tiles marks the copy's outer loop (WHOLE_TILES) and, once the function is
scheduled, whole_tiles_in_registers wraps it as
``if the tile's last position is real: kernel(out, tile) else: the scalar copy``. The
kernel does eight row loads, 24 shuffles (unpack, shufps, 128-bit lane permutes: the
usual AVX transpose) and eight row stores per 64 values. Measured with
scripts/kernel_profile.py (2 threads, spinning pools, a 2-core Zen 3, four layers per
run): the alibi graph's Kᵀ kernel at B = 8, T = 128 0.56-0.99 -> 0.37-0.56 ms (four
alternating runs; the machine drifts), at T = 512 4.40 -> 2.49 ms; the rope graph's, which
rotates K in the tile, 0.49 -> 0.31 ms at B = 8, T = 128.
"""

from __future__ import annotations

import logging

import tvm
from tvm import tirx
from tvm.s_tir import SBlockRealize
from tvm_ffi.structural import structural_equal, structural_mutate

from .tir_util import _const_int, _is_load, _node

logger = logging.getLogger(__package__)

#: the loop annotation transpose_tiles puts on a tile's copy (its outer loop)
WHOLE_TILES = "portable_pe.transpose_whole_tiles"
#: the register block: one AVX vector of float32 each way
BLOCK = 8
#: the kernel's name prefix (suffixed with the tile's rows x columns)
KERNEL = "portable_pe_transpose_f32_"

_VEC = "<8 x float>"


def _mask(indices) -> str:
    return "<" + ", ".join(f"i32 {i}" for i in indices) + ">"


# the three shuffle stages of an 8 x 8 transpose, each combining two vectors
_UNPACK_LO = _mask([0, 8, 1, 9, 4, 12, 5, 13])     # vunpcklps
_UNPACK_HI = _mask([2, 10, 3, 11, 6, 14, 7, 15])   # vunpckhps
_PAIRS_LO = _mask([0, 1, 8, 9, 4, 5, 12, 13])      # vshufps
_PAIRS_HI = _mask([2, 3, 10, 11, 6, 7, 14, 15])
_HALVES_LO = _mask([0, 1, 2, 3, 8, 9, 10, 11])     # vperm2f128 / vinsertf128
_HALVES_HI = _mask([4, 5, 6, 7, 12, 13, 14, 15])


def _block_lines(tag: str, src_row: str, dst_row: str) -> list[str]:
    """IR for one 8 x 8 block: rows r of the source at src_row(r) (a pointer expression
    emitted by the caller), columns c of it stored as rows at dst_row(c)."""
    lines = []
    for r in range(BLOCK):
        lines.append(f"  %{tag}r{r} = load {_VEC}, ptr %{src_row}{r}, align 4")
    shuffles = [  # (stage output, inputs, mask)
        *[(f"t{2 * p + h}", (f"r{2 * p}", f"r{2 * p + 1}"), (_UNPACK_LO, _UNPACK_HI)[h]) for p in range(4) for h in range(2)],
    ]
    # stage 2: t0,t2 -> u0,u1; t1,t3 -> u2,u3; t4,t6 -> u4,u5; t5,t7 -> u6,u7
    for group, (a, b) in enumerate((("t0", "t2"), ("t1", "t3"), ("t4", "t6"), ("t5", "t7"))):
        shuffles += [(f"u{2 * group}", (a, b), _PAIRS_LO), (f"u{2 * group + 1}", (a, b), _PAIRS_HI)]
    # stage 3: column c of the block is row c of the result
    for c in range(4):
        shuffles += [(f"o{c}", (f"u{c}", f"u{c + 4}"), _HALVES_LO), (f"o{c + 4}", (f"u{c}", f"u{c + 4}"), _HALVES_HI)]
    for out, (a, b), mask in shuffles:
        lines.append(f"  %{tag}{out} = shufflevector {_VEC} %{tag}{a}, {_VEC} %{tag}{b}, <8 x i32> {mask}")
    for c in range(BLOCK):
        lines.append(f"  store {_VEC} %{tag}o{c}, ptr %{dst_row}{c}, align 4")
    return lines


def transpose_ir(rows: int, cols: int) -> str:
    """LLVM IR of KERNEL{rows}x{cols}(dst, ldd, src, lds): dst[c, r] = src[r, c] for r <
    rows, c < cols; strides in elements. rows and cols are multiples of BLOCK."""
    name = f"{KERNEL}{rows}x{cols}"
    lines = [f"define internal i32 @{name}(ptr %dst, i64 %ldd, ptr %src, i64 %lds) alwaysinline {{", "entry:"]
    for rb in range(rows // BLOCK):
        for cb in range(cols // BLOCK):
            tag = f"b{rb}_{cb}_"
            for r in range(BLOCK):  # source row rb*8 + r, from column cb*8
                lines += [f"  %{tag}so{r} = mul i64 %lds, {rb * BLOCK + r}",
                          f"  %{tag}sc{r} = add i64 %{tag}so{r}, {cb * BLOCK}",
                          f"  %{tag}s{r} = getelementptr float, ptr %src, i64 %{tag}sc{r}"]
            for c in range(BLOCK):  # destination row cb*8 + c, from column rb*8
                lines += [f"  %{tag}do{c} = mul i64 %ldd, {cb * BLOCK + c}",
                          f"  %{tag}dc{c} = add i64 %{tag}do{c}, {rb * BLOCK}",
                          f"  %{tag}d{c} = getelementptr float, ptr %dst, i64 %{tag}dc{c}"]
            lines += _block_lines(tag, f"{tag}s", f"{tag}d")
    lines += ["  ret i32 0", "}", ""]
    return "\n".join(lines)


def _flat(buffer, indices):
    """The element offset of ``buffer[indices]`` in its row-major layout, as a sum of
    index x stride terms. (Buffer.offset_of nests the terms as Horner's rule does, and the
    simplifier left the difference of two such offsets as ``(a*64 + 1)*seq - a*seq*64``.)"""
    offset, stride = tirx.const(0, "int64"), tirx.const(1, "int64")
    for index, extent in zip(reversed(list(indices)), reversed(list(buffer.shape))):
        offset = offset + tirx.Cast("int64", index) * stride
        stride = stride * tirx.Cast("int64", extent)
    return offset


def _substitute(expr, pairs):
    """``expr`` with each var of ``pairs`` ((var, value) ...) replaced by its value."""
    def replace(var, _mutator):
        return next((value for old, value in pairs if old.same_as(var)), var)
    return structural_mutate(expr, [(tirx.Var, replace)])


def _whole_tile_call(loop, analyzer):
    """IfThenElse(the tile is whole, the kernel's call, ``loop``) for a marked copy nest
    ``for c in cols: for r in rows: out[.., c, .., r0 + r] = tile[.., r, c]`` (one block,
    its predicate the stored dim's tail); None where the nest is not of that form."""
    inner = loop.body
    if _node(inner) != "For" or not isinstance(inner.body, SBlockRealize):
        return None
    rows, cols = _const_int(inner.extent), _const_int(loop.extent)
    if rows is None or cols is None or rows % BLOCK or cols % BLOCK:
        return None
    realize = inner.body
    store = realize.block.body
    if _node(store) != "BufferStore" or not _is_load(store.value) or str(store.value.ty) != "float32":
        return None
    bound = [(iv.var, value) for iv, value in zip(realize.block.iter_vars, realize.iter_values)]

    def at(expr, c, r):
        positions = [(loop.loop_var, tirx.const(c, str(loop.loop_var.ty))),
                     (inner.loop_var, tirx.const(r, str(inner.loop_var.ty)))]
        return analyzer.simplify(_substitute(_substitute(expr, bound), positions))

    out, tile = store.buffer, store.value.source
    out_first, tile_first = [at(i, 0, 0) for i in store.indices], [at(i, 0, 0) for i in store.value.indices]

    def step(buffer, indices, first, c, r):  # elements from (0, 0) to (c, r): int64, as the kernel takes it
        return analyzer.simplify(_flat(buffer, [at(i, c, r) for i in indices]) - _flat(buffer, first))

    ldd, lds = step(out, store.indices, out_first, 1, 0), step(tile, store.value.indices, tile_first, 0, 1)
    if (_const_int(step(out, store.indices, out_first, 0, 1)) != 1
            or _const_int(step(tile, store.value.indices, tile_first, 1, 0)) != 1):
        return None  # not a transposed copy with both buffers' rows contiguous
    whole = at(realize.predicate, 0, rows - 1)  # the tile's last position is real
    if not structural_equal(whole, at(realize.predicate, cols - 1, rows - 1)):
        return None  # the predicate is not the stored dim's tail alone
    call = tirx.call_extern("int32", f"{KERNEL}{rows}x{cols}", tirx.address_of(tirx.BufferLoad(out, out_first)),
                            ldd, tirx.address_of(tirx.BufferLoad(tile, tile_first)), lds)
    plain = tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, loop.body, loop.thread_binding, {})
    return tirx.AttrStmt(tirx.const(0, "int32"), "pragma_import_llvm", tvm.ir.StringImm(transpose_ir(rows, cols)),
                         tirx.IfThenElse(whole, tirx.Evaluate(call), plain))


def whole_tiles_in_registers(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with each copy nest transpose_tiles marked (WHOLE_TILES on its outer loop)
    running transpose_ir's kernel on every whole tile (module docstring)."""
    analyzer = tvm.sym.Analyzer()
    found = []

    def rewrite(loop, mutator):
        if WHOLE_TILES not in loop.annotations:
            return mutator.default_mutate(loop)
        new = _whole_tile_call(loop, analyzer)
        if new is None:  # (correct as it is, only scalar)
            logger.debug("transpose_8x8: the marked copy is not a transposed tile copy, left scalar:\n%s", loop)
            return mutator.default_mutate(loop)
        found.append(new)
        return new

    body = structural_mutate(func.body, [(tirx.For, rewrite)])
    return func.with_body(body) if found else func
