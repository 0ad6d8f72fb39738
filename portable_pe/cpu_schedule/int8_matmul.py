"""Integer matmul rule: ``C[..., i, j] += int32(A[..., i, k]) * int32(W[k, j])`` with a
constant W, scheduled as an int32 register-tiled micro-kernel around the target's dot
product instruction (``int8_isa``).

The loop nest, per MI x NJ tile (NJ = NV vectors of LANES int32):

    for (batch, io) in parallel:             # row tiles
      for jo:                                # column tiles
        for ko in K / KG:                    # KG reduction elements per instruction
          for ii in MI (unrolled):
            for jv in NV (unrolled):
              C[ii, jv*LANES : +LANES] += dot(A[ii, ko*KG : +KG], Wp[jo, ko, jv*LANES : +LANES, :])
        epilogue on the tile                 # dequantize, bias, activation, requantize ...

W is packed at compile time into [N/NJ, K/KG, NJ, KG] (``_pack_constant_weight``), so
each instruction reads one contiguous vector of weights, and the whole tile's weights for
one ``ko`` are NV consecutive vectors. The epilogue is whatever FuseOps fused after the
matmul (``quant_matmul`` emits the dequantization as Relax ops after it): it runs per
tile while the int32 accumulators are in cache, and when it ends in a quantize, the
kernel writes the next matmul's int8 operand directly.
"""

from __future__ import annotations

import logging

from .amx_matmul import schedule_amx_matmul
from .int8_isa import has_amx_int8, int8_isas
from .matmul import _pack_constant_weight, _pad_to_tiles
from .loops import _parallel_outer, _vectorize_inner
from .tir_util import _loop_extent, _region_buffer
from .work_claims import CLAIM_ITEMS

logger = logging.getLogger(__package__)

_INTEGER_OPERANDS = ("int8", "uint8", "int16")


def is_integer_matmul(sch, mm_block) -> bool:
    """An int32 reduction over 8/16-bit integer operands (what quant_matmul emits)."""
    stmt = sch.get(mm_block)
    out = _region_buffer(stmt.writes[0])
    inputs = {str(_region_buffer(r).dtype) for r in stmt.reads if not _region_buffer(r).same_as(out)}
    return str(out.dtype) == "int32" and bool(inputs) and inputs <= set(_INTEGER_OPERANDS)


def schedule_int8_matmul(sch, mm_block, other_blocks, target) -> bool:
    """Schedule an integer matmul with a constant weight; False (schedule untouched)
    when its shape does not fit the target's kernel (the float rule then takes it). With
    AMX-INT8, the tile schedule (amx_matmul: tdpbusd takes VNNI's uint8 x int8 operands)
    where K is a multiple of 64 and N of 32; else the dot product's register tiles."""
    isas = int8_isas(target)
    if (has_amx_int8(target) and _operands_match(sch, mm_block, isas[0])
            and schedule_amx_matmul(sch, mm_block, other_blocks, target, "i8")):
        return True
    # the kernel quant_matmul chose for this weight is the one with the matmul's operand types
    chosen = next((i for i in isas if _operands_match(sch, mm_block, i)), isas[0])
    return schedule_dot_matmul(sch, mm_block, other_blocks, chosen)


def schedule_dot_matmul(sch, mm_block, other_blocks, isa) -> bool:
    """The register-tiled micro-kernel around `isa`'s dot product instruction (an int8
    one, or bf16_isa.AVX512_BF16); False (schedule untouched) when the shape does not fit."""
    loops = sch.get_loops(mm_block)
    if len(loops) != len(sch.get(mm_block).iter_vars):
        return False
    *batch, li, lj, lk = loops
    ext_i, ext_j, ext_k = (_loop_extent(sch, x) for x in (li, lj, lk))
    nv = isa.tile_vectors
    while nv > 1 and ext_j is not None and ext_j % (nv * isa.lanes):
        nv //= 2
    nj = nv * isa.lanes
    if ext_j is None or ext_k is None or ext_j % nj or ext_k % isa.kg:
        return False
    if not _operands_match(sch, mm_block, isa):
        return False
    mi = isa.tile_rows if ext_i is None else min(isa.tile_rows, ext_i)
    mi = max(isa.rows, mi // isa.rows * isa.rows)

    # Dynamic or ragged rows: a zero-padded copy of A (its own nest), so every tile is full.
    pad_i = mi if (ext_i is None or ext_i % mi) else 1
    mm_block, other_blocks = _pad_to_tiles(sch, mm_block, other_blocks, [1] * len(batch) + [pad_i, 1, 1], isa.lanes)
    *batch, li, lj, lk = sch.get_loops(mm_block)
    if not _pack_constant_weight(sch, mm_block, sch.get(mm_block).iter_vars[len(batch) + 1].var, nj, kg=isa.kg):
        logger.debug("cpu_schedule: int8 matmul without a constant weight to pack")

    io, ii, ir = sch.split(li, [None, mi // isa.rows, isa.rows])
    jo, jv, ji = sch.split(lj, [None, nv, isa.lanes])
    ko, ki = sch.split(lk, [None, isa.kg])
    sch.reorder(*batch, io, jo, ko, ii, jv, ir, ji, ki)
    steps = _unrolled_steps(isa, ext_k)
    if steps > 1:
        ko, ko_unrolled = sch.split(ko, [None, steps])
    for blk in other_blocks:  # the epilogue, per tile
        sch.reverse_compute_at(blk, jo, preserve_unit_loops=True)
        inner = sch.get_loops(blk)[len(batch) + 2:]
        if inner:
            _vectorize_inner(sch, inner[-1], isa.lanes)
    _parallel_outer(sch, list(batch) + [io])
    outermost = sch.get_loops(mm_block)[0]
    sch.annotate(outermost, CLAIM_ITEMS, 1)
    init = sch.decompose_reduction(mm_block, ko)
    *_, init_jv, init_ir, init_ji = sch.get_loops(init)
    sch.reorder(init_ir, init_jv)
    sch.vectorize(sch.fuse(init_jv, init_ji))  # the tile row, zeroed
    if isa.intrin is not None:
        sch.tensorize(sch.blockize(ir if isa.rows > 1 else ji), isa.intrin)
    else:
        sch.vectorize(ji)
    sch.unroll(ii)
    sch.unroll(jv)
    if steps > 1:
        sch.unroll(ko_unrolled)
    if isa.llvm_ir is not None:  # the instruction's wrapper, linked into this kernel's module
        sch.annotate(outermost, "pragma_import_llvm", isa.llvm_ir)
    return True


def _operands_match(sch, mm_block, isa) -> bool:
    """The kernel's operand types are the ones the Relax pass chose for this target
    (a module built for another target, or a hand-written int matmul, is left to the
    float rule)."""
    stmt = sch.get(mm_block)
    out = _region_buffer(stmt.writes[0])
    dtypes = sorted(str(_region_buffer(r).dtype) for r in stmt.reads if not _region_buffer(r).same_as(out))
    return dtypes == sorted([isa.a_dtype, isa.w_dtype])


def _unrolled_steps(isa, k: int) -> int:
    """isa.k_unroll reduction steps unrolled together, or the largest power of two below
    it that divides K's steps."""
    steps = isa.k_unroll
    while steps > 1 and (k // isa.kg) % steps:
        steps //= 2
    return steps
