"""Row-reduction rule (softmax, layer-norm, RMS-norm, mean ...).

One parallel loop over rows, with all the row's stages computed inside it and
the elementwise stages vectorized.
"""

from __future__ import annotations

from .spatial import _parallel_outer, _vectorize_inner
from .tir_util import _block_kinds, _is_spatial, _vector_lanes


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
    if not n_rows:
        return False
    row = sch.fuse(*out_loops[:n_rows]) if n_rows > 1 else out_loops[0]
    sch.parallel(row)
    for blk in reversed(blocks[:-1]):
        sch.compute_at(blk, row, preserve_unit_loops=True)
    # vectorize the inner loops of spatial stages
    for blk in blocks:
        if _is_spatial(sch, blk):
            bl = sch.get_loops(blk)
            if len(bl) > 1:
                _vectorize_inner(sch, bl[-1], lanes)
    return True
