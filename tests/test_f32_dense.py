"""The float32 dense on AVX-512: the 12 x 32 LLVM IR micro-kernel (f32_tiles), tensorized
by f32_dense's schedule. The numeric checks compare with numpy in float64 at rtol 1e-5,
element by element, as test_cpu_schedule's do."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, tirx
from tvm.sym import Analyzer

from portable_pe.cpu_schedule import cpu_pipeline
from portable_pe.cpu_schedule.f32_tiles import F32_TILE_ROWS
from portable_pe.cpu_schedule.tir_util import _blocks_under, _expr_vars, _node, _num_cores, _walk, is_extern_call
from portable_pe.host_cpu import cpu_flags
from portable_pe.cpu_schedule.work_claims import cpu_tir_pipeline

AVX512 = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2})
runs_here = pytest.mark.skipif("avx512f" not in cpu_flags(), reason="this CPU has no avx512f")


def _dense(k: int, n: int, epilogue: str, rng):
    """y = epilogue(x @ W + b) over a dynamic row count, W and b constants."""
    w = (rng.standard_normal((k, n)) * 0.1).astype("float32")
    b = rng.standard_normal(n).astype("float32")
    bb = relax.BlockBuilder()
    rows = tirx.Var("rows", "int64")
    x = relax.Var("x", relax.TensorType([rows, k], "float32"))
    r = relax.Var("r", relax.TensorType([rows, n], "float32"))
    with bb.function("main", [x, r]):
        with bb.dataflow():
            y = relax.op.add(relax.op.matmul(x, relax.const(w)), relax.const(b))
            if epilogue == "gelu":
                y = relax.op.nn.gelu(y)
            elif epilogue == "residual":
                y = relax.op.add(y, r)
            out = bb.emit_output(bb.emit(y))
        bb.emit_func_output(out)
    return bb.get(), w, b


def _reference(x, w, b, r, epilogue):
    from scipy.special import erf
    y = x.astype("float64") @ w.astype("float64") + b
    if epilogue == "gelu":
        return 0.5 * y * (1 + erf(y / np.sqrt(2)))
    return y + r if epilogue == "residual" else y


def _scheduled_kernel(mod):
    from portable_pe.cpu_schedule.pipeline import CPUDefaultSchedule, MarkConstantWeights, fusion_passes
    with AVX512:
        scheduled = tvm.transform.Sequential([*fusion_passes(), MarkConstantWeights, CPUDefaultSchedule(AVX512)])(mod)
    (kernel,) = [f for gv, f in scheduled.functions_items() if isinstance(f, tirx.PrimFunc) and "matmul" in gv.name_hint]
    return kernel


def _kernel_calls(func):
    return [s.value for s in _walk(func.body) if is_extern_call(s, ("portable_pe_f32_",))]


def test_the_dense_is_row_tiles_by_core_groups_around_the_micro_kernel():
    """One parallel loop over (row tile, column group): the groups inside the row tile so
    a thread's contiguous share of items is whole rows; each tile one micro-kernel call,
    reading its rows of x where they lie (no padded copy of them: rows_in_place) and told
    how many rows x has from the tile's first on."""
    rng = np.random.default_rng(0)
    mod, _, _ = _dense(256, 128, "gelu", rng)
    kernel = _scheduled_kernel(mod)
    script = kernel.script()
    assert "portable_pe_f32_12x32" in script, script
    parallel = [s for s in _walk(kernel.body) if _node(s) == "For" and s.kind == tirx.ForKind.PARALLEL]
    assert len(parallel) == 1, script
    groups = min(128 // 32, _num_cores(AVX512))
    extent = parallel[0].extent
    (rows,) = _expr_vars(extent)
    for count in (1, F32_TILE_ROWS, 151):
        bound = Analyzer()
        bound.bind(rows, count)
        assert int(bound.simplify(extent)) == -(-count // F32_TILE_ROWS) * groups, (count, extent)
    row_copies = [blk for blk in _blocks_under(kernel.body) if blk.name_hint == "x_pad"]
    assert not row_copies, script
    (call,) = _kernel_calls(kernel)
    (tile,) = [blk for blk in _blocks_under(kernel.body) if blk.name_hint.endswith("_o")]
    (a_rows,) = [mb for mb in tile.match_buffers if mb.buffer.name == "A"]
    assert a_rows.source.source.name == "x", script
    # rows left at 151 rows, from the 13th tile (rows 144-150) on
    (tile_var,) = [v for v in _expr_vars(call.args[-1]) if not v.same_as(rows)]
    bound = Analyzer()
    bound.bind(rows, 151)
    bound.bind(tile_var, 12)
    assert int(bound.simplify(call.args[-1])) == 7, call.args[-1]


@pytest.mark.parametrize("batched", [False, True])
def test_the_rows_are_read_in_place_after_lowering(batched):
    """After TVM's lowering no buffer of padded rows is left, with and without batch dims
    in front (an encoder's input is [batch, seq, K]; the tiles then run along seq)."""
    from tvm import s_tir
    k = 1024
    w = (np.random.default_rng(0).standard_normal((k, 64)) * 0.1).astype("float32")
    dims = [tirx.Var("batch", "int64"), tirx.Var("seq", "int64")] if batched else [tirx.Var("rows", "int64")]
    with AVX512:
        lowered = tvm.transform.Sequential([
            s_tir.transform.LowerInitBlock(), s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
            s_tir.transform.ConvertBlocksToOpaque(), s_tir.transform.CompactBufferAllocation()])(
            tvm.IRModule({"main": _legalized_matmul_kernel(dims, w)}))["main"]
    allocated = [buf.name for blk in _blocks_under(lowered.body) for buf in blk.alloc_buffers]
    assert "x_pad" not in allocated and any(name.endswith("_pad") for name in allocated), lowered.script()
    assert len(_kernel_calls(lowered)) == 1, lowered.script()


def _legalized_matmul_kernel(dims, w):
    """x [*dims, K] @ w, legalized as TVM does (the fp32 fusion passes would flatten
    [batch, seq] into rows) and scheduled."""
    from portable_pe.cpu_schedule.pipeline import CPUDefaultSchedule, MarkConstantWeights
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([*dims, w.shape[0]], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.matmul(x, relax.const(w))))
        bb.emit_func_output(out)
    with AVX512:
        legalized = tvm.transform.Sequential([
            relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(), relax.transform.FoldConstant(),
            relax.transform.FuseOps(), relax.transform.FuseTIR(), MarkConstantWeights,
            CPUDefaultSchedule(AVX512)])(bb.get())
    (kernel,) = [f for gv, f in legalized.functions_items() if isinstance(f, tirx.PrimFunc) and "matmul" in gv.name_hint]
    return kernel


@runs_here
def test_batched_rows_read_in_place_match_numpy_at_ragged_lengths():
    """[batch, seq, K] with seq not a multiple of the 12-row tile: each batch's last tile
    reads only its own rows (the ones past seq repeat its last row), never the next
    batch's or past the end of x."""
    from portable_pe.backends.llvm import tvm_target
    from portable_pe.backends.targets import load_target
    rng = np.random.default_rng(7)
    k, n = 96, 64
    w = (rng.standard_normal((k, n)) * 0.1).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([tirx.Var("batch", "int64"), tirx.Var("seq", "int64"), k], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.matmul(x, relax.const(w))))
        bb.emit_func_output(out)
    target = tvm_target(load_target("llvm"))
    legalize = tvm.transform.Sequential([relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
                                         relax.transform.FoldConstant(), relax.transform.FuseOps(),
                                         relax.transform.FuseTIR()])
    mod = legalize(bb.get())
    assert "portable_pe_f32_12x32" in cpu_pipeline(target)(mod).script(show_meta=False)
    vm = relax.VirtualMachine(tvm.compile(mod, target=target, relax_pipeline=cpu_pipeline(target),
                                          tir_pipeline=cpu_tir_pipeline(target)), tvm.cpu())
    for batch, seq in ((3, 13), (2, 1), (1, 11), (2, 24)):
        xs = rng.standard_normal((batch, seq, k)).astype("float32")
        got = vm["main"](tvm.runtime.tensor(xs)).numpy()
        np.testing.assert_allclose(got, xs.astype("float64") @ w.astype("float64"), rtol=1e-5,
                                   atol=1e-5 * np.sqrt(k), err_msg=f"batch={batch} seq={seq}")


@runs_here
@pytest.mark.parametrize("k,n,epilogue", [(256, 128, "gelu"), (96, 64, "residual"), (1000, 32, "bias"), (64, 96, "bias")])
def test_the_micro_kernel_dense_matches_numpy_at_ragged_row_counts(k, n, epilogue):
    """(64, 96): three column tiles, which two cores cannot split in equal groups."""
    rng = np.random.default_rng(k)
    mod, w, b = _dense(k, n, epilogue, rng)
    from portable_pe.backends.llvm import tvm_target
    from portable_pe.backends.targets import load_target
    target = tvm_target(load_target("llvm"))
    lowered = cpu_pipeline(target)(mod)
    assert any("portable_pe_f32_12x32" in f.script() for f in lowered.functions.values()
               if isinstance(f, tirx.PrimFunc)), "the dense should run on the micro-kernel"
    vm = relax.VirtualMachine(tvm.compile(mod, target=target, relax_pipeline=cpu_pipeline(target),
                                          tir_pipeline=cpu_tir_pipeline(target)), tvm.cpu())
    for rows in (1, F32_TILE_ROWS - 1, F32_TILE_ROWS, F32_TILE_ROWS + 1, 151):
        x = rng.standard_normal((rows, k)).astype("float32")
        r = rng.standard_normal((rows, n)).astype("float32")
        got = vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(r)).numpy()
        np.testing.assert_allclose(got, _reference(x, w, b, r, epilogue), rtol=1e-5, atol=1e-5 * np.sqrt(k),
                                   err_msg=f"rows={rows}")


def test_a_dense_whose_columns_are_not_whole_tiles_keeps_the_register_tiled_schedule():
    """N = 48 (three vectors): not a multiple of the 32 columns the micro-kernel computes."""
    rng = np.random.default_rng(3)
    mod, _, _ = _dense(64, 48, "bias", rng)
    kernel = _scheduled_kernel(mod)
    assert "portable_pe_f32_12x32" not in kernel.script()
    assert any(_node(s) == "For" and s.kind == tirx.ForKind.VECTORIZED for s in _walk(kernel.body))


def test_a_small_static_dense_on_the_micro_kernel_stays_parallel():
    """SerialWhenSmall counts loop iterations; the micro-kernel call is one statement doing
    12 x 32 x K multiply-adds, which its block's work annotation tells it. Without it, the
    B = 1 T = 128 attention output projection (128 x 256 x 256) ran serially, 1.9x slower."""
    from portable_pe.cpu_schedule.small_work import SerialWhenSmall
    rng = np.random.default_rng(5)
    mod, _, _ = _dense(256, 256, "residual", rng)
    static = relax.transform.BindSymbolicVars({"rows": 128})(mod)
    kernel = _scheduled_kernel(static)
    assert "portable_pe_f32_12x32" in kernel.script()
    guarded = SerialWhenSmall()(tvm.IRModule({"main": kernel}))["main"]
    assert [s for s in _walk(guarded.body) if _node(s) == "For" and s.kind == tirx.ForKind.PARALLEL], guarded.script()


@pytest.mark.parametrize("k,n,rows_first", [(256, 1024, True), (1024, 1024, False)])
def test_items_are_row_major_unless_the_weight_would_crowd_l2(k, n, rows_first):
    """Row tiles outermost for a 1 MiB weight (each core then reads every panel per tile);
    column groups outermost for a 4 MiB one (each core holds only its group's panels).
    TVM names a fused loop after its loops in order: the row loop is i0, the column one i1."""
    mod, _, _ = _dense(k, n, "bias", np.random.default_rng(6))
    kernel = _scheduled_kernel(mod)
    (parallel,) = [s for s in _walk(kernel.body) if _node(s) == "For" and s.kind == tirx.ForKind.PARALLEL]
    assert parallel.loop_var.name.startswith("i0" if rows_first else "i1"), parallel.loop_var.name


def test_whole_tiles_keep_their_row_pointers_in_registers():
    """The K loop of a whole 12-row tile addresses its rows from one pointer (lda is a
    constant once the kernel is inlined): no stack reload in the loop. With every tile's
    rows selected for the ragged last one, twelve row pointers outnumbered x86's free
    general registers and nine were reloaded at every k step (23 loads per 24 FMAs instead
    of 14), and the dense ran 5% slower in the encoders. Compiled for AVX-512, not run."""
    import re
    mod, _, _ = _dense(256, 128, "bias", np.random.default_rng(7))
    ex = tvm.compile(mod, target=AVX512, relax_pipeline=cpu_pipeline(AVX512), tir_pipeline=cpu_tir_pipeline(AVX512))
    (llvm,) = [m for m in ex.mod.imports if m.kind == "llvm"]
    asm = llvm.inspect_source("asm")
    blocks = re.split(r"\n(?=\.LBB\w+:)", asm)
    k_loops = [b for b in blocks if b.count("vfmadd231ps") == 2 * F32_TILE_ROWS and b.count("vbroadcastss") == F32_TILE_ROWS]
    assert len(k_loops) == 2, f"expected the whole-tile and the last-tile K loops, found {len(k_loops)}"
    whole = [b for b in k_loops if "%rsp" not in b]
    assert len(whole) == 1, "every K loop reloads from the stack:\n" + "\n\n".join(k_loops)
    # one row address: the twelve broadcasts read one (base, index) at displacements lda * 4 apart
    bases = set(re.findall(r"vbroadcastss\s+-?\w*\(([^)]*)\)", whole[0]))
    assert len(bases) == 1, whole[0]
