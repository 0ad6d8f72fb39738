"""Parallel loops whose items the threads claim (work_claims): the claim order (own slot,
then the slots after it), every item done exactly once at any thread count, the scratch
allocated once per task, and kernels built with claims equal to the static ones bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, tirx
from tvm.script import tirx as T
from tvm_ffi.structural import structural_equal

from portable_pe.cpu_schedule import cpu_pipeline
from portable_pe.cpu_schedule.tir_util import _node
from portable_pe.cpu_schedule import work_claims
from portable_pe.cpu_schedule.work_claims import CLAIM_ITEMS, claim_ir, claim_layout, cpu_tir_pipeline, slots_for
from portable_pe.host_cpu import cpu_flags

HOST = tvm.target.Target({"kind": "llvm", "num-cores": 2})


@pytest.fixture
def pool_threads():
    """Sets TVM's pool to n threads for the test, and back to what it was after."""
    config = tvm.get_global_func("runtime.config_threadpool")
    before = int(tvm.get_global_func("runtime.NumThreads")())
    yield lambda n: config(1, n)
    config(1, before)


def _serial_claims(n: int, slot: int, calls: int, slots: int) -> np.ndarray:
    """`calls` claims in a row from `slot`, on one thread, with the state set up as
    ClaimWork sets it (each slot at its first item, its end, the flag clear)."""
    ends, flag, words = claim_layout(slots)

    @T.prim_func
    def claims(out: T.Buffer((calls,), "int32")):
        state = T.alloc_buffer((words,), "int32")
        for s in range(slots):
            state[s * 16] = T.Cast("int32", T.Cast("int64", s) * n // slots)
            state[ends + s] = T.Cast("int32", T.Cast("int64", s + 1) * n // slots)
        state[flag] = 0
        cursor = T.alloc_buffer((1,), "int32")
        cursor[0] = slot
        for c in T.serial(calls, annotations={"pragma_import_llvm": claim_ir()}):
            out[c] = T.call_extern("int32", "portable_pe_claim", state.access_ptr("rw"), cursor.access_ptr("rw"),
                                   slots)

    f = tvm.compile(claims, target=HOST)
    out = tvm.runtime.tensor(np.zeros(calls, "int32"))
    f(out)
    return out.numpy()


@pytest.mark.parametrize("n,slot,slots", [(1000, 0, 64), (1000, 37, 64), (100, 63, 64), (5, 2, 8), (50, 7, 8),
                                          (30, 5, 20)])
def test_a_claim_takes_its_own_slot_first_then_the_slots_after_it_then_none(n, slot, slots):
    """One thread claiming from `slot` gets that slot's items in order, then each
    following slot's (wrapping past the last), then -1 every time after."""
    begin = [s * n // slots for s in range(slots + 1)]
    order = [s % slots for s in range(slot, slot + slots)]
    expected = [i for s in order for i in range(begin[s], begin[s + 1])] + [-1, -1, -1]
    np.testing.assert_array_equal(_serial_claims(n, slot, n + 3, slots), expected)


def test_slots_follow_the_targets_cores():
    """Twice the cores, at least 8; 64 where the target has no core count."""
    assert slots_for(HOST) == 8
    assert slots_for(tvm.target.Target({"kind": "llvm", "num-cores": 24})) == 48
    assert slots_for(tvm.target.Target({"kind": "llvm"})) == 64


def _counting_loop(items: int):
    """out[i] += 1 for each item of a parallel loop annotated CLAIM_ITEMS, with a scratch
    buffer per item (the shape of f32_dense's)."""
    @T.prim_func
    def count(a: T.handle, o: T.handle):
        rows = T.int64()
        x = T.match_buffer(a, (rows, 16), "float32")
        out = T.match_buffer(o, (rows,), "float32")
        for i in T.parallel(rows, annotations={CLAIM_ITEMS: 1}):
            scratch = T.decl_buffer((16,), "float32")
            for j in range(16):
                scratch[j] = x[i, j] * T.float32(2)
            out[i] = out[i] + scratch[3] + T.float32(1)
    return count


@pytest.mark.parametrize("threads", [1, 2, 3, 9, 20])
def test_every_item_runs_exactly_once_at_any_thread_count(threads, pool_threads):
    """1, 2 and 3 threads (3: the slots are not a multiple of it; 9 and 20: more threads
    than slots, some left idle), item counts below, at and above the slots: each output
    counted once."""
    pool_threads(threads)
    f = tvm.compile(tvm.IRModule({"count": _counting_loop(0)}), target=HOST, tir_pipeline=cpu_tir_pipeline(HOST))
    rng = np.random.default_rng(0)
    slots = slots_for(HOST)
    for rows in (1, 7, slots, slots + 1, 1000):
        x = rng.standard_normal((rows, 16)).astype("float32")
        out = tvm.runtime.tensor(np.zeros(rows, "float32"))
        f["count"](tvm.runtime.tensor(x), out)
        np.testing.assert_array_equal(out.numpy(), x[:, 3] * 2 + 1, err_msg=f"rows={rows}")


def _statements(stmt):
    yield stmt
    for child in ("body", "seq", "then_case", "else_case"):
        value = getattr(stmt, child, None)
        for c in (value if isinstance(value, (list, tvm.ir.Array)) else [value]):
            if isinstance(c, tirx.Stmt):
                yield from _statements(c)


def test_the_annotated_loop_becomes_claim_loops_over_slots_with_the_scratch_outside(monkeypatch):
    """After ClaimWork the parallel loop runs slots_for(target) slots, each a while loop of claims; the
    item's scratch is allocated in the slot, outside the while loop, once its first claim
    got an item; a parallel loop without the annotation is left as it was."""
    @T.prim_func
    def plain(a: T.Buffer((64,), "float32")):
        for i in T.parallel(64):
            a[i] = a[i] + T.float32(1)

    seen, original = {}, work_claims.claim_work

    def recording(func):
        out = original(func)
        seen[str(func.attrs["global_symbol"]).removeprefix("__tvm_ffi_")] = (func, out)
        return out

    monkeypatch.setattr(work_claims, "claim_work", recording)
    tvm.compile(tvm.IRModule({"count": _counting_loop(0), "plain": plain}), target=HOST,
                tir_pipeline=cpu_tir_pipeline(HOST))
    claimed = {name: out for name, (_, out) in seen.items()}
    assert structural_equal(*seen["plain"])
    stmts = list(_statements(claimed["count"].body))
    (parallel,) = [s for s in stmts if _node(s) == "For" and s.kind == tirx.ForKind.PARALLEL]
    assert int(parallel.extent) == slots_for(HOST) and CLAIM_ITEMS not in parallel.annotations
    inside = list(_statements(parallel.body))
    (loop,) = [s for s in inside if _node(s) == "While"]
    in_loop = list(_statements(loop.body))
    scratch = [s for s in inside if _node(s) == "AllocBuffer" and s.buffer.name == "scratch"]
    assert scratch and not [s for s in in_loop if _node(s) == "AllocBuffer"]
    # only a slot whose first claim got an item allocates it
    (first_claim_got_one,) = [s for s in inside if _node(s) == "IfThenElse"]
    assert any(s.same_as(scratch[0]) for s in _statements(first_claim_got_one.then_case))
    assert "portable_pe_claim" in claimed["count"].script()


@pytest.mark.skipif("avx512f" not in cpu_flags(), reason="this CPU has no avx512f (f32_dense's micro-kernel)")
@pytest.mark.parametrize("threads", [2, 3])
def test_a_dense_and_an_attention_with_claims_equal_the_static_ones_bit_for_bit(threads, pool_threads):
    """f32_dense (a GELU epilogue) and the attention kernel, each built with TVM's default
    TIR pipeline (the static split) and with ClaimWork: the same outputs bit for bit at
    ragged sizes."""
    from test_attention_kernel import H, _attention
    from test_f32_dense import _dense
    pool_threads(threads)
    target = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2})
    rng = np.random.default_rng(1)
    dense, _, _ = _dense(256, 128, "gelu", rng)
    shapes = {"dense": [lambda b, t: (b * t, 256), lambda b, t: (b * t, 128)],
              "attention": [lambda b, t: (b, H, t, 64)] * 3}
    for name, mod in (("dense", dense), ("attention", _attention(head_dim=64))):
        builds = [relax.VirtualMachine(tvm.compile(mod, target=target, relax_pipeline=cpu_pipeline(target),
                                                   tir_pipeline=tir), tvm.cpu())["main"]
                  for tir in ("default", cpu_tir_pipeline(target))]
        for b, t in [(1, 1), (2, 13), (3, 130)]:
            args = [tvm.runtime.tensor(rng.standard_normal(shape(b, t)).astype("float32")) for shape in shapes[name]]
            static, claimed = (f(*args).numpy() for f in builds)
            np.testing.assert_array_equal(claimed, static, err_msg=f"{name} b={b} t={t}")
