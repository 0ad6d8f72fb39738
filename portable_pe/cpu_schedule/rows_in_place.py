"""The float32 dense's row tiles read in place from A instead of from a padded copy.

f32_dense pads the row axis to whole 12-row tiles (pad_einsum), which makes a copy of each
row tile of A, zero rows added past the last real row, before the micro-kernel reads it.
For a K x N weight the copy is 12 x K floats per work item against 12 x K x (N / groups)
multiply-adds, and it runs with no multiply-adds to hide behind: at K = 1024, N = 256 (a
d = 256 encoder's FFN down projection) the dense ran at 0.82-0.85 of the FMA peak with the
copy and 0.91 at a 12-divisible static M that needs none (2 threads, measured in
alternation with the peak). The micro-kernel takes the number of real rows instead
(f32_tiles: rows past it repeat the last real row, whose results land in the padded
output rows that the epilogue never reads), so a tile is read where it lies.

This rewrite runs on the scheduled function: each copy f32_dense marked (ROWS_IN_PLACE on
the copy's block) is dropped, and each micro-kernel call that read it reads the copy's
source at the same indices, told how many rows the source has from the tile's first on.
A copy anything else reads is left alone.
"""

from __future__ import annotations

from tvm import tirx
from tvm.ir.expr import TensorLoad
from tvm.s_tir import MatchBufferRegion, SBlock, SBlockRealize
from tvm_ffi.structural import structural_equal, structural_mutate, structural_walk

from .tir_util import _is_load, _node, is_extern_call

#: the block annotation f32_dense puts on a row-padding copy the micro-kernel alone reads
ROWS_IN_PLACE = "portable_pe.rows_in_place"


def _row_copy(block) -> tuple | None:
    """(padded buffer, source buffer) when ``block`` is a marked copy of the form
    P[idx] = if_then_else(cond, A[idx], 0); None otherwise."""
    if ROWS_IN_PLACE not in block.annotations or _node(block.body) != "BufferStore":
        return None
    store = block.body
    value = store.value
    if _node(value) != "Call" or getattr(value.op, "name", "") != "prim.if_then_else":
        return None
    load = value.args[1]
    if not _is_load(load) or len(load.indices) != len(store.indices):
        return None
    if not all(structural_equal(a, b) for a, b in zip(load.indices, store.indices)):
        return None
    return store.buffer, load.source


def _unread_copies(func) -> tuple[dict, set]:
    """The marked copies that nothing but micro-kernel calls reads ({padded buffer:
    source}) and their blocks' names. A copy's own load is of its source, so any load of
    a padded buffer is another reader."""
    copies, blocks, loaded = {}, {}, set()

    def note_copy(block):
        found = _row_copy(block)
        if found is not None:
            copies[found[0]] = found[1]
            blocks[block.name_hint] = found[0]

    def note_load(load):
        loaded.add(load.source)
    structural_walk(func.body, [(SBlock, note_copy), (TensorLoad, note_load)])
    unread = {p: a for p, a in copies.items() if p not in loaded}
    return unread, {name for name, padded in blocks.items() if padded in unread}


def _only_copies(stmt, copy_blocks: set) -> bool:
    """Whether ``stmt`` does nothing but run the given copy blocks."""
    kind = _node(stmt)
    if kind == "For":
        return _only_copies(stmt.body, copy_blocks)
    if kind == "SeqStmt":
        return all(_only_copies(s, copy_blocks) for s in stmt.seq)
    if isinstance(stmt, SBlockRealize):
        return stmt.block.name_hint in copy_blocks
    return False


def read_rows_in_place(func: tirx.PrimFunc, kernel_prefix: str) -> tirx.PrimFunc:
    """``func`` with the marked row copies gone and the calls of ``kernel_prefix``
    micro-kernels reading their sources (module docstring). The call's last argument is
    the number of rows the source has from the tile's first row on."""
    copies, copy_blocks = _unread_copies(func)
    if not copies:
        return func

    def drop_copy(loop, mutator):
        if _only_copies(loop, copy_blocks):
            return tirx.Evaluate(0)
        return mutator.default_mutate(loop)

    def retarget(block, mutator):
        block = mutator.default_mutate(block)
        allocs = [b for b in block.alloc_buffers if b not in copies]
        targets = [mb for mb in block.match_buffers if mb.source.source in copies]
        if not targets and len(allocs) == len(block.alloc_buffers):
            return block
        body = block.body
        if targets:
            if len(targets) != 1 or not is_extern_call(body, (kernel_prefix,)):
                raise ValueError(f"rows_in_place: block {block.name_hint} reads a row copy but is not one "
                                 f"{kernel_prefix} call")
            region = targets[0].source
            source = copies[region.source]
            row_axis = len(source.shape) - 2
            # int32 (f32_tiles): TVM's NarrowDataType makes this difference int32 whenever
            # the row count is static, and a call whose argument types differ from the
            # kernel's names another function, which no module defines
            rows_left = tirx.Cast("int32", source.shape[row_axis] - region.region[row_axis].min)
            call = body.value
            body = tirx.Evaluate(tirx.call_extern("int32", str(call.args[0].value), *call.args[1:-1], rows_left))
        match_buffers = [
            MatchBufferRegion(mb.buffer, tirx.BufferRegion(copies[mb.source.source], mb.source.region))
            if mb.source.source in copies else mb
            for mb in block.match_buffers
        ]
        reads = [tirx.BufferRegion(copies.get(r.source, r.source), r.region) for r in block.reads]
        return SBlock(block.iter_vars, reads, block.writes, block.name_hint, body, block.init,
                      allocs, match_buffers, block.annotations)

    return func.with_body(structural_mutate(func.body, [(tirx.For, drop_copy), (SBlock, retarget)]))
