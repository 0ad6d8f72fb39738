"""Run a parallel loop nest serially when its work is too small to pay for the threads.

Every ``T.parallel`` loop becomes one TVMBackendParallelLaunch, which wakes the pool's
workers. A worker that sleeps between kernels (the bench's setting for every engine,
TVM_THREAD_POOL_SPIN_COUNT=0, see bench.set_threads) takes tens of microseconds to
wake on a virtual machine. That costs more than the kernel itself when the kernel is
small: on the 2-core test machine, the rope encoder's bias add over 128x256 floats took
6 us on one thread and 26-31 us on two, and its q/k/v split 26 us and 72-85 us.
onnxruntime avoids this with a cost model that runs small ops on the calling thread;
this pass does the same per loop nest: ``if work < limit: serial copy else: parallel``.
The work of a nest with a symbolic sequence length is only known when it runs, so the
test is a runtime branch; for static shapes it folds away.
"""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx
from tvm.sym import Analyzer
from tvm.ir import IRModule

from .tir_util import _blocks_under, _node, _region_buffer, loop_with

# Loop iterations (vector lanes counted one by one) below which a nest runs serially:
# about 15-40 us of one core's work for elementwise code, the cost of one wake-up.
SERIAL_BELOW_ITERATIONS = 1 << 17

#: block annotation: the block's work in innermost iterations, where its body does not show
#: it (a micro-kernel call, f32_dense: rows x columns x K multiply-adds)
WORK_ITERATIONS = "portable_pe.work_iterations"


def _iterations(stmt, outer_vars: set) -> tvm.tirx.PrimExpr | int:
    """Total innermost iterations of a loop nest (an upper bound where extents vary)."""
    kind = _node(stmt)
    if kind == "For":
        extent = stmt.extent
        if set(tirx.analysis.undefined_vars(extent, [])) & outer_vars:
            extent = 1  # an extent that depends on an enclosing loop: count it once
        return extent * _iterations(stmt.body, outer_vars | {stmt.loop_var})
    if kind == "SeqStmt":
        total = 0
        for item in stmt.seq:
            total = total + _iterations(item, outer_vars)
        return total
    if kind == "SBlockRealize":
        block = stmt.block
        if WORK_ITERATIONS in block.annotations:
            return int(block.annotations[WORK_ITERATIONS])
        inner = _iterations(block.body, outer_vars | {iv.var for iv in block.iter_vars})
        return inner + (_iterations(block.init, outer_vars) if block.init is not None else 0)
    if kind == "IfThenElse":
        then = _iterations(stmt.then_case, outer_vars)
        other = _iterations(stmt.else_case, outer_vars) if stmt.else_case is not None else 0
        return tvm.tirx.max(then, other) if not (isinstance(then, int) and isinstance(other, int)) else max(then, other)
    return 1


def _small_when_non_empty(small) -> bool:
    """Whether the work test holds with every symbolic dim at 1, the smallest input that is
    not empty (work grows with every dim, so it then holds for no non-empty input)."""
    analyzer = Analyzer()
    for var in tirx.analysis.undefined_vars(small, []):
        analyzer.bind(var, tirx.const(1, str(var.ty.dtype)))  # TVM 0.27: a Var's dtype is on its type
    folded = analyzer.simplify(small)
    return not (_node(folded) == "IntImm" and not folded.value)


def _buffers_touched(stmt) -> list:
    """Buffers read or written by the blocks under `stmt`."""
    return [_region_buffer(r) for block in _blocks_under(stmt) for r in (*block.reads, *block.writes)]


def _serial(loop):
    return loop_with(loop, kind=tirx.ForKind.SERIAL)


def serial_when_small(func: tirx.PrimFunc, limit: int = SERIAL_BELOW_ITERATIONS) -> tirx.PrimFunc:
    """``func`` with each top-level parallel nest guarded by a work test (or made serial)."""
    realize = func.body
    if _node(realize) != "SBlockRealize":
        return func
    root = realize.block
    body = root.body
    items = list(body.seq) if _node(body) == "SeqStmt" else [body]
    analyzer = Analyzer()
    changed = False
    new_items = []
    allocs = list(root.alloc_buffers)
    owners = [set() for _ in allocs]  # per root-allocated buffer: the top-level items using it
    for index, stmt in enumerate(items):
        touched = _buffers_touched(stmt)
        for n, alloc in enumerate(allocs):
            if any(buf.same_as(alloc) for buf in touched):
                owners[n].add(index)
    for index, stmt in enumerate(items):
        if _node(stmt) != "For" or stmt.kind != tirx.ForKind.PARALLEL:
            new_items.append(stmt)
            continue
        work = _iterations(stmt, set())
        small = analyzer.simplify(work < limit) if not isinstance(work, int) else work < limit
        if isinstance(small, bool) or _node(small) == "IntImm":
            small = bool(small if isinstance(small, bool) else small.value)
            new_items.append(_serial(stmt) if small else stmt)
            changed |= small
            continue
        if not _small_when_non_empty(small):
            # e.g. "T < 1" for a nest over 32-row blocks of 8 x 512 elements: its serial
            # copy would run only on an empty input, and TVM's simplifier, told T < 1,
            # divides by the zero block count it then derives ("Divide by zero")
            new_items.append(stmt)
            continue
        # A root-allocated intermediate of this nest only (a matmul's accumulator tile, a
        # norm's row sums) is compacted by TVM into a small stack array at the nest's
        # loop that uses it. Two copies of the nest would make the root the common
        # ancestor of its uses: TVM then allocates it there, full size, on the heap
        # (measured: an attention QK^T at T=512 ran 2-3x slower, its accumulator stored
        # after every FMA). Such nests keep one, parallel, copy. Intermediates shared
        # with another nest (a matmul's zero-padded operand) are at the root either way,
        # so those nests are guarded: the pad copies before each matmul, for one.
        if any(users == {index} for users in owners):
            new_items.append(stmt)
            continue
        new_items.append(tirx.IfThenElse(small, _serial(stmt), stmt))
        changed = True
    if not changed:
        return func
    new_body = new_items[0] if len(new_items) == 1 else tirx.SeqStmt(new_items)
    new_root = s_tir.SBlock(root.iter_vars, root.reads, root.writes, root.name_hint, new_body, root.init,
                            root.alloc_buffers, root.match_buffers, root.annotations)
    new_func = func.with_body(s_tir.SBlockRealize(realize.iter_values, realize.predicate, new_root))
    # The two copies of a nest define the same loop and block variables: give each its own.
    return s_tir.transform.ConvertSSA()(IRModule({"main": new_func}))["main"]


@tvm.transform.module_pass(opt_level=0, name="SerialWhenSmall")
class SerialWhenSmall:  # pylint: disable=too-few-public-methods
    """Apply serial_when_small to every PrimFunc (default and tuned schedules alike)."""

    def __init__(self, limit: int = SERIAL_BELOW_ITERATIONS):
        self.limit = limit

    def transform_module(self, mod: IRModule, _ctx) -> IRModule:
        updates = {}
        for gv, func in mod.functions_items():
            if isinstance(func, tirx.PrimFunc):
                new_func = serial_when_small(func, self.limit)
                if not new_func.same_as(func):
                    updates[gv] = new_func
        for gv, func in updates.items():
            mod[gv] = func
        return mod
