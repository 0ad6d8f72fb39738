"""The parallel and vector loops of a nest: the helpers every CPU rule shapes its loops with."""

from __future__ import annotations

from .tir_util import _expr_vars, _loads_of_value, _loop_extent

#: A dense over a constant weight up to this size (bytes) runs its work items row-major
#: (row tile outermost, the column groups inside it): the threads take contiguous ranges of
#: items, so each core computes whole rows, the rows the next kernel reads, and reads the
#: rows the previous kernel wrote on it. Each core then reads every weight panel per row
#: tile, so the weight must stay in its L2 (2 MiB a core here) with the rest; a bigger one
#: runs column groups outermost, each core holding only its group's panels. Measured in
#: f32_dense (float32) and amx_matmul (bf16, int8), whose docstrings give the figures.
ROW_MAJOR_MAX_WEIGHT_BYTES = 3 << 19


def row_major_items(k: int, n: int, element_bytes: int) -> bool:
    """Whether a dense's [K, N] constant weight is small enough for row-major work items
    (ROW_MAJOR_MAX_WEIGHT_BYTES)."""
    return k * n * element_bytes <= ROW_MAJOR_MAX_WEIGHT_BYTES


def _vectorize_inner(sch, loop, lanes):
    """Split ``loop`` by ``lanes`` and vectorize the inner part, if worthwhile.

    Returns the outer loop (or the loop itself when nothing was done)."""
    ext = _loop_extent(sch, loop)
    if ext is not None:
        if ext <= 1:
            return loop
        if ext <= lanes:
            sch.vectorize(loop)
            return None
        if ext % lanes == 0:
            outer, inner = sch.split(loop, [None, lanes])
            sch.vectorize(inner)
            return outer
        # static but not divisible: vectorize the largest power-of-two divisor
        vec = 1
        while vec * 2 <= lanes and ext % (vec * 2) == 0:
            vec *= 2
        if vec >= 4:
            outer, inner = sch.split(loop, [None, vec])
            sch.vectorize(inner)
            return outer
        return loop
    # Dynamic extent: a split would put a lane-dependent predicate in the
    # vector body, which TVM's VectorizeLoop scalarizes (and TIR LoopPartition
    # does not peel non-`likely` block predicates).  Leave the loop serial:
    # LLVM's loop vectorizer handles runtime trip counts with its own epilogue.
    return loop


def _parallel_outer(sch, loops):
    """Fuse the given (outer, spatial) loops and parallelize the result."""
    loops = [l for l in loops if l is not None]
    if not loops:
        return None
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    sch.parallel(fused)
    return fused


# A work item whose loops include a dynamic dim that is not the outermost finds its indices
# by dividing by that dim's extent at run time (64-bit divisions, tens of cycles each).
# Items of one vector (pack_v: 16 lanes per item, five such divisions) spend more on that
# than on their copy. So a dynamic dim inside the parallel loop takes in whole chunks of
# positions: at least this many elements per item.
_MIN_ITEM_ELEMENTS = 256
_MAX_CHUNK = 64


def _parallel_items(sch, loops, inner_elements):
    """Parallelize the outer ``loops`` of a spatial nest whose innermost (vectorized) part
    does ``inner_elements`` elements, with work items big enough to pay for their index
    arithmetic (see _MIN_ITEM_ELEMENTS). Static loops after the last dynamic one stay
    inside each item; when they and the inner part are still too little work, the dynamic
    loop is split and its inner chunk stays inside the item too."""
    loops = [l for l in loops if l is not None]
    dynamic = [i for i, l in enumerate(loops) if _loop_extent(sch, l) is None]
    if not dynamic or dynamic[-1] == 0 or inner_elements is None:
        return _parallel_outer(sch, loops)
    last = dynamic[-1]
    work = inner_elements
    for loop in loops[last + 1:]:
        work *= _loop_extent(sch, loop)
    if work >= _MIN_ITEM_ELEMENTS:
        return _parallel_outer(sch, loops[:last + 1])
    chunk = 1
    while chunk * work < _MIN_ITEM_ELEMENTS and chunk < _MAX_CHUNK:
        chunk *= 2
    chunks, _ = sch.split(loops[last], [None, chunk])
    return _parallel_outer(sch, [*loops[:last], chunks])


def _positions_outside_heads(sch, block):
    """The loops of a plain spatial nest, with its last two outer loops swapped when they
    are a static one (heads) and then a dynamic one (positions) whose reads index the heads
    in their contiguous dim and the positions in an earlier one: a head split, [B, T, H*D]
    read into [B, H, T, D]. Heads outside walked the input one head (D floats) per row of
    H*D (a row of q/k/v: 3 KiB apart); positions outside read each row's heads together.
    rope bf16 at B8 T512, the q kernel: 2.2 -> 1.2 ms."""
    loops = sch.get_loops(block)
    stmt = sch.get(block)
    if len(loops) < 3 or len(loops) != len(stmt.iter_vars) or not hasattr(stmt.body, "value"):
        return loops
    heads, positions = len(loops) - 3, len(loops) - 2
    if _loop_extent(sch, loops[heads]) is None or _loop_extent(sch, loops[positions]) is not None:
        return loops
    h, t = stmt.iter_vars[heads].var, stmt.iter_vars[positions].var
    for load in _loads_of_value(stmt.body.value):
        if len(load.indices) < 2:
            continue
        last, earlier = _expr_vars(load.indices[-1]), set().union(*(_expr_vars(i) for i in load.indices[:-1]))
        if h in last and t not in last and t in earlier:
            sch.reorder(loops[positions], loops[heads])
            return sch.get_loops(block)
    return loops
