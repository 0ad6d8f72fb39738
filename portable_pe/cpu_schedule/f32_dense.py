"""The float32 dense schedule on AVX-512 (micro-kernel: f32_tiles), for a matmul over a
constant weight with N a multiple of 32 and a static K:

    for (batch, io, g) in parallel:   # row tiles of 12 x column groups (one per core);
      for jo in group g's panels:
        C = A[io] x W[:, jo]          # one micro-kernel call over the whole K, reading
                                      #   the tile's rows of A where they lie
        epilogue on C                 # bias, activation, residual, while C is in L1

The items (row tile, group) run in that order, row-major, for weights up to 1.5 MiB
(loops.row_major_items: each core computes whole rows, the rows the next kernel reads,
and reads the rows the previous kernel wrote on it). Groups outermost
(each core all rows of its columns, as matmul's schedule runs) left every kernel reading
half its input from the other core: the learned graph (1 MiB FFN weights) at B = 8
T = 128 ran 8% slower that way, 3.5% at T = 512 (2 threads, one process, alternating
blocks). A core then reads every panel for each row tile, so a weight must stay in its
L2 with the rest: over 1.5 MiB (DINOv3-S's FFN, 2.25 MiB) groups go outermost, each core
keeping only its half (DINOv3-S at 224 x 224, B = 1: 34.2 ms, against 35.0 row-major
throughout and 34.5 groups-outermost throughout). The groups sit inside the row tile,
not one item per row tile, so a small M (11 tiles at T = 128) still splits evenly.

The row axis is padded to whole tiles (pad_einsum: a dynamic row count, or one that 12
does not divide), which also adds a zero-padded copy of each tile's rows; rows_in_place
then drops that copy, the micro-kernel reading the rows in place and repeating the last
real one past the end of A. The copy had been kept so the 12 rows, K floats apart (4 KiB
at K = 1024), would not share one L1 set; measured, reading them in place was faster
everywhere (2 threads, against the FMA peak measured in alternation): K 1024 x N 256 at
M 1024 0.84 -> 0.89 of the peak, K 1536 x N 384 at M 1608 0.81 -> 0.88, K <= 384 unchanged.
"""

from __future__ import annotations

from .f32_tiles import F32_PANEL, F32_TILE_COLUMNS, F32_TILE_ROWS, f32_intrin, f32_ir
from .loops import _parallel_outer, _vectorize_inner, row_major_items
from .matmul import _pack_constant_weight, _packable_weight, _pad_to_tiles
from .rows_in_place import ROWS_IN_PLACE
from .small_work import WORK_ITERATIONS
from .tir_util import _loop_extent, _num_cores, _vector_lanes
from .work_claims import CLAIM_ITEMS


def fits_f32_tiles(sch, mm_block, target) -> bool:
    """AVX-512, a static K (at least 1: the kernel's loop runs once before testing), N a
    multiple of 32, and a constant weight that packs."""
    if _vector_lanes(target) != 16:
        return False
    loops = sch.get_loops(mm_block)
    iter_vars = sch.get(mm_block).iter_vars
    if len(loops) != len(iter_vars):
        return False
    ext_j, ext_k = _loop_extent(sch, loops[-2]), _loop_extent(sch, loops[-1])
    if ext_j is None or ext_k is None or ext_k < 1 or ext_j % F32_TILE_COLUMNS:
        return False
    return _packable_weight(sch, mm_block, iter_vars[-2].var, F32_PANEL) is not None


def schedule_f32_dense(sch, mm_block, other_blocks, target) -> bool:
    """The schedule above; False (schedule untouched) where fits_f32_tiles does not hold."""
    if not fits_f32_tiles(sch, mm_block, target):
        return False
    lanes = _vector_lanes(target)
    *batch, li, lj, lk = sch.get_loops(mm_block)
    ext_i, ext_j, ext_k = (_loop_extent(sch, x) for x in (li, lj, lk))
    pad_i = F32_TILE_ROWS if (ext_i is None or ext_i % F32_TILE_ROWS) else 1
    row_pads = []
    mm_block, other_blocks = _pad_to_tiles(sch, mm_block, other_blocks, [1] * len(batch) + [pad_i, 1, 1], lanes,
                                           pads_out=row_pads)
    *batch, li, lj, lk = sch.get_loops(mm_block)
    if not _pack_constant_weight(sch, mm_block, sch.get(mm_block).iter_vars[len(batch) + 1].var, F32_PANEL):
        raise ValueError("f32_dense: the weight that fits_f32_tiles found did not pack")
    # a divisor of the column tiles: a partial group would put a predicate on the tile's
    # block, and tensorize refuses predicated blocks
    tiles = ext_j // F32_TILE_COLUMNS
    groups = max(g for g in range(1, min(tiles, _num_cores(target)) + 1) if tiles % g == 0)
    io, ii = sch.split(li, [None, F32_TILE_ROWS])
    jg, jo, ji = sch.split(lj, [groups, None, F32_TILE_COLUMNS])
    # the work items' loops, outermost first (module docstring)
    item_loops = [*batch, io, jg] if row_major_items(ext_k, ext_j, 4) else [jg, *batch, io]
    sch.reorder(*item_loops, jo, ii, ji, lk)
    for blk in other_blocks:
        sch.reverse_compute_at(blk, jo, preserve_unit_loops=True)
        inner = sch.get_loops(blk)[len(batch) + 3:]
        if inner:
            _vectorize_inner(sch, inner[-1], lanes)
    items = _parallel_outer(sch, item_loops)
    sch.annotate(items, CLAIM_ITEMS, 1)
    for pad in row_pads:
        # per item, as the copy would run were it kept; rows_in_place drops it
        sch.compute_at(pad, items, preserve_unit_loops=True)
        _vectorize_inner(sch, sch.get_loops(pad)[-1], lanes)
        sch.annotate(pad, ROWS_IN_PLACE, 1)
    name = sch.get(mm_block).name_hint
    sch.tensorize(ii, f32_intrin(ext_k))
    # the call's multiply-adds, for SerialWhenSmall (it would count the call as one iteration)
    sch.annotate(sch.get_sblock(f"{name}_o"), WORK_ITERATIONS, F32_TILE_ROWS * F32_TILE_COLUMNS * ext_k)
    sch.annotate(items, "pragma_import_llvm", f32_ir())
    return True
