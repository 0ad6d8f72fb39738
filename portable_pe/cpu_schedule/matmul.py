"""Matmul rule: match ``C[..., i, j] += A[..., i, k] * B[..., k, j]`` and schedule it.

Matmul / dense / batch-matmul (including 4-D attention matmuls with a symbolic
sequence length) get a register-blocked micro-kernel: ``i`` tiled by ``MI`` rows
(unrolled), ``j`` tiled by ``NJ`` lanes (vectorized), the reduction innermost over
the tile, epilogue (bias, scale, GELU, residual ...) computed per tile.
"""

from __future__ import annotations

import logging

from .loops import _parallel_outer, _vectorize_inner
from .spatial import _schedule_spatial_block
from .tir_util import (
    _block_kinds,
    _const_int,
    _expr_vars,
    _is_load,
    _is_store,
    _load_buffer,
    _loads_of_value,
    _loop_extent,
    _node,
    _num_cores,
    _region_buffer,
    _root_block,
    _simd_registers,
    _vector_lanes,
)
from .work_claims import CLAIM_ITEMS


logger = logging.getLogger("portable_pe.cpu_schedule")

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
    a, b = _widened_load(rhs.a), _widened_load(rhs.b)
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


def _widened_load(expr):
    """The load under the widening of a matmul operand: casts (int8 -> int32), and the
    reinterpretation of a bf16 bit pattern as float32 (bf16_isa.widen)."""
    while True:
        if _node(expr) == "Cast":
            expr = expr.value
        elif _node(expr) == "Call" and getattr(expr.op, "name", "") == "tirx.reinterpret":
            expr = expr.args[0]
        elif _node(expr) == "LShift":
            expr = expr.a
        else:
            return expr


# TVM lowers a constant-size "global" buffer to a stack array only when it is under
# runtime::kMaxStackAlloca = 1024 bytes (tirx/transform/lower_tvm_builtin.cc); any
# bigger buffer, and any "local" one, becomes a TVMBackendAllocWorkspace heap block.
# LLVM cannot keep a heap accumulator in registers, so every FMA is followed by a
# store: a 128x256x1024 dense ran at 40 GFLOP/s on one znver4 core with a 4x64 tile
# (1024 bytes), 99 GFLOP/s with a 6x32 tile (768 bytes), onnxruntime 108.
_STACK_ARRAY_LIMIT_BYTES = 1024
_MAX_TILE_ROWS = 8


def _register_tile(target, lanes: int, ext_i, ext_j) -> tuple[int, int]:
    """(MI, NJ): the accumulator tile of the micro-kernel.

    NJ is two SIMD vectors, so each broadcast A element feeds two FMAs; MI rows fill the
    SIMD register file (minus the B vectors, the broadcast and spare registers) and keep
    the tile a stack array (see _STACK_ARRAY_LIMIT_BYTES)."""
    nj = 2 * lanes
    if ext_j is not None and (ext_j < nj or (ext_j % nj and ext_j % lanes == 0)):
        # one vector wide: N = 688 (Llama's FFN at width 256) is 43 vectors, so a
        # two-vector tile would pad every call and leave the weight unpacked
        nj = lanes
    by_registers = (_simd_registers(target) - 4) // (nj // lanes)
    by_stack = (_STACK_ARRAY_LIMIT_BYTES - 1) // (nj * 4)
    mi = max(1, min(by_registers, by_stack, _MAX_TILE_ROWS))
    if ext_i is not None:
        mi = min(mi, ext_i)
    return mi, nj


# The rows of A that one pass over the weight panels covers: a chunk of row tiles whose
# A rows stay in L2 (budget below) while each thread walks its share of the packed
# weight panels, so every panel, once read, feeds the whole chunk from L1/L2. Chunks of
# 16 or 24 tiles were no faster than 8 (1608 x 384 x 1536 dense, 2 threads), nor were 1-3
# consistently (1608 x 256 x 1024, 201 x 384 x 1536); more tiles make the parallel work
# coarser.
_A_CHUNK_BYTES = 256 * 1024
_MAX_CHUNK_TILES = 8


def _row_chunk_tiles(mi: int, ext_i, ext_k) -> int:
    """Row tiles per chunk for a dense over a packed weight (see _A_CHUNK_BYTES); with a
    static row count, chunks of equal size."""
    tiles = max(1, _A_CHUNK_BYTES // (4 * mi * (ext_k or 1024)))
    tiles = min(tiles, _MAX_CHUNK_TILES)
    if ext_i is not None:
        total = -(-ext_i // mi)
        chunks = -(-total // tiles)
        tiles = -(-total // chunks)
    return tiles


# Block annotation that relax.transform.SplitLayoutRewritePreproc looks for: the block
# becomes its own PrimFunc, called on the weight constant, and FoldConstant then runs it
# once at compile time (TVM's own CPU weight-prepack path, static_shape_tuning_pipeline).
_LAYOUT_REWRITE_PREPROC = "meta_schedule.layout_rewrite_preproc"


def _packable_weight(sch, mm_block, j_var, nj: int, *, kg: int = 1):
    """The read index of the matmul's constant [K, N] weight when _pack_constant_weight can
    pack it into NJ-column panels (N % NJ == 0, K % KG == 0, read with j as its last index),
    else None. Only weights the Relax function passes as constants (``layout_free_buffers``,
    set by weight_packing.MarkConstantWeights) are packed."""
    func = sch.mod["main"]
    free = func.attrs.get("layout_free_buffers") if func.attrs is not None else None
    if not free:
        return None
    # TVM 0.27: a PrimFunc's params are its buffers (no buffer_map)
    free_buffers = [func.params[int(i)] for i in free]
    stmt = sch.get(mm_block)
    for index, region in enumerate(stmt.reads):
        buffer = _region_buffer(region)
        if not any(buffer.same_as(f) for f in free_buffers) or len(buffer.shape) != 2:
            continue
        k_ext, n_ext = (_const_int(x) for x in buffer.shape)
        if k_ext is None or n_ext is None or n_ext % nj or k_ext % kg:
            continue
        loads = list(_loads_of(stmt.body.value, buffer))
        if loads and all(_node(x.indices[-1]) == "Var" and x.indices[-1].same_as(j_var) for x in loads):
            return index
    return None


def _pack_constant_weight(sch, mm_block, j_var, nj: int, *, kg: int = 1) -> bool:
    """Store a constant [K, N] weight as [N/NJ, K, NJ] panels ([N/NJ, K/KG, NJ, KG] with
    ``kg`` > 1: the groups of KG reduction elements an integer dot product instruction
    takes per lane, see int8_isa).

    The micro-kernel reads NJ consecutive columns of B for every k. In the [K, N]
    layout those rows lie N*4 bytes apart, 4 KiB for N = 1024: every k lands in the
    same few L1 sets, so the panel keeps falling out of L1. Packed, a panel is one
    contiguous stream. Which weights qualify: _packable_weight."""
    index = _packable_weight(sch, mm_block, j_var, nj, kg=kg)
    if index is None:
        return False
    name = _region_buffer(sch.get(mm_block).reads[index]).name
    try:
        packed = sch.cache_read(mm_block, index, "global")
        if kg > 1:
            sch.transform_layout(mm_block, ("read", index), lambda k, n: (n // nj, k // kg, n % nj, k % kg))
        else:
            sch.transform_layout(mm_block, ("read", index), lambda k, n: (n // nj, k, n % nj))
        sch.annotate(packed, _LAYOUT_REWRITE_PREPROC, True)
    except Exception as err:  # pylint: disable=broad-except
        # each primitive either applies or leaves the schedule as it was
        logger.debug("cpu_schedule: weight %s left unpacked: %s", name, err)
        return False
    return True


def _loads_of(expr, buffer):
    """Loads of ``buffer`` in a matmul update expression (Add/Mul/Cast/shift of loads, and
    the reinterpret call of a bf16 operand)."""
    return (load for load in _loads_of_value(expr) if _load_buffer(load).same_as(buffer))


def _pad_to_tiles(sch, mm_block, other_blocks, padding: list[int], lanes: int, *, pads_out: list | None = None):
    """pad_einsum the matmul's iteration domain by ``padding`` (1 = no padding) and
    schedule the zero-padded operand copies it adds as nests of their own (or, given
    ``pads_out``, leave them unscheduled and append them to it); the cropping copy it
    adds is folded into the epilogue, or is the epilogue when there is none.
    Returns the matmul block and the epilogue blocks (both re-fetched)."""
    if all(p == 1 for p in padding):
        return mm_block, other_blocks
    name = sch.get(mm_block).name_hint
    producers_before = {sch.get(b).name_hint for b in sch.get_child_blocks(_root_block(sch))}
    sch.pad_einsum(mm_block, padding)
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
    # (Measured: computing the row-operand pad per row tile (compute_at io) was
    # slower than one parallel copy nest, so here all pad copies run on their own; a
    # dense over a packed weight makes it per row chunk instead, see _schedule_matmul.)
    if pads_out is not None:
        pads_out.extend(pad_producers)
        return mm_block, other_blocks
    for pb in pad_producers:
        _schedule_spatial_block(sch, pb, lanes)
    return mm_block, other_blocks


def _schedule_matmul(sch, mm_block, other_blocks, target):
    lanes = _vector_lanes(target)
    loops = sch.get_loops(mm_block)
    if len(loops) != len(sch.get(mm_block).iter_vars):
        return False
    *batch, li, lj, lk = loops
    ext_j = _loop_extent(sch, lj)
    ext_i = _loop_extent(sch, li)

    mi, nj = _register_tile(target, lanes, ext_i, ext_j)

    # Dynamic / ragged extents: pad the iteration domain up to the tile size
    # (pad_einsum adds a zero-padded copy of the inputs and a cropping
    # consumer), so the micro-kernel runs without per-element predicates and
    # the accumulator compacts into an MI x NJ register tile.
    pad_i = mi if (ext_i is None or ext_i % mi) else 1
    pad_j = nj if (ext_j is None or ext_j % nj) else 1
    pads = []
    mm_block, other_blocks = _pad_to_tiles(sch, mm_block, other_blocks, [1] * len(batch) + [pad_i, pad_j, 1], lanes,
                                           pads_out=pads)
    *batch, li, lj, lk = sch.get_loops(mm_block)

    packed = False
    if ext_j is not None and ext_j % nj == 0:  # after pad_einsum, which wants plain indices
        packed = _pack_constant_weight(sch, mm_block, sch.get(mm_block).iter_vars[len(batch) + 1].var, nj)
    if not packed:
        for pb in pads:
            _schedule_spatial_block(sch, pb, lanes)

    io, ii = sch.split(li, [None, mi])
    jo, ji = sch.split(lj, [None, nj])
    if packed:
        # A dense over a packed weight: the panels in one group per core, the rows in
        # chunks of row tiles, and the threads splitting (group, chunk) items, groups
        # outermost. Each thread then keeps its group's panels in cache across the
        # chunks, and each chunk's rows in L2 across the group's panels. Row tiles
        # outermost (below) re-read every panel from L3 per tile: 1.2-1.35x onnxruntime's
        # time on 201/1608 x 384 x 1536 denses, against 1.09-1.15x with chunks (2 threads,
        # alternating blocks, one process). One parallel loop, not a serial loop of chunks
        # each splitting (panel, row tile) pairs between the threads: one fork-join per
        # call instead of one per chunk, 2-4% off the rope graph (B 1-8, T 128-512) and
        # vit_rope_2d (224 x 224, B 1 and 8).
        chunk, io = sch.split(io, [None, _row_chunk_tiles(mi, ext_i, _loop_extent(sch, lk))])
        jg, jo = sch.split(jo, [min(ext_j // nj, _num_cores(target)), None])
        sch.reorder(jg, *batch, chunk, jo, io, lk, ii, ji)
        tile = io
    else:
        sch.reorder(*batch, io, jo, lk, ii, ji)
        tile = jo
    if pad_j > 1 and ext_j is None:
        # The vector (j) dim is dynamic: a per-tile epilogue would need a
        # lane-dependent tail predicate (scalarized).  Accumulate in an MI x NJ
        # tile ("global" scope: a stack array, see _register_tile), write it to the
        # padded result, and run the epilogue as its own exact-extent loop nest.
        wb = sch.cache_write(mm_block, 0, "global")
        sch.reverse_compute_at(wb, tile, preserve_unit_loops=True)
        wloops = sch.get_loops(wb)
        if len(wloops) > len(batch) + 2:
            _vectorize_inner(sch, wloops[-1], lanes)
        for blk in other_blocks:
            _schedule_spatial_block(sch, blk, lanes)
    else:
        # Epilogue (bias/scale/activation/residual/crop) computed per register tile.
        for blk in other_blocks:
            sch.reverse_compute_at(blk, tile, preserve_unit_loops=True)
            eloops = sch.get_loops(blk)
            inner = eloops[len(batch) + 2:]
            if inner:
                _vectorize_inner(sch, inner[-1], lanes)
    # parallel/unroll/vectorize first: once the reduction is decomposed the
    # update block is no longer a "reduction block" and parallel() refuses it.
    items = _parallel_outer(sch, [jg, *batch, chunk] if packed else list(batch) + [io])
    sch.annotate(items, CLAIM_ITEMS, 1)
    for pb in pads if packed else ():
        # the padded copy of the chunk's rows, made in each work item (in L2 for the
        # micro-kernel) rather than as a parallel nest of its own over all rows: once per
        # panel group, so twice on 2 cores, and still 2-3% faster on vit_rope_2d
        sch.compute_at(pb, items, preserve_unit_loops=True)
        _vectorize_inner(sch, sch.get_loops(pb)[-1], lanes)
    sch.unroll(ii)
    sch.vectorize(ji)
    init = sch.decompose_reduction(mm_block, lk)
    iloops = sch.get_loops(init)
    if iloops:
        sch.vectorize(iloops[-1])
    return True
