"""Matmul rule: match ``C[..., i, j] += A[..., i, k] * B[..., k, j]`` and schedule it.

Matmul / dense / batch-matmul (including 4-D attention matmuls with a symbolic
sequence length) get a register-blocked micro-kernel: ``i`` tiled by ``MI`` rows
(unrolled), ``j`` tiled by ``NJ`` lanes (vectorized), the reduction innermost over
the tile, epilogue (bias, scale, GELU, residual ...) computed per tile.
"""

from __future__ import annotations

from .spatial import _parallel_outer, _schedule_spatial_block, _vectorize_inner
from .tir_util import (
    _block_kinds,
    _expr_vars,
    _is_load,
    _is_store,
    _load_buffer,
    _loop_extent,
    _node,
    _region_buffer,
    _root_block,
    _vector_lanes,
)


# --------------------------------------------------------------------------------------
# Rule: matmul
# --------------------------------------------------------------------------------------
def _match_matmul(sch, block):
    """Return (batch_iters, i_var, j_var, k_var) if block is C[.., i, j] += A[.., i, k]*B[.., k, j]."""
    stmt = sch.get(block)
    kinds = _block_kinds(sch, block)
    if kinds.count("R") != 1 or not kinds.endswith("R") or "O" in kinds:
        return None
    if len(stmt.writes) != 1 or len(stmt.reads) < 2:
        return None
    if stmt.init is None:
        return None
    body = stmt.body
    if not _is_store(body):
        return None
    val = body.value
    if _node(val) != "Add":
        return None
    lhs, rhs = val.a, val.b
    if not (_is_load(lhs) and _load_buffer(lhs).same_as(body.buffer)):
        lhs, rhs = rhs, lhs
    if not (_is_load(lhs) and _load_buffer(lhs).same_as(body.buffer)):
        return None
    # strip casts
    while _node(rhs) == "Cast":
        rhs = rhs.value
    if _node(rhs) != "Mul":
        return None
    a, b = rhs.a, rhs.b
    while _node(a) == "Cast":
        a = a.value
    while _node(b) == "Cast":
        b = b.value
    if not (_is_load(a) and _is_load(b)):
        return None
    ivars = [iv.var for iv in stmt.iter_vars]
    k = ivars[-1]
    spatial = ivars[:-1]
    if len(spatial) < 2:
        return None
    out_idx = body.indices
    if len(out_idx) < 2 or not all(_node(x) == "Var" for x in out_idx):
        return None
    j = out_idx[-1]
    i = out_idx[-2]
    if not (j.same_as(spatial[-1]) and i.same_as(spatial[-2])):
        return None

    def _last_is(load, var):
        return _node(load.indices[-1]) == "Var" and load.indices[-1].same_as(var)

    def _uses(load, var):
        return any(var in _expr_vars(x) for x in load.indices)

    # B operand: last index j, uses k; A operand: uses i and k, not j.
    if _last_is(b, j) and _uses(b, k) and not _uses(a, j) and _uses(a, i):
        pass
    elif _last_is(a, j) and _uses(a, k) and not _uses(b, j) and _uses(b, i):
        a, b = b, a
    else:
        return None
    return spatial[:-2], i, j, k


def _schedule_matmul(sch, mm_block, other_blocks, target):
    lanes = _vector_lanes(target)
    loops = sch.get_loops(mm_block)
    if len(loops) != len(sch.get(mm_block).iter_vars):
        return False
    *batch, li, lj, lk = loops
    ext_j = _loop_extent(sch, lj)
    ext_i = _loop_extent(sch, li)

    # Register tile: MI rows x NJ columns (NJ = a few SIMD vectors).
    nj = 4 * lanes
    if ext_j is not None and ext_j < nj:
        nj = max(lanes, ext_j if ext_j % lanes == 0 else lanes)
    if ext_j is not None and ext_j % nj != 0 and ext_j % (2 * lanes) == 0:
        nj = 2 * lanes
    mi = 4
    if ext_i is not None and ext_i < mi:
        mi = ext_i

    # Dynamic / ragged extents: pad the iteration domain up to the tile size
    # (pad_einsum adds a zero-padded copy of the inputs and a cropping
    # consumer), so the micro-kernel runs without per-element predicates and
    # the accumulator compacts into an MI x NJ register tile.
    pad_i = mi if (ext_i is None or ext_i % mi) else 1
    pad_j = nj if (ext_j is None or ext_j % nj) else 1
    name = sch.get(mm_block).name_hint
    producers_before = {sch.get(b).name_hint for b in sch.get_child_blocks(_root_block(sch))}
    if pad_i > 1 or pad_j > 1:
        sch.pad_einsum(mm_block, [1] * len(batch) + [pad_i, pad_j, 1])
        mm_block = sch.get_sblock(name)
        new_blocks = [
            b for b in sch.get_child_blocks(_root_block(sch))
            if sch.get(b).name_hint not in producers_before
        ]
        all_blocks = list(sch.get_child_blocks(_root_block(sch)))
        pos = [sch.get(b).name_hint for b in all_blocks].index(name)
        pad_producers = [b for b in new_blocks if [sch.get(x).name_hint for x in all_blocks].index(sch.get(b).name_hint) < pos]
        crop = [b for b in new_blocks if b not in pad_producers]
        crop_names = [sch.get(b).name_hint for b in crop]
        if other_blocks:
            # fold the crop copy into the epilogue
            for c in crop_names:
                sch.compute_inline(sch.get_sblock(c))
        else:
            other_blocks = [sch.get_sblock(c) for c in crop_names]
        loops = sch.get_loops(mm_block)
        *batch, li, lj, lk = loops
    else:
        pad_producers = []

    # Pad copies of the row operand (indexed by i) are made per row tile, in
    # L1, right before the micro-kernel; the others run as their own nest.
    a_side = []
    b_side = []
    mm_stmt = sch.get(mm_block)
    i_var = mm_stmt.iter_vars[len(batch)].var
    for pb in pad_producers:
        out_buf = _region_buffer(sch.get(pb).writes[0])
        uses_i = any(
            _region_buffer(r).same_as(out_buf) and any(i_var in _expr_vars(rg.min) for rg in r.region)
            for r in mm_stmt.reads
        )
        (a_side if uses_i else b_side).append(pb)
    # (Measured: computing the row-operand pad per row tile (compute_at io) was
    # slower than one parallel copy nest, so all pad copies run on their own.)
    for pb in a_side + b_side:
        _schedule_spatial_block(sch, pb, lanes)

    io, ii = sch.split(li, [None, mi])
    jo, ji = sch.split(lj, [None, nj])
    sch.reorder(*batch, io, jo, lk, ii, ji)
    if pad_j > 1 and ext_j is None:
        # The vector (j) dim is dynamic: a per-tile epilogue would need a
        # lane-dependent tail predicate (scalarized).  Accumulate in a local
        # MI x NJ tile, write it to the padded result, and run the epilogue as
        # its own exact-extent loop nest over that result.
        wb = sch.cache_write(mm_block, 0, "local")
        sch.reverse_compute_at(wb, jo, preserve_unit_loops=True)
        wloops = sch.get_loops(wb)
        if len(wloops) > len(batch) + 2:
            _vectorize_inner(sch, wloops[-1], lanes)
        for blk in other_blocks:
            _schedule_spatial_block(sch, blk, lanes)
    else:
        # Epilogue (bias/scale/activation/residual/crop) computed per register tile.
        for blk in other_blocks:
            sch.reverse_compute_at(blk, jo, preserve_unit_loops=True)
            eloops = sch.get_loops(blk)
            inner = eloops[len(batch) + 2:]
            if inner:
                _vectorize_inner(sch, inner[-1], lanes)
    # parallel/unroll/vectorize first: once the reduction is decomposed the
    # update block is no longer a "reduction block" and parallel() refuses it.
    _parallel_outer(sch, list(batch) + [io])
    sch.unroll(ii)
    sch.vectorize(ji)
    init = sch.decompose_reduction(mm_block, lk)
    iloops = sch.get_loops(init)
    if iloops:
        sch.vectorize(iloops[-1])
    return True
