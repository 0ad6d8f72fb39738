"""Parallel loops whose items the threads claim one at a time, so a core that runs slow
does not hold the kernel back.

TVM's CPU codegen splits a parallel loop statically: with n tasks, task t runs items
[t * ceil(N / n), ...). The kernel ends when the slowest task does. A core that runs slower
than the others (a busy SMT sibling or a noisy neighbour on a cloud VM, an efficiency core
on a hybrid CPU, a LITTLE core on an edge board) then sets the time of every kernel: on the
2-core VM this project benches on, one core at a time ran a dense at 60% of the other's
speed for seconds at a stretch.

A loop annotated with CLAIM_ITEMS is rewritten after lowering into

    next[s], end[s] = the static split of the items into `slots` contiguous parts
    for slot in parallel(slots):               # TVM's static split, now of slots
        cursor = slot
        item = claim(next, end, &cursor)
        if item >= 0:
            scratch = ...                      # the item's buffers, once per slot
            while item >= 0:
                body(item)
                item = claim(next, end, &cursor)

where ``claim`` takes the next item of the cursor's slot and, when that slot is spent,
moves the cursor on to the following slots in turn (an atomic add on a counter per slot,
each counter on its own cache line). Left alone, every task runs exactly its static share
in the same order as before (the rows a core wrote are the rows it reads next:
f32_dense's docstring); only the tail of a slow core's share moves to a fast one.

The thread count is not known at compile time, so there are more slots than the target
has cores (slots_for): a task given several slots drains them in order, from its first,
and its later slots find the "all claimed" flag set and end at once. Each slot costs
every call of the kernel a little (64 slots added 2.2 us to a trivial kernel, 8 slots
0.3 us), so the count follows the target's cores.

The claim function is LLVM IR (atomicrmw), imported into the kernel as the micro-kernels
are; it has no target-specific instructions, so x86 and aarch64 kernels share it.
"""

from __future__ import annotations

import tvm
from tvm import tirx

from .tir_util import _expr_vars, _node, _subexprs, each_prim_func, loop_with

#: the loop annotation that asks for claimed items (read by ClaimWork after lowering)
CLAIM_ITEMS = "portable_pe_claim_items"
#: int32 words from one slot's counter to the next: a 64-byte cache line each, so two
#: threads claiming from their own slots do not pass a line between them (packed, 8
#: slots on one line made a 2000-item loop on 2 threads 3.7x slower)
_LINE = 16
#: slots when the target does not say how many cores it has
_UNKNOWN_CORES_SLOTS = 64
_CLAIM = "portable_pe_claim"


def slots_for(target) -> int:
    """Slots per claimed loop: twice the target's cores (SMT siblings), at least 8; 64
    for a target without a core count. More threads than slots leave the extra idle."""
    cores = int(target.attrs.get("num-cores", 0)) if target is not None else 0
    return max(8, 2 * cores) if cores > 0 else _UNKNOWN_CORES_SLOTS


def claim_layout(slots: int) -> tuple[int, int, int]:
    """(word of the first slot's end, word of the all-claimed flag, words in all) of the
    claim state: slot s's next item at word s * 16, the ends packed after the counters
    (written once, before the launch), the flag on a line of its own."""
    ends = slots * _LINE
    flag = ends + -(-slots // _LINE) * _LINE
    return ends, flag, flag + _LINE


def claim_ir() -> str:
    """LLVM IR of i32 portable_pe_claim(ptr state, ptr cursor, i32 slots): the next item of
    slot *cursor or, once it is spent, of the slots after it in turn (*cursor then moves
    to the slot it came from, so the next call starts there); -1 when every item is
    claimed. `state` as claim_layout(slots) lays it out. The flag is read only once the
    cursor's slot is spent: the common claim is two loads and an atomic add."""
    return f"""
define internal i32 @{_CLAIM}(ptr %state, ptr %cursor, i32 %slots) {{
entry:
  %ends_at = mul i32 %slots, {_LINE}
  %ends = getelementptr i32, ptr %state, i32 %ends_at
  %lines_up = add i32 %slots, {_LINE - 1}
  %lines = sdiv i32 %lines_up, {_LINE}
  %ends_len = mul i32 %lines, {_LINE}
  %flag_at = add i32 %ends_at, %ends_len
  %flag_ptr = getelementptr i32, ptr %state, i32 %flag_at
  %start = load i32, ptr %cursor, align 4
  br label %scan
scan:
  %i = phi i32 [0, %entry], [%i_next, %next]
  %at = add i32 %start, %i
  %wraps = icmp sge i32 %at, %slots
  %at_wrapped = sub i32 %at, %slots
  %s = select i1 %wraps, i32 %at_wrapped, i32 %at
  %end_ptr = getelementptr i32, ptr %ends, i32 %s
  %end = load i32, ptr %end_ptr, align 4
  %word = mul i32 %s, {_LINE}
  %ptr = getelementptr i32, ptr %state, i32 %word
  %seen = load atomic i32, ptr %ptr monotonic, align 4
  %left = icmp slt i32 %seen, %end
  br i1 %left, label %take, label %spent
take:
  %got = atomicrmw add ptr %ptr, i32 1 monotonic
  %ours = icmp slt i32 %got, %end
  br i1 %ours, label %found, label %spent
found:
  store i32 %s, ptr %cursor, align 4
  ret i32 %got
spent:
  %i_next = add i32 %i, 1
  %first = icmp eq i32 %i, 0
  br i1 %first, label %check_flag, label %next
check_flag:
  %flag = load atomic i32, ptr %flag_ptr monotonic, align 4
  %done = icmp ne i32 %flag, 0
  br i1 %done, label %none, label %next
next:
  %more = icmp slt i32 %i_next, %slots
  br i1 %more, label %scan, label %all_claimed
all_claimed:
  store atomic i32 1, ptr %flag_ptr monotonic, align 4
  br label %none
none:
  ret i32 -1
}}
"""


def _flat(stmt) -> list:
    """A sequence's statements with nested sequences spliced in."""
    if isinstance(stmt, tirx.SeqStmt):
        return [s for child in stmt.seq for s in _flat(child)]
    return [stmt]


def _item_scratch(loop: tirx.For):
    """The statements at the top level of the loop body that do not depend on the item:
    its scratch buffers (f32_dense's padded rows, the attention's tiles) and the values
    their sizes are computed from (CSE's bindings of the key count); and the rest of the
    body. None where a scratch buffer's size depends on the item.

    The scratch moves out of the while loop: allocated once per slot that gets an item
    (once per thread, when the threads run as many slots each), not once per item, and
    freed where it was allocated (LowerTVMBuiltin frees a heap allocation at the end of
    its enclosing scope, which a while loop's body is not: LLVM rejected the free as not
    dominated by its allocation)."""
    per_item = {loop.loop_var}
    hoisted, rest = [], []
    for stmt in _flat(loop.body):
        if isinstance(stmt, tirx.LetStmt):
            # arithmetic on values bound before the item: the same for every item
            pure = all(_node(e) not in ("BufferLoad", "Call") for e in _subexprs(stmt.value))
            if pure and not _expr_vars(stmt.value) & per_item:
                hoisted.append(stmt)
            else:
                per_item.add(stmt.var)
                rest.append(stmt)
        elif isinstance(stmt, tirx.AllocBuffer):
            if any(_expr_vars(extent) & per_item for extent in stmt.buffer.shape):
                return None
            hoisted.append(stmt)
        else:
            rest.append(stmt)
    return hoisted, rest


def _claimed_loop(loop: tirx.For, slots: int, scratch: list, rest: list) -> tirx.Stmt:
    """The statements that replace one annotated parallel loop (module docstring); `scratch`
    and `rest` split its body (_item_scratch)."""
    i32 = "int32"
    n = tirx.Cast("int64", loop.extent)
    ends_at, flag_at, words = claim_layout(slots)
    nxt = tirx.decl_buffer((words,), i32, name=f"{loop.loop_var.name}_claims")
    # [the item claimed, the slot the next claim starts at]
    item = tirx.decl_buffer((2,), i32, name=f"{loop.loop_var.name}_item", scope="local")
    s = tirx.Var("s", i32)
    slot = tirx.Var(f"{loop.loop_var.name}_slot", i32)
    claim = tirx.call_extern(i32, _CLAIM, nxt.access_ptr("rw"), item.access_ptr("rw", offset=1),
                             tirx.IntImm(i32, slots))

    def first_item(k):  # of slot k: k * n / slots, in 64 bits
        return tirx.Cast(i32, tirx.Cast("int64", k) * n // slots)
    init = tirx.SeqStmt([
        tirx.For(s, tirx.IntImm(i32, 0), tirx.IntImm(i32, slots), tirx.ForKind.SERIAL, tirx.SeqStmt([
            tirx.BufferStore(nxt, first_item(s), [s * _LINE]),
            tirx.BufferStore(nxt, first_item(s + 1), [s + ends_at]),
        ])),
        tirx.BufferStore(nxt, tirx.IntImm(i32, 0), [tirx.IntImm(i32, flag_at)]),
    ])
    index = loop.min + tirx.Cast(str(loop.loop_var.ty), tirx.BufferLoad(item, [0]))
    body = tirx.SeqStmt([
        tirx.LetStmt(loop.loop_var, index),
        *rest,
        tirx.BufferStore(item, claim, [0]),
    ])
    loop_of_claims = tirx.While(tirx.BufferLoad(item, [0]) >= 0, body)
    claims = tirx.SeqStmt([
        tirx.AllocBuffer(item),
        tirx.BufferStore(item, slot, [1]),
        tirx.BufferStore(item, claim, [0]),
        # the scratch only where the first claim got an item: a task's later slots find
        # every item claimed (its first slot went on to them) and allocate nothing
        tirx.IfThenElse(tirx.BufferLoad(item, [0]) >= 0,
                        tirx.SeqStmt([*scratch, loop_of_claims]) if scratch else loop_of_claims, None),
    ])
    parallel = tirx.For(slot, tirx.IntImm(i32, 0), tirx.IntImm(i32, slots), tirx.ForKind.PARALLEL, claims,
                        annotations={k: v for k, v in loop.annotations.items() if k != CLAIM_ITEMS})
    return tirx.AttrStmt(slot, "pragma_import_llvm", tvm.ir.StringImm(claim_ir()),
                         tirx.SeqStmt([tirx.AllocBuffer(nxt), init, parallel]))


def _is_one(expr) -> bool:
    return isinstance(expr, tirx.IntImm) and int(expr) == 1


def claim_work(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """`func` with every parallel loop annotated CLAIM_ITEMS rewritten (module docstring)."""
    from tvm_ffi.structural import structural_mutate

    def rewrite(loop, mutator):
        loop = mutator.default_mutate(loop)
        if loop.kind != tirx.ForKind.PARALLEL or CLAIM_ITEMS not in loop.annotations:
            return loop
        step = getattr(loop, "step", None)
        split = _item_scratch(loop)
        if split is None or (step is not None and not _is_one(step)):
            # left to the static split: correct, only not balanced
            return loop_with(loop, without=CLAIM_ITEMS)
        return _claimed_loop(loop, slots, *split)
    slots = slots_for(func.attrs["target"] if func.attrs is not None and "target" in func.attrs else None)
    return func.with_body(structural_mutate(func.body, [(tirx.For, rewrite)]))


@tvm.transform.module_pass(opt_level=0, name="ClaimWork")
def ClaimWork(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """claim_work on every PrimFunc of a lowered module."""
    return each_prim_func(mod, claim_work)


#: the name of TVM's default TIR pipeline followed by ClaimWork, once registered
TIR_PIPELINE = "portable_pe_cpu"


def _pipeline_factory():
    from tvm.s_tir.pipeline import default_s_tir_pipeline
    from .bf16_rounding import NativeBF16Rounding
    lower, finalize_host, finalize_device = default_s_tir_pipeline()
    return tvm.transform.Sequential([lower, ClaimWork, NativeBF16Rounding]), finalize_host, finalize_device


def cpu_tir_pipeline(target) -> str:
    """The ``tir_pipeline`` for tvm.compile: TIR_PIPELINE for CPU (llvm) targets, TVM's
    default elsewhere. Registers TIR_PIPELINE the first time."""
    if target.kind.name != "llvm":
        return "default"
    from tvm.tirx.compilation_pipeline import PIPELINE_MAP
    if TIR_PIPELINE not in PIPELINE_MAP:
        tirx.register_tir_pipeline(TIR_PIPELINE, _pipeline_factory)
    return TIR_PIPELINE
