"""The default CPU schedules: register tiles, packed weights, serial small nests.

The numeric checks here stay element-wise literals, not conftest.assert_parity: each holds
one scheduled kernel, element by element, to numpy at rtol 1e-5 or tighter (or exactly),
where the harness bounds only the largest error against 1e-4 of the largest value.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, tirx
from tvm.script import ir as I
from tvm.script import relax as R

from portable_pe.cpu_schedule import cpu_pipeline
from portable_pe.cpu_schedule.matmul import _STACK_ARRAY_LIMIT_BYTES, _register_tile
from portable_pe.cpu_schedule.small_work import SERIAL_BELOW_ITERATIONS, SerialWhenSmall
from portable_pe.cpu_schedule.tir_util import _blocks_under, _const_int, _node, _simd_registers, _vector_lanes, _walk
from portable_pe.host_cpu import cpu_flags

TARGETS = {
    "avx512": {"kind": "llvm", "mcpu": "znver4"},
    "avx2": {"kind": "llvm", "mcpu": "haswell"},
    "neon": {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]},
}
HOST = tvm.target.Target({"kind": "llvm", "num-cores": 2})
K, N = 64, 96


@I.ir_module
class Dense:
    @R.function
    def main(x: R.Tensor(("seq", K), "float32"), w: R.Tensor((K, N), "float32"), b: R.Tensor((N,), "float32")):
        with R.dataflow():
            y = R.add(R.matmul(x, w), b)
            R.output(y)
        return y


@I.ir_module
class AddBias:
    @R.function
    def main(x: R.Tensor(("seq", 256), "float32"), b: R.Tensor((256,), "float32")):
        with R.dataflow():
            y = R.add(x, b)
            R.output(y)
        return y


def _bound(mod, **params):
    return relax.transform.BindParams("main", params)(mod)


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_register_tile_is_a_stack_array_that_fills_the_registers(name):
    """Over 1023 bytes, TVM moves the accumulator to a heap workspace and LLVM stores it
    after every FMA; under it, the tile should still use most of the SIMD registers."""
    target = tvm.target.Target(TARGETS[name])
    lanes = _vector_lanes(target)
    mi, nj = _register_tile(target, lanes, None, None)
    assert mi * nj * 4 < _STACK_ARRAY_LIMIT_BYTES, (mi, nj)
    accumulators = mi * nj // lanes
    assert 8 <= accumulators <= _simd_registers(target) - 4, (name, mi, nj, lanes)
    # a narrow static output uses one vector per row instead of padding to two
    assert _register_tile(target, lanes, 128, lanes)[1] == lanes
    # so does an odd number of vectors (Llama's FFN of 688 = 43 x 16): a two-vector tile
    # would pad every call and leave the weight unpacked
    assert _register_tile(target, lanes, 128, 43 * lanes)[1] == lanes
    assert _register_tile(target, lanes, 128, 42 * lanes)[1] == 2 * lanes


def test_dense_with_a_constant_weight_runs_on_packed_panels():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((K, N)).astype("float32")
    b = rng.standard_normal(N).astype("float32")
    mod = _bound(Dense, w=w, b=b)
    lowered = cpu_pipeline(HOST)(mod)
    names = [gv.name_hint for gv in lowered.get_global_vars()]
    assert any(n.endswith("_prepacked") for n in names), names
    # the packing ran at compile time: main calls no packing kernel and holds the packed weight
    assert "weight_prepack" not in lowered["main"].script(), lowered["main"].script()
    vm = relax.VirtualMachine(tvm.compile(mod, target=HOST, relax_pipeline=cpu_pipeline(HOST)), tvm.cpu())
    for seq in (1, 5, 77):
        x = rng.standard_normal((seq, K)).astype("float32")
        got = vm["main"](tvm.runtime.tensor(x)).numpy()
        np.testing.assert_allclose(got, x @ w + b, rtol=1e-5, atol=1e-5)


def test_a_dense_is_one_parallel_loop_over_panel_groups_and_row_chunks():
    """One fork-join per call: the threads split (group of weight panels, chunk of rows)
    items, groups outermost, so each thread keeps its panels in cache across the chunks and
    each chunk's rows across the group's panels; the zero-padded copy of a chunk's rows is
    made in its item. Row counts that end in a partial tile and a partial chunk stay exact."""
    from portable_pe.cpu_schedule.matmul import _row_chunk_tiles
    from portable_pe.cpu_schedule.tir_util import _num_cores
    lanes = _vector_lanes(HOST)
    rng = np.random.default_rng(4)
    w = rng.standard_normal((K, N)).astype("float32")
    b = rng.standard_normal(N).astype("float32")
    seq = 151  # not whole tiles: the rows are padded
    static = relax.transform.BindSymbolicVars({"seq": seq})(_bound(Dense, w=w, b=b))
    from portable_pe.cpu_schedule.pipeline import CPUDefaultSchedule, MarkConstantWeights, fusion_passes
    with HOST:
        scheduled = tvm.transform.Sequential([*fusion_passes(), MarkConstantWeights, CPUDefaultSchedule(HOST)])(static)
    (kernel,) = [f for f in scheduled.functions.values() if isinstance(f, tirx.PrimFunc) and _parallel_loops(f)]
    (parallel,) = _parallel_loops(kernel)
    mi, nj = _register_tile(HOST, lanes, seq, N)
    assert seq % mi, "the rows should end in a partial tile"
    chunk_tiles = _row_chunk_tiles(mi, seq, K)
    chunks = -(-(-(-seq // mi)) // chunk_tiles)
    assert chunks > 1, "the rows should span several chunks"
    groups = min(N // nj, _num_cores(HOST))
    assert int(parallel.extent) == groups * chunks, kernel.script()
    serial_outer = [s for s in _walk(kernel.body) if _node(s) == "For" and s.kind == tirx.ForKind.SERIAL
                    and any(x.same_as(parallel) for x in _walk(s.body))]
    assert not serial_outer, "no serial loop around the parallel one (a fork-join per chunk)"
    panels = [s for s in _walk(parallel.body) if _node(s) == "For" and s.kind == tirx.ForKind.SERIAL
              and _const_int(s.extent) == -(-(N // nj) // groups)]
    assert panels, "each item walks its group's panels"
    assert [blk for blk in _blocks_under(parallel.body) if blk.name_hint.endswith("_pad")], \
        "the rows' padded copy is made inside the work items"
    vm = relax.VirtualMachine(tvm.compile(_bound(Dense, w=w, b=b), target=HOST,
                                          relax_pipeline=cpu_pipeline(HOST)), tvm.cpu())
    for rows in (1, mi * chunk_tiles + 3, 200):
        x = rng.standard_normal((rows, K)).astype("float32")
        np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(x)).numpy(), x @ w + b, rtol=1e-5, atol=1e-5)


def test_a_weight_an_odd_number_of_vectors_wide_is_packed_and_exact():
    lanes = _vector_lanes(HOST)
    n = 3 * lanes
    rng = np.random.default_rng(1)
    w = rng.standard_normal((K, n)).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((tirx.Var("seq", "int64"), K), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.matmul(x, relax.const(w)))
        bb.emit_func_output(y)
    mod = bb.get()
    names = [gv.name_hint for gv in cpu_pipeline(HOST)(mod).get_global_vars()]
    assert any(name.endswith("_prepacked") for name in names), names
    vm = relax.VirtualMachine(tvm.compile(mod, target=HOST, relax_pipeline=cpu_pipeline(HOST)), tvm.cpu())
    for seq in (1, 13):
        xs = rng.standard_normal((seq, K)).astype("float32")
        np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(xs)).numpy(), xs @ w, rtol=1e-5, atol=1e-5)


def test_weights_are_packed_in_numpy_exactly_as_the_packing_kernel_does():
    """FoldWeightPacking (numpy, from the kernel's index map) against FoldConstant
    (the packing kernel compiled and run), on the same split-out packing call."""
    from portable_pe.cpu_schedule.pipeline import CPUDefaultSchedule, MarkConstantWeights, fusion_passes
    from portable_pe.cpu_schedule.weight_packing import FoldWeightPacking, SplitWeightPacking
    rng = np.random.default_rng(3)
    mod = _bound(Dense, w=rng.standard_normal((K, N)).astype("float32"), b=rng.standard_normal(N).astype("float32"))
    with HOST:
        split = tvm.transform.Sequential([*fusion_passes(), MarkConstantWeights, CPUDefaultSchedule(HOST),
                                          SplitWeightPacking])(mod)

    def constants(m):
        found = []
        relax.analysis.post_order_visit(m["main"], lambda e: found.append(e.value.numpy())
                                        if isinstance(e, tvm.ir.GenericConst) and e.value.numpy().ndim == 3 else None)
        return found

    call_tir = tvm.ir.Op.get("relax.call_tir")
    calls = []
    relax.analysis.post_order_visit(split["main"], lambda e: calls.append(e)
                                    if isinstance(e, relax.Call) and e.op.same_as(call_tir) else None)
    assert len(calls) == 2, "one packing call and the dense kernel"
    with HOST:
        by_numpy = constants(FoldWeightPacking(split))
        by_kernel = constants(relax.transform.FoldConstant()(split))
    assert len(by_numpy) == len(by_kernel) == 1
    assert by_numpy[0].shape == (N // _register_tile(HOST, _vector_lanes(HOST), None, N)[1], K,
                                 _register_tile(HOST, _vector_lanes(HOST), None, N)[1])
    np.testing.assert_array_equal(by_numpy[0], by_kernel[0])


@I.ir_module
class EvenElements:  # the even half of interleaved pairs: an innermost dim of 1
    @R.function
    def main(x: R.Tensor(("seq", 32, 2), "float32")):
        with R.dataflow():
            y = R.strided_slice(x, axes=[2], begin=[0], end=[1])
            R.output(y)
        return y


def test_inner_dims_narrower_than_a_vector_are_fused_and_vectorized():
    (func,) = [f for f in _scheduled(EvenElements).functions.values() if isinstance(f, tirx.PrimFunc)]
    vectorized = [s for s in _walk(func.body) if _node(s) == "For" and s.kind == tirx.ForKind.VECTORIZED]
    assert vectorized and all(int(s.extent) >= _vector_lanes(HOST) for s in vectorized), func.script()
    vm = relax.VirtualMachine(tvm.compile(EvenElements, target=HOST, relax_pipeline=cpu_pipeline(HOST)), tvm.cpu())
    x = np.random.default_rng(4).standard_normal((5, 32, 2)).astype("float32")
    np.testing.assert_array_equal(vm["main"](tvm.runtime.tensor(x)).numpy(), x[:, :, :1])


@I.ir_module
class LogReadFourTimes:
    @R.function
    def main(x: R.Tensor(("seq", 64), "float32")):
        with R.dataflow():
            d = R.log(R.add(R.abs(x), R.const(1.0, "float32")))
            y = R.add(R.multiply(d, d), R.where(R.less(d, R.const(0.5, "float32")), d, R.const(0.0, "float32")))
            R.output(y)
        return y


def test_an_expensive_value_read_several_times_is_computed_once_per_element():
    """Inlining, forward or in reverse, must not copy the log to each of its four reads
    (T5's bucket chain, inlined that way, became an 11 KB expression and a 13 s build)."""
    (func,) = [f for f in _scheduled(LogReadFourTimes).functions.values() if isinstance(f, tirx.PrimFunc)]
    assert func.script().count("T.log(") == 1, func.script()
    vm = relax.VirtualMachine(tvm.compile(LogReadFourTimes, target=HOST, relax_pipeline=cpu_pipeline(HOST)), tvm.cpu())
    x = np.random.default_rng(5).standard_normal((7, 64)).astype("float32")
    d = np.log(np.abs(x) + 1)
    np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(x)).numpy(), d * d + np.where(d < 0.5, d, 0), rtol=1e-6)


@I.ir_module
class SinTableAddedToEveryBatchItem:
    @R.function
    def main(x: R.Tensor(("batch", "seq", 64), "float32"), positions: R.Tensor(("seq",), "float32"),
             freq: R.Tensor((64,), "float32")):
        with R.dataflow():
            table = R.sin(R.multiply(R.expand_dims(positions, axis=[1]), freq))  # [seq, 64]
            y = R.add(x, table)  # [batch, seq, 64]: the table broadcast over the batch
            R.output(y)
        return y


def test_a_table_broadcast_over_the_batch_is_computed_once_not_per_batch_item():
    """A sinusoidal position table added to [B, T, D] tokens: inlined into the add, its
    sines were computed B times (sinusoidal bf16 B8 T128: 0.46 ms, 5% of the graph)."""
    (func,) = [f for f in _scheduled(SinTableAddedToEveryBatchItem).functions.values() if isinstance(f, tirx.PrimFunc)]
    stores = [s for s in _walk(func.body) if _node(s) == "BufferStore"]
    # the sine as fast_trig's polynomial (its range reduction rounds x·2/π), or T.sin unrewritten
    with_sin = [s for s in stores if "T.sin(" in str(s.value) or "T.nearbyint(" in str(s.value)]
    assert len(with_sin) == 1 and len(with_sin[0].indices) == 2, func.script()  # over [seq, 64] only
    vm = relax.VirtualMachine(tvm.compile(SinTableAddedToEveryBatchItem, target=HOST, relax_pipeline=cpu_pipeline(HOST)),
                              tvm.cpu())
    rng = np.random.default_rng(6)
    x = rng.standard_normal((3, 5, 64)).astype("float32")
    positions, freq = np.arange(5, dtype=np.float32), rng.random(64).astype("float32")
    got = vm["main"](*(tvm.runtime.tensor(a) for a in (x, positions, freq))).numpy()
    np.testing.assert_allclose(got, x + np.sin(positions[:, None] * freq), rtol=1e-6, atol=1e-6)


@I.ir_module
class LayerNorm:
    @R.function
    def main(x: R.Tensor(("rows", 256), "float32"), g: R.Tensor((256,), "float32"), b: R.Tensor((256,), "float32")):
        with R.dataflow():
            y = R.nn.layer_norm(x, g, b, axes=[-1], epsilon=1e-5)
            R.output(y)
        return y


def test_row_sums_run_as_vector_partial_sums():
    """A row sum as one chain of dependent adds ran a layer norm at 5-8 GB/s, and in one
    register of partial sums still 32 dependent adds per 256-wide row: both of its sums
    must run in ROW_SUM_ACCUMULATORS registers of `lanes` partial sums (an unrolled loop
    over a vectorized one), added into one register of `lanes`, and still be right."""
    from portable_pe.cpu_schedule.reduction import ROW_SUM_ACCUMULATORS
    rng = np.random.default_rng(6)
    g, b = rng.standard_normal(256).astype("float32"), rng.standard_normal(256).astype("float32")
    mod = _bound(LayerNorm, g=g, b=b)
    (func,) = [f for f in _scheduled(mod).functions.values() if isinstance(f, tirx.PrimFunc)]
    partial_sums = [s for s in _walk(func.body) if _node(s) == "SBlockRealize"
                    and s.block.name_hint.endswith("_rf_update")]
    lanes = _vector_lanes(HOST)

    def inner_loops(realize):
        *_, outer, inner = [s for s in _walk(func.body) if _node(s) == "For"
                            and any(x.same_as(realize) for x in _walk(s.body))]
        return (outer.kind, int(outer.extent)), (inner.kind, int(inner.extent))

    vector = (tirx.ForKind.VECTORIZED, lanes)
    # per sum: ROW_SUM_ACCUMULATORS registers over the row, then those into one register
    assert sorted((inner_loops(p) for p in partial_sums), key=str) == sorted(
        [((tirx.ForKind.UNROLLED, ROW_SUM_ACCUMULATORS), vector)] * 2
        + [((tirx.ForKind.SERIAL, ROW_SUM_ACCUMULATORS), vector)] * 2, key=str), func.script()
    vm = relax.VirtualMachine(tvm.compile(mod, target=HOST, relax_pipeline=cpu_pipeline(HOST)), tvm.cpu())
    for rows in (1, 37):
        x = (rng.standard_normal((rows, 256)) * 3 + 5).astype("float32")
        expected = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * g + b
        np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(x)).numpy(), expected, atol=2e-5, rtol=1e-5)


@I.ir_module
class RMSNormKeepdims:
    @R.function
    def main(x: R.Tensor((1, "rows", 256), "float32"), g: R.Tensor((256,), "float32")):
        with R.dataflow():
            ms = R.mean(R.power(x, R.const(2.0, "float32")), axis=[-1], keepdims=True)
            y = R.multiply(R.multiply(x, R.divide(R.const(1.0, "float32"), R.sqrt(R.add(ms, R.const(1e-6, "float32"))))), g)
            R.output(y)
        return y


def test_a_norm_with_keepdims_reduces_each_row_once():
    """RMSNorm as opset 18 exports it keeps a unit dim where the row runs; that unit loop
    is not a row loop: counted as one, the mean was recomputed for each of the 256
    elements of its row (6.6 of 32 ms of a Llama-style model at T=128)."""
    rng = np.random.default_rng(7)
    g = rng.standard_normal(256).astype("float32")
    mod = _bound(RMSNormKeepdims, g=g)
    (norm,) = [f for gv, f in _scheduled(mod).functions_items()
               if isinstance(f, tirx.PrimFunc) and "mean" in gv.name_hint]
    (row_loop,) = _parallel_loops(norm)
    assert "256" not in str(row_loop.extent), norm.script()  # rows, not rows x 256
    vm = relax.VirtualMachine(tvm.compile(mod, target=HOST, relax_pipeline=cpu_pipeline(HOST)), tvm.cpu())
    for rows in (1, 37):
        x = rng.standard_normal((1, rows, 256)).astype("float32")
        expected = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * g
        np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(x)).numpy(), expected, atol=2e-5, rtol=1e-5)


def _parallel_loops(func) -> list:
    return [s for s in _walk(func.body) if _node(s) == "For" and s.kind == tirx.ForKind.PARALLEL]


def _scheduled(mod, target=HOST):
    from portable_pe.cpu_schedule.pipeline import CPUDefaultSchedule, fusion_passes
    with target:
        return tvm.transform.Sequential([*fusion_passes(), CPUDefaultSchedule(target)])(mod)


def test_small_nests_skip_the_thread_pool():
    b = np.arange(256, dtype="float32")
    scheduled = _scheduled(_bound(AddBias, b=b))
    (kernel,) = [gv for gv, f in scheduled.functions_items() if isinstance(f, tirx.PrimFunc)]
    assert _parallel_loops(scheduled[kernel]), "the default schedule parallelizes the add"
    guarded = SerialWhenSmall()(scheduled)[kernel]
    body = guarded.body.block.body
    # seq is symbolic: the nest's size is only known when it runs, so both copies exist
    assert type(body).__name__ == "IfThenElse", guarded.script()
    assert not _parallel_loops(guarded.with_body(body.then_case)), "the small-work copy is serial"
    assert _parallel_loops(guarded.with_body(body.else_case)), "the other copy stays parallel"
    assert "seq" in str(body.condition), body.condition
    # a static nest is decided at compile time
    static = relax.transform.BindSymbolicVars({"seq": 8})(_bound(AddBias, b=b))
    small = SerialWhenSmall()(_scheduled(static))
    assert not any(_parallel_loops(f) for f in small.functions.values() if isinstance(f, tirx.PrimFunc))
    big = relax.transform.BindSymbolicVars({"seq": 2 * SERIAL_BELOW_ITERATIONS // 256})(_bound(AddBias, b=b))
    large = SerialWhenSmall()(_scheduled(big))
    assert any(_parallel_loops(f) for f in large.functions.values() if isinstance(f, tirx.PrimFunc))


def test_both_copies_of_a_guarded_nest_compute_the_same():
    rng = np.random.default_rng(1)
    b = rng.standard_normal(256).astype("float32")
    mod = _bound(AddBias, b=b)
    vm = relax.VirtualMachine(tvm.compile(mod, target=HOST, relax_pipeline=cpu_pipeline(HOST)), tvm.cpu())
    small_seq, large_seq = 3, 2 * SERIAL_BELOW_ITERATIONS // 256  # below and above the limit
    for seq in (small_seq, large_seq):
        x = rng.standard_normal((seq, 256)).astype("float32")
        np.testing.assert_array_equal(vm["main"](tvm.runtime.tensor(x)).numpy(), x + b)


def test_nests_with_private_root_intermediates_stay_single_and_pad_copies_are_guarded():
    """Duplicating a nest whose own intermediate is root-allocated (the accumulator tile)
    would make TVM allocate it full size on the heap: that nest keeps one parallel copy.
    The zero-padding copy before it shares its buffer with the matmul nest, so it is
    guarded (a runtime branch: the pad copy of a short sequence runs serially)."""
    from portable_pe.cpu_schedule.small_work import _buffers_touched
    rng = np.random.default_rng(2)
    mod = _bound(Dense, w=rng.standard_normal((K, N)).astype("float32"), b=rng.standard_normal(N).astype("float32"))
    (dense,) = [f for f in SerialWhenSmall()(_scheduled(mod)).functions.values() if isinstance(f, tirx.PrimFunc)]
    root = dense.body.block
    items = list(root.body.seq) if type(root.body).__name__ == "SeqStmt" else [root.body]
    accumulator = [b for b in root.alloc_buffers if b.name.startswith("matmul")]
    pad = [b for b in root.alloc_buffers if b.name.startswith("x_pad")]
    assert accumulator and pad, [b.name for b in root.alloc_buffers]
    kinds = {}
    for item in items:
        touched = _buffers_touched(item)
        for name, buffers in (("matmul", accumulator), ("pad", pad)):
            if any(t.same_as(b) for t in touched for b in buffers):
                kinds.setdefault(name, []).append(type(item).__name__)
    assert kinds["matmul"] == ["For"], kinds  # one parallel nest
    assert "IfThenElse" in kinds["pad"], kinds  # the pad copy: serial or parallel by work


@I.ir_module
class SiLUGate:
    @R.function
    def main(x: R.Tensor(("rows", 64), "float32"), up: R.Tensor(("rows", 64), "float32")):
        with R.dataflow():
            y = R.multiply(R.multiply(x, R.sigmoid(x)), up)
            R.output(y)
        return y


def test_sigmoid_is_a_vectorizable_polynomial():
    """Llama-style gates (SiLU): T.exp in a sigmoid is scalarized into libm calls on x86;
    fast math gives it TOPI's fast_exp, within float32 rounding of the real thing."""
    scheduled = _scheduled(SiLUGate)
    text = "\n".join(f.script() for f in scheduled.functions.values() if isinstance(f, tirx.PrimFunc))
    assert "T.exp(" not in text and "T.sigmoid(" not in text, text
    vm = relax.VirtualMachine(tvm.compile(SiLUGate, target=HOST, relax_pipeline=cpu_pipeline(HOST)), tvm.cpu())
    rng = np.random.default_rng(8)
    x = (rng.standard_normal((9, 64)) * 8).astype("float32")
    x[0, :4] = [-100.0, -88.5, 88.5, 100.0]  # past fast_exp's clamp: still 0 and 1
    up = rng.standard_normal((9, 64)).astype("float32")
    want = x / (1 + np.exp(-x.astype(np.float64))) * up
    got = vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(up)).numpy()
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)


def _rotate_half_module():
    """RoPE's rotate-half on [seq, heads, 64] (`main`), and the same then laid out as the Kᵀ
    attention takes (`kt`)."""
    bb = relax.BlockBuilder()
    for name, transposed in (("main", False), ("kt", True)):
        seq = tirx.Var("seq", "int64")
        x = relax.Var("x", relax.TensorType([seq, 4, 64], "float32"))
        cos, sin = (relax.Var(n, relax.TensorType([seq, 1, 64], "float32")) for n in ("cos", "sin"))
        with bb.function(name, [x, cos, sin]):
            with bb.dataflow():
                first = relax.op.strided_slice(x, axes=[2], begin=[0], end=[32])
                second = relax.op.strided_slice(x, axes=[2], begin=[32], end=[64])
                rotated = relax.op.concat([relax.op.negative(second), first], axis=2)
                y = relax.op.add(relax.op.multiply(x, cos), relax.op.multiply(rotated, sin))
                out = bb.emit_output(relax.op.permute_dims(y, [1, 2, 0]) if transposed else y)
            bb.emit_func_output(out)
    return bb.get()


def _rotate_half_reference(x, cos, sin):
    rotated = np.concatenate([-x[..., 32:], x[..., :32]], axis=-1)
    return x * cos + rotated * sin


def _kernel_named(mod, fragment, without="-"):
    (func,) = [f for gv, f in mod.functions_items()
               if isinstance(f, tirx.PrimFunc) and fragment in gv.name_hint and without not in gv.name_hint]
    return func


def test_a_concat_along_the_vector_dim_is_vectorized_in_parts():
    """The rotate-half's concat stores if_then_else(32 <= d, ...). Vectorized along d, that
    condition differs between lanes and TVM scalarizes the loop; partitioned at 32, each
    part is vectorized with the condition decided by its range."""
    from portable_pe.cpu_schedule.concat_lanes import boundaries
    func = _kernel_named(_scheduled(_rotate_half_module()), "concatenate", without="transpose")
    blocks = [b for b in _blocks_under(func.body) if any(boundaries(b).values())]
    assert len(blocks) == 2, func.script()  # the concat block, once per part
    vectorized = [s for s in _walk(func.body) if _node(s) == "For" and s.kind == tirx.ForKind.VECTORIZED]
    assert len(vectorized) >= 2 and all(int(s.extent) == _vector_lanes(HOST) for s in vectorized), func.script()
    vm = relax.VirtualMachine(tvm.compile(_rotate_half_module(), target=HOST, relax_pipeline=cpu_pipeline(HOST)), tvm.cpu())
    rng = np.random.default_rng(11)
    for seq in (5, 37):  # under one chunk of positions, and with a ragged last chunk
        x, cos, sin = (rng.standard_normal(shape).astype("float32") for shape in
                       ((seq, 4, 64), (seq, 1, 64), (seq, 1, 64)))
        args = [tvm.runtime.tensor(a) for a in (x, cos, sin)]
        want = _rotate_half_reference(x, cos, sin)
        np.testing.assert_allclose(vm["main"](*args).numpy(), want, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(vm["kt"](*args).numpy(), want.transpose(1, 2, 0), rtol=1e-6, atol=1e-6)


def test_a_transposed_copy_along_a_dynamic_dim_is_computed_in_tiles():
    """Kᵀ [heads, 64, seq] from [seq, heads, 64]: the values are computed 16 positions at a
    time, vectorized along the head dim (contiguous reads), into a tile that the copy reads
    back transposed; the stored (dynamic) dim no longer walks the reads' rows."""
    from portable_pe.cpu_schedule.transpose_tiles import _TILE
    func = _kernel_named(_scheduled(_rotate_half_module()), "transpose")
    script = func.script()
    assert "_global" in script, script  # the tile the values go through
    vectorized = [s for s in _walk(func.body) if _node(s) == "For" and s.kind == tirx.ForKind.VECTORIZED]
    assert vectorized and all(int(s.extent) == _vector_lanes(HOST) for s in vectorized), script
    serial = [s for s in _walk(func.body) if _node(s) == "For" and s.kind == tirx.ForKind.SERIAL
              and _const_int(s.extent) == _TILE]
    assert serial, script  # the tile's positions


@pytest.mark.skipif("avx2" not in cpu_flags(), reason="runs an AVX2 build; this CPU has no AVX2")
def test_whole_kt_tiles_are_transposed_in_registers_on_x86():
    """With 8-float vectors, the tile's copy runs transpose_8x8's kernel (8 x 8 blocks in
    registers) when all 16 positions are real, and the scalar copy for the last, partial
    tile: Kᵀ equals numpy's with no partial tile, with one, and under one tile."""
    from portable_pe.cpu_schedule.transpose_8x8 import KERNEL
    target = tvm.target.Target({**TARGETS["avx2"], "num-cores": 2})
    script = _kernel_named(_scheduled(_rotate_half_module(), target), "transpose").script()
    assert script.count(f'"{KERNEL}16x64"') == 1, script
    assert "T_transpose_intermediate_global[" in script.split(KERNEL)[-1], script  # the scalar copy, kept for the tail
    vm = relax.VirtualMachine(tvm.compile(_rotate_half_module(), target=target, relax_pipeline=cpu_pipeline(target)),
                              tvm.cpu())
    rng = np.random.default_rng(3)
    for seq in (48, 37, 5):
        x, cos, sin = (rng.standard_normal(shape).astype("float32") for shape in
                       ((seq, 4, 64), (seq, 1, 64), (seq, 1, 64)))
        got = vm["kt"](*[tvm.runtime.tensor(a) for a in (x, cos, sin)]).numpy()
        np.testing.assert_allclose(got, _rotate_half_reference(x, cos, sin).transpose(1, 2, 0), rtol=1e-6, atol=1e-6)


@I.ir_module
class HeadsFirst:
    @R.function
    def main(x: R.Tensor(("seq", 4, 16), "float32")):
        with R.dataflow():
            y = R.permute_dims(x, [1, 0, 2])
            R.output(y)
        return y


def test_a_dynamic_dim_inside_the_parallel_loop_is_taken_in_chunks():
    """[4, seq, 16]: a work item per (head, position) would be one vector and divide by seq
    to find its indices; the positions come in chunks, so each item has 256 elements."""
    from portable_pe.cpu_schedule.loops import _MIN_ITEM_ELEMENTS
    func = _kernel_named(_scheduled(HeadsFirst), "transpose")
    (parallel,) = _parallel_loops(func)
    inside = [s for s in _walk(parallel.body) if _node(s) == "For"]
    elements = 1
    for loop in inside:
        elements *= _const_int(loop.extent)
    assert elements == _MIN_ITEM_ELEMENTS, func.script()
    vm = relax.VirtualMachine(tvm.compile(HeadsFirst, target=HOST, relax_pipeline=cpu_pipeline(HOST)), tvm.cpu())
    for seq in (3, 40):
        x = np.random.default_rng(seq).standard_normal((seq, 4, 16)).astype("float32")
        np.testing.assert_array_equal(vm["main"](tvm.runtime.tensor(x)).numpy(), x.transpose(1, 0, 2))


def _split_heads_module():
    """[seq, 64] (+ bias) read as 4 heads of 16: [4, seq, 16], the q/k/v head split."""
    seq = tirx.Var("seq", "int64")
    x = relax.Var("x", relax.TensorType([seq, 64], "float32"))
    bias = relax.const(np.arange(64, dtype="float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            heads = bb.emit(relax.op.reshape(relax.op.add(x, bias), [seq, 4, 16]))
            out = bb.emit_output(relax.op.permute_dims(heads, [1, 0, 2]))
        bb.emit_func_output(out)
    return bb.get()


def test_a_head_split_reads_each_positions_heads_together():
    """Heads outside positions walked the input one head per row; positions outside read a
    row's heads one after another: the heads' loop runs inside the positions' loop."""
    module = _split_heads_module()
    func = _kernel_named(_scheduled(module), "transpose")
    (realize,) = [s for s in _walk(func.body) if _node(s) == "SBlockRealize" and s.block.name_hint == "T_transpose"]
    heads, positions = realize.iter_values[0], realize.iter_values[1]
    # one parallel loop over (position, head) items, the head fastest: item % 4 is the head
    assert _node(heads) == "FloorMod" and _const_int(heads.b) == 4, func.script()
    assert _node(positions) == "FloorDiv" and _const_int(positions.b) == 4, func.script()
    vm = relax.VirtualMachine(tvm.compile(module, target=HOST, relax_pipeline=cpu_pipeline(HOST)), tvm.cpu())
    for seq in (3, 40):
        x = np.random.default_rng(seq).standard_normal((seq, 64)).astype("float32")
        want = (x + np.arange(64, dtype="float32")).reshape(seq, 4, 16).transpose(1, 0, 2)
        np.testing.assert_array_equal(vm["main"](tvm.runtime.tensor(x)).numpy(), want)
