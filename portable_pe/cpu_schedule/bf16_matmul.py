"""bf16 matmul rule: ``C[..., i, j] += f32(A[..., i, k]) * f32(W[k, j])`` over uint16 bit
patterns (what bf16_linear emits), with a constant W packed [N/16, K/2, 16, 2].

With AMX (bf16_isa), per 32 x 32 block of C:

    for (batch, jo) in parallel:          # a group of NB column blocks (NB: up to 4, dividing
      tile scope begin                    #   N/32): its 32 NB-column weight panel stays in L2
      for io:                             # row blocks: A (M x K bf16) is shared by all jo
        for jb in NB:                     # A's 32-row panel stays in L1 across the group
          C = A[io, :] x W[:, jo, jb]     # one micro-kernel call: K/32 steps of 4 tdpbf16ps
          epilogue on C                   # bias, activation, residual, next rounding to bf16
      tile scope end

The block lies in memory between the micro-kernel and the epilogue (AMX has no path from
tiles to vector registers): 4 KiB, read back from L1 right after the tiles are stored.
A K over 256 runs in chunks (`for io: for ko: for jb:`): the group's blocks accumulate
in memory (16 KiB) across the chunks, and the epilogue runs once per row block after
them. Without AMX (or when N or K is not a multiple of 32), vdpbf16ps in the int8
kernels' register-tiled schedule; on aarch64, BFMMLA in that schedule (bf16_neon).
"""

from __future__ import annotations

from .amx_tiles import AMX_IR, AMX_K, AMX_SCOPE, AMX_TILE, amx_intrin
from .bf16_isa import AVX512_BF16, bf16_kernel
from .bf16_neon import NEON_BFMMLA, fits_bfmmla
from .int8_matmul import schedule_dot_matmul
from .matmul import _pack_constant_weight, _pad_to_tiles
from .loops import _parallel_outer, _vectorize_inner
from .spatial import _schedule_spatial_block
from .tir_util import _loop_extent, _region_buffer, _vector_lanes


def is_bf16_matmul(sch, mm_block) -> bool:
    """A float32 reduction over uint16 (bf16 bit pattern) operands."""
    stmt = sch.get(mm_block)
    out = _region_buffer(stmt.writes[0])
    inputs = {str(_region_buffer(r).dtype) for r in stmt.reads if not _region_buffer(r).same_as(out)}
    return str(out.dtype) == "float32" and inputs == {"uint16"}


def fits_amx(k: int, n: int) -> bool:
    return k % AMX_K == 0 and n % AMX_TILE == 0


def fits_avx512(k: int, n: int) -> bool:
    return k % AVX512_BF16.kg == 0 and n % AVX512_BF16.lanes == 0


#: the shapes (K, N) each kernel takes; bf16_linear keeps the others float32 (AMX: all of
#: them, padded to its tiles there)
FITS = {"amx-bf16": lambda k, n: True, "avx512-bf16": fits_avx512, "neon-bfmmla": fits_bfmmla}


def schedule_bf16_matmul(sch, mm_block, other_blocks, target) -> bool:
    kernel = bf16_kernel(target)
    if kernel is None:
        return False
    if kernel == "neon-bfmmla":
        return schedule_dot_matmul(sch, mm_block, other_blocks, NEON_BFMMLA)
    if kernel == "amx-bf16" and _schedule_amx(sch, mm_block, other_blocks, target):
        return True
    return schedule_dot_matmul(sch, mm_block, other_blocks, AVX512_BF16)


def _column_group(column_blocks: int) -> int:
    """Column blocks per parallel work item: the largest divisor of N/32 up to 4 (a weight
    panel of 128 columns, K x 256 bytes, in L2 while the item walks down the rows)."""
    return next(nb for nb in (4, 3, 2, 1) if column_blocks % nb == 0)


#: reduction elements per micro-kernel call at most: A's 32-row panel, 16 KiB, stays in L1
_MAX_CHUNK = 256


def _k_chunk(k: int) -> int:
    """The reduction chunk: K itself up to _MAX_CHUNK, else its largest divisor that is a
    multiple of 32 and at most _MAX_CHUNK."""
    return k if k <= _MAX_CHUNK else next(c for c in range(_MAX_CHUNK, 0, -AMX_K) if k % c == 0)


def _place_row_pads(sch, row_pads, chunk_loop, target) -> None:
    """A dynamic M's zero-padded copies of A. With K in chunks (`chunk_loop`), one per row
    block and chunk, into a scratch the tiles then load from L1: one parallel copy of all
    of A before the matmul was a pass over memory of its own (K = 1024, N = 256: 0.257 ->
    0.225 ms at M = 512, 2.32 -> 2.03 ms at M = 4096). Without chunks it made no
    difference (each column group would copy the rows again): one parallel nest there."""
    for pad in row_pads:
        if chunk_loop is None:
            _schedule_spatial_block(sch, pad, _vector_lanes(target))
        else:
            sch.compute_at(pad, chunk_loop, preserve_unit_loops=True)
            _vectorize_inner(sch, sch.get_loops(pad)[-1], _vector_lanes(target, 16))


def _schedule_amx(sch, mm_block, other_blocks, target) -> bool:
    loops = sch.get_loops(mm_block)
    if len(loops) != len(sch.get(mm_block).iter_vars):
        return False
    *batch, li, lj, lk = loops
    ext_i, ext_j, ext_k = (_loop_extent(sch, x) for x in (li, lj, lk))
    if ext_j is None or ext_k is None or not fits_amx(ext_k, ext_j):
        return False
    lanes = _vector_lanes(target)
    pad_i = AMX_TILE if (ext_i is None or ext_i % AMX_TILE) else 1
    row_pads = []  # a dynamic M's zero-padded copy of A, made per row block below
    mm_block, other_blocks = _pad_to_tiles(sch, mm_block, other_blocks, [1] * len(batch) + [pad_i, 1, 1], lanes,
                                           pads_out=row_pads)
    *batch, li, lj, lk = sch.get_loops(mm_block)
    j_var = sch.get(mm_block).iter_vars[len(batch) + 1].var
    if not _pack_constant_weight(sch, mm_block, j_var, 16, kg=2):
        raise ValueError("bf16 matmul without a constant weight to pack (bf16_linear emits only those)")
    group = _column_group(ext_j // AMX_TILE)
    chunk = _k_chunk(ext_k)
    io, ii = sch.split(li, [None, AMX_TILE])
    jo, jb, ji = sch.split(lj, [None, group, AMX_TILE])
    if chunk == ext_k:
        sch.reorder(*batch, jo, io, jb, ii, ji, lk)
        epilogue_at, depth = jb, len(batch) + 3  # per 32 x 32 block, while its 4 KiB are in L1
    else:
        # a long K in chunks, each over the whole group: A's 32 x chunk panel stays in L1
        # for the group's blocks (whole, a K = 1024 panel is 64 KiB, and both operands
        # came from L2); the blocks accumulate in memory, 32 x 32 NB float32 in L1
        ko, ki = sch.split(lk, [None, chunk])
        sch.reorder(*batch, jo, io, ko, jb, ii, ji, ki)
        epilogue_at, depth = io, len(batch) + 2
    for blk in other_blocks:
        sch.reverse_compute_at(blk, epilogue_at, preserve_unit_loops=True)
        inner = sch.get_loops(blk)[depth:]
        if inner:
            _vectorize_inner(sch, inner[-1], lanes)
    _place_row_pads(sch, row_pads, None if chunk == ext_k else ko, target)
    # parallel before the K chunks' init is split off (a loop over an update without its
    # init is not data-parallel to TVM's check)
    outermost = _parallel_outer(sch, list(batch) + [jo])
    if chunk == ext_k:
        sch.tensorize(ii, amx_intrin(ext_k))
    else:
        init = sch.decompose_reduction(mm_block, ko)
        _vectorize_inner(sch, sch.get_loops(init)[-1], lanes)
        sch.tensorize(ii, amx_intrin(chunk, accumulate=True))
    sch.annotate(outermost, "pragma_import_llvm", AMX_IR)
    sch.annotate(outermost, AMX_SCOPE, 1)  # each work item one tile scope (open_amx_scopes)
    return True
