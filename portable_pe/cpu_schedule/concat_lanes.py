"""Spatial blocks that pick their value per position of a static dim: the concat of RoPE's
rotate-half (``cat(-x2, x1)``); the rule fires in the rope, vit_rope_2d and video_mrope
builds.

After inlining, such a block stores ``if_then_else(32 <= d, A, B)``. Vectorized along
``d``, the condition differs between lanes, and TVM's VectorizeLoop then scalarizes the
whole loop body: every element pays its loads, its index arithmetic and its branch.

So the vectorized dim is partitioned at each boundary the conditions name
(``loop_partition``): in each part the condition is a constant once the loop's range is
known, the simplifier removes it, and the part vectorizes with plain contiguous loads.
The rope graph's q kernel (B1 T512, 2 threads, spinning pool): 0.26 -> 0.16 ms per run of
four layers. transpose_tiles uses the same parts for the Kᵀ kernel's values.
"""

from __future__ import annotations

from .loops import _parallel_items, _positions_outside_heads
from .tir_util import _is_store, _loop_extent, _node, _subexprs

_COMPARISONS = ("LE", "LT", "GE", "GT")


def boundaries(block) -> dict:
    """{iter var: sorted positions} where an ``if_then_else`` condition of the block's
    stored value switches, for conditions ``c <= v``, ``v < c`` and the like (v a block
    iter var, c a constant): the first index of each new part."""
    if not _is_store(block.body):
        return {}
    iter_vars = {iv.var for iv in block.iter_vars}
    found: dict = {}
    for expr in _subexprs(block.body.value):
        if _node(expr) == "Call" and getattr(expr.op, "name", "").endswith("if_then_else"):
            _record(expr.args[0], iter_vars, found)
    return {var: sorted(points) for var, points in found.items()}


def _record(cond, iter_vars, found):
    kind = _node(cond)
    if kind not in _COMPARISONS:
        return
    a, b = cond.a, cond.b
    # normalize to "var OP const" (flip the comparison when the constant is on the left)
    if _node(a) == "IntImm" and _node(b) == "Var":
        a, b = b, a
        kind = {"LE": "GE", "LT": "GT", "GE": "LE", "GT": "LT"}[kind]
    if not (_node(a) == "Var" and _node(b) == "IntImm"):
        return
    var = next((v for v in iter_vars if v.same_as(a)), None)
    if var is None:
        return
    c = int(b.value)
    # v < c and v >= c switch at c; v <= c and v > c at c + 1
    found.setdefault(var, set()).add(c if kind in ("LT", "GE") else c + 1)


def concat_cuts(sch, block, loop_index: int):
    """The boundaries (``boundaries``) inside the static extent of the block's loop
    ``loop_index`` (bound to iter var ``loop_index`` of a plain nest), or []."""
    stmt = sch.get(block)
    var = stmt.iter_vars[loop_index].var
    extent = _loop_extent(sch, sch.get_loops(block)[loop_index])
    cuts = next((c for v, c in boundaries(stmt).items() if v.same_as(var)), [])
    return [c for c in cuts if extent is not None and 0 < c < extent]


def part_width(extent: int, cuts, lanes: int):
    """The widest vector (at most ``lanes``, at least 4) dividing the extent and every cut."""
    width = lanes
    while width >= 4 and (extent % width or any(c % width for c in cuts)):
        width //= 2
    return width if width >= 4 else None


def vectorize_in_parts(sch, loop, cuts, lanes: int) -> bool:
    """Vectorize ``loop`` (static extent, starting at 0) so that no vector straddles a
    cut: split it by a width dividing every cut, then partition the loop over vectors
    at the cuts (a partitioned loop no longer starts at 0, and split refuses such a
    loop). False, and nothing done, when no width of 4 lanes or more divides them."""
    extent = _loop_extent(sch, loop)
    width = part_width(extent, cuts, lanes)
    if width is None:
        return False
    vectors, lane = sch.split(loop, [None, width])
    sch.vectorize(lane)
    if cuts and extent // width > 1:
        # the sizes, in vectors, of every part but the last, which loop_partition infers
        sch.loop_partition(vectors, [(b - a) // width for a, b in zip([0, *cuts], cuts)])
    return True


def schedule_concat_lanes(sch, block, lanes: int, parallel: bool = True) -> bool:
    """Schedule ``block`` (a plain spatial nest whose innermost dim is a concat dim) with
    that dim vectorized in parts (see the module doc). False, and the schedule untouched,
    when the block has no such dim."""
    loops = sch.get_loops(block)
    if len(loops) != len(sch.get(block).iter_vars) or not loops:
        return False
    cuts = concat_cuts(sch, block, len(loops) - 1)
    extent = _loop_extent(sch, loops[-1])
    if not cuts or part_width(extent, cuts, lanes) is None:
        return False
    loops = _positions_outside_heads(sch, block)
    if parallel and len(loops) > 1:
        _parallel_items(sch, loops[:-1], extent)
    return vectorize_in_parts(sch, loops[-1], cuts, lanes)
