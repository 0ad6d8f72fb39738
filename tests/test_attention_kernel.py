"""The fused CPU attention kernel: its exp, the Relax rewrite, and results against numpy.

The numeric checks here stay element-wise literals, not conftest.assert_parity: each holds
one kernel, element by element, to a float64 numpy oracle at rtol 1e-5 (the exp at 4e-7
relative over its whole range), where the harness bounds only the largest error against
1e-4 of the largest value: its rows would let a kernel that is wrong on small values pass.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, tirx
from tvm.script import tirx as T

from portable_pe.cpu_schedule import cpu_pipeline, fusion_passes
from portable_pe.cpu_schedule.attention import _fast_exp
from portable_pe.host_cpu import cpu_flags
from portable_pe.cpu_schedule.work_claims import cpu_tir_pipeline

HOST = tvm.target.Target({"kind": "llvm", "num-cores": 2})
AVX512 = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2})
H, D, SCALE = 2, 16, 0.25


def _reference(q, k, v, bias=None, axis=-1):
    s = q.astype(np.float64) @ k.astype(np.float64).transpose(0, 1, 3, 2) * SCALE
    if bias is not None:
        s = s + bias
    e = np.exp(s - s.max(axis=axis, keepdims=True))
    return (e / e.sum(axis=axis, keepdims=True)) @ v.astype(np.float64)


def _attention(bias: tuple | None = None, *, bias_first: bool = False, axis: int = -1, head_dim: int = D):
    """softmax(Q·Kᵀ·SCALE [+ bias], axis) @ V over q, k, v [b, H, t, D] (b, t symbolic).

    ``bias`` names the bias dims ("b", "t" or a number), e.g. (H, "t", "t") for a T5 or
    ALiBi table; ``bias_first`` adds it on the left."""
    dims = {"b": tirx.Var("b", "int64"), "t": tirx.Var("t", "int64")}
    q, k, v = (relax.Var(n, relax.TensorType([dims["b"], H, dims["t"], head_dim], "float32")) for n in "qkv")
    params = [q, k, v]
    if bias is not None:
        params.append(relax.Var("bias", relax.TensorType([dims.get(d, d) for d in bias], "float32")))
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            s = bb.emit(relax.op.multiply(relax.op.matmul(q, relax.op.permute_dims(k, [0, 1, 3, 2])),
                                          relax.const(SCALE, "float32")))
            if bias is not None:
                s = bb.emit(relax.op.add(params[3], s) if bias_first else relax.op.add(s, params[3]))
            y = bb.emit_output(relax.op.matmul(relax.op.nn.softmax(s, axis=axis), v))
        bb.emit_func_output(y)
    return bb.get()


def _inputs(rng, b: int, t: int, bias_dims: tuple | None, head_dim: int = D):
    """(q, k, v, bias) of [b, H, t, head_dim], the bias of ``bias_dims`` (as _attention
    names them; None: no bias), drawn in that order."""
    q, k, v = (rng.standard_normal((b, H, t, head_dim), dtype=np.float32) for _ in range(3))
    bias = None
    if bias_dims is not None:
        bias = rng.standard_normal([{"b": b, "t": t}.get(d, d) for d in bias_dims], dtype=np.float32)
    return q, k, v, bias


def _run(vm, *args):
    """The compiled module's output for these numpy inputs (None ones left out)."""
    return vm["main"](*[tvm.runtime.tensor(a, tvm.cpu()) for a in args if a is not None]).numpy()


def _masked_causally(b: int, t: int):
    """A [b, 1, t, t] causal -inf mask whose row t // 2 of the first batch is fully masked."""
    mask = np.where(np.tril(np.ones((t, t), bool)), 0, -np.inf).astype(np.float32)[None, None].repeat(b, 0)
    mask[0, 0, t // 2] = -np.inf  # a fully masked row: NaN from softmax, then 0
    return mask


# bias dims of the fused forms: none, a T5 / ALiBi table shared by the batch, a
# per-batch mask shared by the heads (added on the left), one table for every batch and head
BIASES = {"no-bias": (None, False), "head-bias": ((H, "t", "t"), False),
          "batch-bias": (("b", 1, "t", "t"), True), "position-bias": (("t", "t"), False)}


def _kernel_names(mod):
    with HOST:
        fused = tvm.transform.Sequential(fusion_passes())(mod)
    return [gv.name_hint for gv, f in fused.functions_items() if isinstance(f, tirx.PrimFunc)]


def test_fast_exp_matches_numpy_sends_minus_infinity_to_zero_and_saturates():
    n = 4096

    @T.prim_func
    def fexp(x: T.Buffer((n,), "float32"), y: T.Buffer((n,), "float32")):
        T.func_attr({"global_symbol": "fexp", "tirx.noalias": True})
        for i0 in range(n // 16):
            for i1 in T.vectorized(16):
                y[i0 * 16 + i1] = _fast_exp(x[i0 * 16 + i1])

    lib = tvm.compile(tvm.IRModule({"fexp": fexp}), target=HOST)
    x = np.concatenate([np.linspace(-87, 88.3, n - 4, dtype=np.float32), np.float32([-np.inf, -200.0, 89.0, np.inf])])
    y = tvm.runtime.empty((n,), "float32", tvm.cpu())
    lib["fexp"](tvm.runtime.tensor(x, tvm.cpu()), y)
    got, want = y.numpy()[:-4], np.exp(x[:-4].astype(np.float64))
    assert np.max(np.abs(got - want) / want) < 4e-7
    assert y.numpy()[-4] == 0.0 and y.numpy()[-3] == 0.0
    assert np.all(np.isfinite(y.numpy()[-2:])) and np.all(y.numpy()[-2:] > 1e38)  # saturates, no inf


@pytest.mark.parametrize("form", list(BIASES))
def test_attention_becomes_one_kernel_and_matches_numpy(form):
    bias_dims, bias_first = BIASES[form]
    module = _attention(bias_dims, bias_first=bias_first)
    names = _kernel_names(module)
    assert "fused_attention" in names
    assert not [n for n in names if "softmax" in n or "matmul" in n], names
    vm = relax.VirtualMachine(tvm.compile(module, target=HOST, relax_pipeline=cpu_pipeline(HOST),
                                          tir_pipeline=cpu_tir_pipeline(HOST)), tvm.cpu())
    rng = np.random.default_rng(0)
    for b, t in [(1, 1), (2, 5), (1, 77), (2, 300)]:  # 77 and 300: ragged row blocks and column tails
        q, k, v, bias = _inputs(rng, b, t, bias_dims)
        np.testing.assert_allclose(_run(vm, q, k, v, bias), _reference(q, k, v, bias), rtol=1e-5, atol=2e-6)


@pytest.mark.skipif("avx512f" not in cpu_flags(), reason="this CPU has no avx512f")
@pytest.mark.parametrize("form", ["no-bias", "head-bias"])
def test_wide_tiles_on_avx512_match_numpy_on_both_sides_of_their_width(form):
    """Head dim 64 on AVX-512: scores 2 x 32 columns and the output 2 x 32 at a time (the
    kernel's ``wide``), down to the narrower paths: lengths under 32, between 32 and 64
    (the one-block path), exact (64, 128), and over 64 with a last tile ending at S that
    overlaps the one before: 16 columns (77, 130: 13 and 2 left), 32 (90: 26 left) and 64
    (110: 46 left)."""
    bias_dims, bias_first = BIASES[form]
    module = _attention(bias_dims, bias_first=bias_first, head_dim=64)
    with AVX512:
        fused = tvm.transform.Sequential(fusion_passes())(module)
    kernel = next(f for gv, f in fused.functions_items() if gv.name_hint.startswith("fused_attention"))
    assert "acc2" in kernel.script() and "out2" in kernel.script()
    vm = relax.VirtualMachine(tvm.compile(module, target=AVX512, relax_pipeline=cpu_pipeline(AVX512),
                                          tir_pipeline=cpu_tir_pipeline(AVX512)), tvm.cpu())
    rng = np.random.default_rng(3)
    for b, t in [(1, 1), (2, 20), (1, 40), (2, 64), (1, 77), (1, 90), (1, 110), (1, 128), (2, 130)]:
        q, k, v, bias = _inputs(rng, b, t, bias_dims, head_dim=64)
        np.testing.assert_allclose(_run(vm, q, k, v, bias), _reference(q, k, v, bias), rtol=1e-5, atol=2e-6,
                                   err_msg=f"b={b} t={t}")


def test_softmax_over_another_axis_is_left_alone():
    over_queries = _attention(axis=2)  # not attention as the kernel computes it
    assert "fused_attention" not in _kernel_names(over_queries)
    vm = relax.VirtualMachine(tvm.compile(over_queries, target=HOST, relax_pipeline=cpu_pipeline(HOST),
                                          tir_pipeline=cpu_tir_pipeline(HOST)), tvm.cpu())
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, H, 9, D), dtype=np.float32) for _ in range(3))
    got = vm["main"](*[tvm.runtime.tensor(a, tvm.cpu()) for a in (q, k, v)]).numpy()
    np.testing.assert_allclose(got, _reference(q, k, v, axis=2), rtol=1e-5, atol=2e-6)


def test_the_shipped_encoder_runs_one_attention_kernel_per_layer():
    from portable_pe.compile.pipeline import prepare
    from portable_pe.tune.database import fused_prim_funcs
    state = prepare("t5_bias", target="llvm")  # a bias shared by the layers
    names = list(fused_prim_funcs(state.relax, state.tvm_target))
    assert "fused_attention" in names
    assert not [n for n in names if "softmax" in n], names
    text = state.relax.script()
    with state.tvm_target:
        fused = tvm.transform.Sequential(fusion_passes())(state.relax)
    assert fused.script().count("fused_attention") - text.count("fused_attention") >= state.spec.model.n_layers


def _sdpa_decomposition():
    """torch's SDPA as the opset-18 exporter writes it: q and kᵀ each scaled by
    sqrt(SCALE), a float mask added, where(isnan(p), 0, p) after the softmax."""
    b, t = tirx.Var("b", "int64"), tirx.Var("t", "int64")
    q, k, v = (relax.Var(n, relax.TensorType([b, H, t, D], "float32")) for n in "qkv")
    mask = relax.Var("mask", relax.TensorType([b, 1, t, t], "float32"))
    root = relax.const(np.sqrt(SCALE), "float32")
    bb = relax.BlockBuilder()
    with bb.function("main", [q, k, v, mask]):
        with bb.dataflow():
            kt = bb.emit(relax.op.multiply(relax.op.permute_dims(k, [0, 1, 3, 2]), root))
            s = bb.emit(relax.op.add(relax.op.matmul(bb.emit(relax.op.multiply(q, root)), kt), mask))
            p = bb.emit(relax.op.nn.softmax(s))
            p = bb.emit(relax.op.where(relax.op.isnan(p), relax.const(0.0, "float32"), p))
            y = bb.emit_output(relax.op.matmul(p, v))
        bb.emit_func_output(y)
    return bb.get()


def test_torch_sdpa_decomposition_is_one_kernel_and_zeroes_fully_masked_rows():
    module = _sdpa_decomposition()
    names = _kernel_names(module)
    assert "fused_attention" in names and not [n for n in names if "softmax" in n or "matmul" in n], names
    vm = relax.VirtualMachine(tvm.compile(module, target=HOST, relax_pipeline=cpu_pipeline(HOST),
                                          tir_pipeline=cpu_tir_pipeline(HOST)), tvm.cpu())
    rng = np.random.default_rng(2)
    for b, t in [(1, 1), (2, 9), (1, 77)]:
        q, k, v, _ = _inputs(rng, b, t, None)
        mask = _masked_causally(b, t)
        got = _run(vm, q, k, v, mask)
        with np.errstate(invalid="ignore"):
            want = np.nan_to_num(_reference(q, k, v, mask), nan=0.0)
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)


def test_the_row_reductions_refuse_a_lane_count_they_cannot_halve():
    """softmax_rows halves the lane vector down to a pair: 12 lanes would drop 4 of them."""
    from portable_pe.cpu_schedule.attention_tiles import attention_kernel
    with pytest.raises(Exception, match="12 lanes; the row reductions take a power of two"):
        attention_kernel(heads=1, qk_dim=16, v_dim=16, scale=1.0, mi=2, nj=12, ec=12)
