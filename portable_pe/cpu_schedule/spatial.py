"""Spatial (injective) blocks: inlining, vectorize/parallel helpers, the generic rule.

Everything that is neither a matmul nor a row reduction (transposes, RoPE
slice/concat chains, splits, casts, ...) gets the generic rule: parallel outer
fused loop, vectorized inner loop.

Symbolic extents are handled by splitting with fixed factors; TVM adds a
predicate for the tail and the TIR ``LoopPartition`` pass peels it.
"""

from __future__ import annotations

import re

from .concat_lanes import schedule_concat_lanes
from .loops import _parallel_items, _positions_outside_heads, _vectorize_inner
from .tir_util import (_const_int, _expr_vars, _is_spatial, _is_store, _load_buffer, _loads_of_value, _loop_extent,
                       _region_buffer)
from .transpose_tiles import schedule_transpose_tiles


def _try_inline_spatial(sch, blocks):
    """Inline cheap injective blocks; return remaining blocks in order."""
    changed = True
    while changed:
        changed = False
        for blk in list(blocks):
            if not _is_spatial(sch, blk):
                continue
            # Inlining copies the producer's expression to every load of it. Skip it when
            # that recomputes transcendental math (e.g. softmax exp) or a big expression:
            # T5's bucket chain reads each step 2-4 times, and inlining all of it, forward
            # or in reverse, made an 11 KB expression that took TIR's simplifier 13 s.
            if ((not _recomputes(sch, blk, sch.get_consumers(blk)) and _applied(sch.compute_inline, blk))
                    or (not any(_recomputes(sch, p, [blk]) for p in sch.get_producers(blk))
                        and _applied(sch.reverse_compute_inline, blk))):
                blocks.remove(blk)
                changed = True
                break
    return blocks


def _applied(primitive, blk) -> bool:
    """Apply a schedule primitive; False (the schedule unchanged) where it does not apply."""
    try:
        primitive(blk)
        return True
    except Exception:  # pylint: disable=broad-except
        return False


def _recomputes(sch, producer, consumers) -> bool:
    """Whether inlining ``producer`` into ``consumers`` would evaluate an expensive or
    big expression more than once per element: they load its output more than once."""
    block = sch.get(producer)
    if not (_has_expensive_math(block) or _is_big(block)):
        return False
    out = _region_buffer(block.writes[0])
    load = re.compile(rf"(?<![\w.]){re.escape(out.name)}\[")
    if sum(len(load.findall(str(sch.get(c).body))) for c in consumers) > 1:
        return True
    # a consumer that broadcasts it (a [T, D] position table added to [B, T, D] tokens)
    # would compute it again for every batch item
    return any(_reads_broadcast(sch.get(c), out) for c in consumers)


def _reads_broadcast(block, buffer) -> bool:
    """Whether `block` reads one element of `buffer` in several of its iterations: a load
    whose indices leave out one of the block's iteration variables (of extent > 1)."""
    if not _is_store(block.body):
        return False
    iters = [iv.var for iv in block.iter_vars if _const_int(iv.dom.extent) != 1]
    for load in _loads_of_value(block.body.value):
        if _load_buffer(load).same_as(buffer):
            used = set().union(*(_expr_vars(index) for index in load.indices))
            if any(var not in used for var in iters):
                return True
    return False


_EXPENSIVE_OPS = ("exp", "log", "tanh", "erf", "sigmoid", "pow", "sqrt", "rsqrt", "sin", "cos")


def _is_big(block) -> bool:
    """Large expression (e.g. an expanded polynomial fast_exp): not worth recomputing."""
    try:
        return len(str(block.body)) > 600
    except Exception:  # pylint: disable=broad-except
        return True


def _has_expensive_math(block) -> bool:
    """Whether the block body calls transcendental math (or divides)."""
    try:
        text = str(block.body)
    except Exception:  # pylint: disable=broad-except
        return True
    return any(f"{k}(" in text for k in _EXPENSIVE_OPS) or " / " in text


# --------------------------------------------------------------------------------------
# Rule: generic injective fallback
# --------------------------------------------------------------------------------------
def _schedule_spatial_block(sch, block, lanes, parallel=True):
    loops = sch.get_loops(block)
    if not loops:
        return
    if schedule_concat_lanes(sch, block, lanes, parallel) or schedule_transpose_tiles(sch, block, lanes, parallel):
        return
    loops = _positions_outside_heads(sch, block)
    # An innermost dim narrower than a vector (the pairs of an interleaved rotation,
    # [..., 32, 2] or [..., 32, 1]) leaves nothing to vectorize: fuse static inner dims
    # until they fill one.
    while len(loops) > 1:
        inner_ext, next_ext = _loop_extent(sch, loops[-1]), _loop_extent(sch, loops[-2])
        if inner_ext is None or next_ext is None or inner_ext >= lanes:
            break
        loops = [*loops[:-2], sch.fuse(loops[-2], loops[-1])]
    inner = loops[-1]
    rest = list(loops[:-1])
    ext = _loop_extent(sch, inner)
    # Vectorize the innermost loop when its extent is static (contiguous in
    # practice); for a dynamic innermost dim, split and vectorize with a tail.
    outer = _vectorize_inner(sch, inner, lanes)
    if outer is not None and outer is not inner:
        # keep outer part of the innermost dim serial inside the parallel loop
        pass
    if parallel and rest:
        _parallel_items(sch, rest, ext)
    elif parallel and outer is not None and ext is None:
        sch.parallel(outer)
