"""Spatial blocks that write a transposed copy along a dynamic dim: the Kᵀ that the
attention kernels take, ``[..., head_dim, seq]``, made from ``[..., seq, 3 * hidden]``
rows (with RoPE's rotation on the way).

The generic rule runs the stored (dynamic) dim innermost, so each element read is
``3 * hidden`` floats from the last one: every read touches a new cache line and every
line is fetched again for each of the head dim's positions. At B8 T512 the rope graph's
Kᵀ kernel took 6.5 ms (11% of the bf16 graph) for 1M elements.

Here the values are computed ``_TILE`` positions at a time into a small buffer laid out
with the dim the loads run along last, vectorized along it (contiguous loads; a concat
along it in parts, see concat_lanes), and a copy writes the tile out transposed, reading
it back from L1; each tile writes whole cache lines of the output. The copy is scalar
(the stored dim has a run-time tail). That kernel, B8 T512 bf16: 6.5 -> 2.5 ms; tiling
alone, computed in place, gave 3.4 ms: LLVM vectorized the tile's positions with masked
gathers, or, unrolled, spent ~35 scalar instructions per element. On x86 the whole tiles
are copied in 8 x 8 register blocks instead (transpose_8x8), the last tile by the scalar
copy.
"""

from __future__ import annotations

from .concat_lanes import concat_cuts, part_width, vectorize_in_parts
from .loops import _parallel_outer
from .tir_util import _expr_vars, _loads_of_value, _loop_extent
from .transpose_8x8 import BLOCK, WHOLE_TILES

#: positions of the dynamic dim per tile: 16 floats, one cache line of the output row
_TILE = 16


def schedule_transpose_tiles(sch, block, lanes: int, parallel: bool = True) -> bool:
    """Tile ``block`` (a plain spatial nest) as the module doc says; False, and the
    schedule untouched, when it is not a transposed copy along a dynamic innermost dim."""
    loops = sch.get_loops(block)
    stmt = sch.get(block)
    n = len(loops)
    if n < 2 or n != len(stmt.iter_vars) or _loop_extent(sch, loops[-1]) is not None:
        return False
    if not (len(stmt.body.indices) == n and all(i.same_as(iv.var) for i, iv in zip(stmt.body.indices, stmt.iter_vars))):
        return False  # the store's dims are not the nest's, in order
    stored = stmt.iter_vars[-1].var
    reads = [load for load in _loads_of_value(stmt.body.value)
             if load.indices and any(stored in _expr_vars(i) for i in load.indices)]
    if not reads or any(stored in _expr_vars(load.indices[-1]) for load in reads):
        return False
    along = next((i for i in range(n - 2, -1, -1) if _loop_extent(sch, loops[i]) is not None
                  and all(stmt.iter_vars[i].var in _expr_vars(load.indices[-1]) for load in reads)), None)
    if along is None:
        return False
    cuts = concat_cuts(sch, block, along)
    if part_width(_loop_extent(sch, loops[along]), cuts, lanes) is None:
        return False  # nothing to vectorize the values along: the generic rule's nest
    # the values, computed a tile at a time into a buffer with the `along` dim last ...
    tile = sch.cache_write(block, 0, "global")
    order = [i for i in range(n) if i != along] + [along]
    sch.transform_layout(block, ("write", 0), lambda *idx: tuple(idx[i] for i in order))
    # ... which the copy to the output reads back transposed, from L1
    copy_loops = sch.get_loops(tile)
    tiles, positions = sch.split(copy_loops[-1], [None, _TILE])
    others = [loop for i, loop in enumerate(copy_loops[:-1]) if i != along]
    sch.reorder(*others, tiles, copy_loops[along], positions)
    sch.compute_at(block, tiles)
    inner = sch.get_loops(block)[len(others) + 1:]  # the values' loops inside one tile
    if len(inner) != 2:  # (the schedule is changed: raising leaves the function unscheduled)
        raise ValueError(f"transpose_tiles: expected 2 loops in a tile, found {len(inner)}")
    sch.reorder(inner[1], inner[0])  # the `along` dim innermost, as the tile is laid out
    vectorize_in_parts(sch, inner[0], cuts, lanes)
    if lanes >= BLOCK and _loop_extent(sch, copy_loops[along]) % BLOCK == 0:  # (`along` is static)
        # x86: whole tiles are written by transpose_8x8's kernel (whole_tiles_in_registers)
        sch.annotate(copy_loops[along], WHOLE_TILES, 1)
    if parallel and others:
        _parallel_outer(sch, others)
    return True

