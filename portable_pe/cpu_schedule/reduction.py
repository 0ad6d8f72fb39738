"""Row-reduction rule (softmax, layer-norm, RMS-norm, mean ...).

One parallel loop over rows, with all the row's stages computed inside it and
the elementwise stages vectorized.
"""

from __future__ import annotations

import logging

from .loops import _parallel_outer, _vectorize_inner
from .tir_util import _block_kinds, _is_spatial, _loop_extent, _vector_lanes

logger = logging.getLogger(__package__)


#: independent vector accumulators per row sum where the row is long enough: an add takes
#: 3 cycles (an FMA 4) on znver3 and two issue per cycle, so one register of partial sums
#: leaves the adders idle most of the chain
ROW_SUM_ACCUMULATORS = 4


def _split_row_sums(sch, blocks, lanes) -> tuple[list, list]:
    """Sum each row in partial sums held in vectors, then add those up. Returns the blocks
    with each partial-sum block before its sum, and the partial-sum blocks.

    A row sum is a chain of dependent adds, 4 cycles each on znver4: a 256-wide layer
    norm row took ~2000 cycles for its two sums, and the norm ran at 5-8 GB/s (45 us
    for 128 rows; MetaSchedule's rfactor schedule 12 us). rfactor over the inner
    `lanes` of the row makes `lanes` independent chains in one register. It runs before
    compute_at: rfactor wants the sum to be the first block under its loops.

    A row of at least 2 * ROW_SUM_ACCUMULATORS vectors takes ROW_SUM_ACCUMULATORS
    registers of partial sums instead of one, added into one register by a second rfactor
    (a few vector adds) before the lanes' scalar sum: a 256-wide row's chains shrink from
    32 dependent adds (and 32 FMAs for the variance) to 8."""
    out, partials = [], []
    wide = ROW_SUM_ACCUMULATORS * lanes
    for blk in blocks:
        loops = sch.get_loops(blk)
        kinds = _block_kinds(sch, blk)
        ext = _loop_extent(sch, loops[-1]) if loops else None
        if (kinds.endswith("R") and kinds.count("R") == 1 and len(loops) == len(kinds)
                and ext is not None and ext % lanes == 0 and ext >= 2 * lanes):
            width = wide if ext % wide == 0 and ext >= 2 * wide else lanes
            try:
                _, inner = sch.split(loops[-1], [None, width])
                partial = sch.rfactor(inner, factor_axis=len(kinds) - 1)
                out.append(partial)
                partials.append(partial)
                if width > lanes:  # the registers of partial sums into one
                    _, inner = sch.split(sch.get_loops(blk)[-1], [None, lanes])
                    partial = sch.rfactor(inner, factor_axis=len(kinds) - 1)
                    out.append(partial)
                    partials.append(partial)
            except Exception as err:  # pylint: disable=broad-except  # correct, just serial
                logger.debug("cpu_schedule: row sum %s left serial: %s", sch.get(blk).name_hint, err)
        out.append(blk)
    return out, partials


def _vectorize_partial_sums(sch, partial, row, lanes) -> None:
    """`partial` computed at the `row` loop: its loops there follow its iters, the partial
    sums first, then the reduction and unit row loops; the partial sums go innermost, their
    `lanes` vectorize and the registers beyond one unroll (independent chains)."""
    loops = sch.get_loops(partial)
    depth = 1 + next(n for n, loop in enumerate(loops) if sch.get(loop).same_as(sch.get(row)))
    lane_loop, *rest = loops[depth:]
    # the reduction loop last, where decompose_reduction puts the init before it (the
    # second rfactor's block has its unit row loops after the reduction)
    rest.sort(key=lambda loop: _loop_extent(sch, loop) != 1)
    sch.reorder(*rest, lane_loop)
    registers = None
    if (_loop_extent(sch, lane_loop) or 0) > lanes:
        registers, lane_loop = sch.split(lane_loop, [None, lanes])
    sch.vectorize(lane_loop)  # before decomposing: vectorize wants the reduction block
    if registers is not None:
        sch.unroll(registers)
    init = sch.decompose_reduction(partial, rest[-1])
    init_loops = sch.get_loops(init)
    sch.vectorize(init_loops[-1])
    if registers is not None:
        sch.unroll(init_loops[-2])


def _same_leading_extents(sch, blk, out_loops) -> int:
    """How many leading loops of `blk` span the same extents as the output's: the row
    loops. A norm written with keepdims (``mean(x ** 2, -1, keepdims=True)``, RMSNorm
    as opset 18 exports it) has a unit spatial loop where the row's elements run;
    counting it as a row loop computed the mean once per element (256x the work)."""
    import tvm  # pylint: disable=import-outside-toplevel
    ana = tvm.sym.Analyzer()
    n = 0
    for mine, theirs in zip(sch.get_loops(blk), out_loops):
        if not ana.can_prove_equal(sch.get(mine).extent, sch.get(theirs).extent):
            break
        n += 1
    return n


# --------------------------------------------------------------------------------------
# Rule: row reductions (softmax / norms)
# --------------------------------------------------------------------------------------
def _schedule_reduction_chain(sch, blocks, target):
    lanes = _vector_lanes(target)
    out_block = blocks[-1]
    if not _is_spatial(sch, out_block):
        # terminal reduction (e.g. mean): just parallelize its spatial loops
        loops = sch.get_loops(out_block)
        kinds = _block_kinds(sch, out_block)
        if len(loops) != len(kinds):
            return False
        n_lead = 0
        for k in kinds:
            if k != "S":
                break
            n_lead += 1
        if n_lead:
            _parallel_outer(sch, loops[:n_lead])
        for blk in reversed(blocks[:-1]):
            sch.compute_at(blk, sch.get_loops(out_block)[0], preserve_unit_loops=True)
        return True
    # number of leading spatial dims shared by all reduction blocks
    n_rows = None
    for blk in blocks[:-1]:
        kinds = _block_kinds(sch, blk)
        lead = 0
        for k in kinds:
            if k != "S":
                break
            lead += 1
        n_rows = lead if n_rows is None else min(n_rows, lead)
    if not n_rows:
        return False
    out_loops = sch.get_loops(out_block)
    if len(out_loops) < n_rows:
        n_rows = len(out_loops)
    for blk in blocks[:-1]:
        n_rows = min(n_rows, _same_leading_extents(sch, blk, out_loops))
    if not n_rows:
        return False
    blocks, partials = _split_row_sums(sch, blocks, lanes)
    out_loops = sch.get_loops(out_block)
    row = sch.fuse(*out_loops[:n_rows]) if n_rows > 1 else out_loops[0]
    sch.parallel(row)
    for blk in reversed(blocks[:-1]):
        sch.compute_at(blk, row, preserve_unit_loops=True)
    for partial in partials:
        try:
            _vectorize_partial_sums(sch, partial, row, lanes)
        except Exception as err:  # pylint: disable=broad-except  # correct, just scalar
            logger.debug("cpu_schedule: %s not vectorized: %s", sch.get(partial).name_hint, err)
    # vectorize the inner loops of spatial stages
    for blk in blocks:
        if _is_spatial(sch, blk):
            bl = sch.get_loops(blk)
            if len(bl) > 1:
                _vectorize_inner(sch, bl[-1], lanes)
    return True
