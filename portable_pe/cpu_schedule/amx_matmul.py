"""The AMX dense schedule (tile micro-kernel: amx_tiles), for bf16 (bf16_matmul) and
int8 (int8_matmul) matmuls with a constant weight, per 32 x 32 block of C:

    for (batch, io, jo) in parallel:      # row block x group of NB column blocks (NB: up
      tile scope begin                    #   to 4, dividing N/32)
      for jb in NB:                       # A's 32-row panel stays in L1 across the group
        C = A[io, :] x W[:, jo, jb]       # one micro-kernel call: a tile step per 64 bytes of K
        epilogue on C                     # bias, activation, residual, dequantize, rounding
      tile scope end

Items run row-major (loops.row_major_items) while the weight fits in L2 with the rest, up
to 1.5 MiB: each core computes whole rows, which the next kernel reads on the same core.
A bigger weight runs (batch, jo) items with io inside, each core keeping its groups'
panels in L2. Row-major against that order (bf16, one process, alternating blocks, 2
threads): rope B=1 T=512 4.28 -> 3.76 ms, T=128 1.63 -> 1.52; t5_bias B=1 T=512 5.91 -> 5.18,
T=128 1.19 -> 1.14; at B=8 within 1% either way (rope T=512 29.53 / 29.50, T=128 5.28 /
5.28; t5_bias T=512 32.5 / 32.8, T=128 6.17 / 6.09).

The block lies in memory between the micro-kernel and the epilogue (AMX has no path from
tiles to vector registers): 4 KiB, read back from L1 right after the tiles are stored.
A K over 512 bytes a row (256 bf16, 512 int8) runs in chunks (`for ko: for jb:` inside
the item): the group's blocks accumulate in memory (16 KiB) across the chunks, and the
epilogue runs once per item after them.
"""

from __future__ import annotations

from .amx_tiles import AMX_INT8_IR, AMX_IR, AMX_SCOPE, AMX_TILE, amx_element_bytes, amx_intrin
from .matmul import _pack_constant_weight, _pad_to_tiles
from .loops import _parallel_outer, _vectorize_inner, row_major_items
from .spatial import _schedule_spatial_block
from .tir_util import _loop_extent, _vector_lanes
from .work_claims import CLAIM_ITEMS

#: bytes of a row of A per micro-kernel call at most: A's 32-row panel, 16 KiB, stays in L1
_MAX_CHUNK_BYTES = 512


def amx_step(kind: str) -> int:
    """Reduction elements per tile step (64 bytes): 32 bf16, 64 int8."""
    return 64 // amx_element_bytes(kind)


def fits_amx(k: int, n: int, kind: str = "bf16") -> bool:
    return k % amx_step(kind) == 0 and n % AMX_TILE == 0


def _column_group(column_blocks: int) -> int:
    """Column blocks per parallel work item: the largest divisor of N/32 up to 4 (a weight
    panel of 128 columns, K x 256 bytes in bf16, in L2 while the item walks down the rows)."""
    return next(nb for nb in (4, 3, 2, 1) if column_blocks % nb == 0)


def _k_chunk(k: int, kind: str) -> int:
    """The reduction chunk: K itself up to _MAX_CHUNK_BYTES a row, else its largest divisor
    that is a whole number of tile steps and at most that."""
    most, step = _MAX_CHUNK_BYTES // amx_element_bytes(kind), amx_step(kind)
    return k if k <= most else next(c for c in range(most, 0, -step) if k % c == 0)


def _place_row_pads(sch, row_pads, chunk_loop, target) -> None:
    """A dynamic M's zero-padded copies of A. With K in chunks (`chunk_loop`), one per row
    block and chunk, into a scratch the tiles then load from L1: one parallel copy of all
    of A before the matmul was a pass over memory of its own (bf16, K = 1024, N = 256: 0.257 ->
    0.225 ms at M = 512, 2.32 -> 2.03 ms at M = 4096). Without chunks it made no
    difference (each column group would copy the rows again): one parallel nest there."""
    for pad in row_pads:
        if chunk_loop is None:
            _schedule_spatial_block(sch, pad, _vector_lanes(target))
        else:
            sch.compute_at(pad, chunk_loop, preserve_unit_loops=True)
            _vectorize_inner(sch, sch.get_loops(pad)[-1], _vector_lanes(target, 16))


def schedule_amx_matmul(sch, mm_block, other_blocks, target, kind: str) -> bool:
    """The schedule above for a `kind` ("bf16", "i8": amx_tiles.AMX_KINDS) matmul; False
    (schedule untouched) when its shape does not fit the tiles."""
    loops = sch.get_loops(mm_block)
    if len(loops) != len(sch.get(mm_block).iter_vars):
        return False
    *batch, li, lj, lk = loops
    ext_i, ext_j, ext_k = (_loop_extent(sch, x) for x in (li, lj, lk))
    if ext_j is None or ext_k is None or not fits_amx(ext_k, ext_j, kind):
        return False
    lanes = _vector_lanes(target)
    pad_i = AMX_TILE if (ext_i is None or ext_i % AMX_TILE) else 1
    row_pads = []  # a dynamic M's zero-padded copy of A, made per row block below
    mm_block, other_blocks = _pad_to_tiles(sch, mm_block, other_blocks, [1] * len(batch) + [pad_i, 1, 1], lanes,
                                           pads_out=row_pads)
    *batch, li, lj, lk = sch.get_loops(mm_block)
    j_var = sch.get(mm_block).iter_vars[len(batch) + 1].var
    if not _pack_constant_weight(sch, mm_block, j_var, 16, kg=4 // amx_element_bytes(kind)):
        raise ValueError(f"{kind} matmul without a constant weight to pack (bf16_linear and quant_matmul emit only those)")
    group = _column_group(ext_j // AMX_TILE)
    chunk = _k_chunk(ext_k, kind)
    io, ii = sch.split(li, [None, AMX_TILE])
    jo, jb, ji = sch.split(lj, [None, group, AMX_TILE])
    # row-major items (io, jo) for a weight that stays in L2, else column groups outermost
    rows_first = row_major_items(ext_k, ext_j, amx_element_bytes(kind))
    outer = [io, jo] if rows_first else [jo, io]
    if chunk == ext_k:
        sch.reorder(*batch, *outer, jb, ii, ji, lk)
        epilogue_at, depth = jb, len(batch) + 3  # per 32 x 32 block, while its 4 KiB are in L1
    else:
        # a long K in chunks, each over the whole group: A's 32 x chunk panel stays in L1
        # for the group's blocks (whole, a K = 1024 panel is 64 KiB, and both operands
        # came from L2); the blocks accumulate in memory, 32 x 32 NB float32 in L1
        ko, ki = sch.split(lk, [None, chunk])
        sch.reorder(*batch, *outer, ko, jb, ii, ji, ki)
        epilogue_at, depth = outer[1], len(batch) + 2
    for blk in other_blocks:
        sch.reverse_compute_at(blk, epilogue_at, preserve_unit_loops=True)
        inner = sch.get_loops(blk)[depth:]
        if inner:
            _vectorize_inner(sch, inner[-1], lanes)
    _place_row_pads(sch, row_pads, None if chunk == ext_k else ko, target)
    # parallel before the K chunks' init is split off (a loop over an update without its
    # init is not data-parallel to TVM's check)
    outermost = _parallel_outer(sch, list(batch) + (outer if rows_first else [jo]))
    if chunk == ext_k:
        sch.tensorize(ii, amx_intrin(ext_k, kind=kind))
    else:
        init = sch.decompose_reduction(mm_block, ko)
        _vectorize_inner(sch, sch.get_loops(init)[-1], lanes)
        sch.tensorize(ii, amx_intrin(chunk, accumulate=True, kind=kind))
    sch.annotate(outermost, "pragma_import_llvm", AMX_IR + (AMX_INT8_IR if kind == "i8" else ""))
    sch.annotate(outermost, AMX_SCOPE, 1)  # each work item one tile scope (open_amx_scopes)
    sch.annotate(outermost, CLAIM_ITEMS, 1)
    return True
