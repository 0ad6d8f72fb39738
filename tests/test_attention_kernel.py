"""The fused CPU attention kernel: its exp, the Relax rewrite, and results against numpy."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, tirx
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

from portable_pe.cpu_schedule import cpu_pipeline, fusion_passes
from portable_pe.cpu_schedule.attention import _fast_exp

HOST = tvm.target.Target({"kind": "llvm", "num-cores": 2})
H, D, SCALE = 2, 16, 0.25


def _reference(q, k, v, bias=None, axis=-1):
    s = q.astype(np.float64) @ k.astype(np.float64).transpose(0, 1, 3, 2) * SCALE
    if bias is not None:
        s = s + bias
    e = np.exp(s - s.max(axis=axis, keepdims=True))
    return (e / e.sum(axis=axis, keepdims=True)) @ v.astype(np.float64)


@I.ir_module
class NoBias:
    @R.function
    def main(q: R.Tensor(("b", H, "t", D), "float32"), k: R.Tensor(("b", H, "t", D), "float32"),
             v: R.Tensor(("b", H, "t", D), "float32")):
        with R.dataflow():
            s = R.multiply(R.matmul(q, R.permute_dims(k, [0, 1, 3, 2])), R.const(SCALE, "float32"))
            y = R.matmul(R.nn.softmax(s, axis=-1), v)
            R.output(y)
        return y


@I.ir_module
class HeadBias:  # a T5 / ALiBi style bias: one [H, T, T] table shared by the batch
    @R.function
    def main(q: R.Tensor(("b", H, "t", D), "float32"), k: R.Tensor(("b", H, "t", D), "float32"),
             v: R.Tensor(("b", H, "t", D), "float32"), bias: R.Tensor((H, "t", "t"), "float32")):
        with R.dataflow():
            s = R.multiply(R.matmul(q, R.permute_dims(k, [0, 1, 3, 2])), R.const(SCALE, "float32"))
            y = R.matmul(R.nn.softmax(R.add(s, bias), axis=-1), v)
            R.output(y)
        return y


@I.ir_module
class BatchBias:  # a per-batch mask-like bias shared by the heads, added on the left
    @R.function
    def main(q: R.Tensor(("b", H, "t", D), "float32"), k: R.Tensor(("b", H, "t", D), "float32"),
             v: R.Tensor(("b", H, "t", D), "float32"), bias: R.Tensor(("b", 1, "t", "t"), "float32")):
        with R.dataflow():
            s = R.multiply(R.matmul(q, R.permute_dims(k, [0, 1, 3, 2])), R.const(SCALE, "float32"))
            y = R.matmul(R.nn.softmax(R.add(bias, s), axis=-1), v)
            R.output(y)
        return y


@I.ir_module
class PositionBias:  # one [T, T] table for every batch and head
    @R.function
    def main(q: R.Tensor(("b", H, "t", D), "float32"), k: R.Tensor(("b", H, "t", D), "float32"),
             v: R.Tensor(("b", H, "t", D), "float32"), bias: R.Tensor(("t", "t"), "float32")):
        with R.dataflow():
            s = R.multiply(R.matmul(q, R.permute_dims(k, [0, 1, 3, 2])), R.const(SCALE, "float32"))
            y = R.matmul(R.nn.softmax(R.add(s, bias), axis=-1), v)
            R.output(y)
        return y


@I.ir_module
class SoftmaxOverQueries:  # not attention as the kernel computes it: must stay unfused
    @R.function
    def main(q: R.Tensor(("b", H, "t", D), "float32"), k: R.Tensor(("b", H, "t", D), "float32"),
             v: R.Tensor(("b", H, "t", D), "float32")):
        with R.dataflow():
            s = R.multiply(R.matmul(q, R.permute_dims(k, [0, 1, 3, 2])), R.const(SCALE, "float32"))
            y = R.matmul(R.nn.softmax(s, axis=2), v)
            R.output(y)
        return y


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


BIAS_SHAPES = {NoBias: None, HeadBias: lambda b, t: (H, t, t), BatchBias: lambda b, t: (b, 1, t, t),
               PositionBias: lambda b, t: (t, t)}


@pytest.mark.parametrize("module", list(BIAS_SHAPES), ids=["no-bias", "head-bias", "batch-bias", "position-bias"])
def test_attention_becomes_one_kernel_and_matches_numpy(module):
    names = _kernel_names(module)
    assert "fused_attention" in names
    assert not [n for n in names if "softmax" in n or "matmul" in n], names
    vm = relax.VirtualMachine(tvm.compile(module, target=HOST, relax_pipeline=cpu_pipeline(HOST)), tvm.cpu())
    rng = np.random.default_rng(0)
    for b, t in [(1, 1), (2, 5), (1, 77), (2, 300)]:  # 77 and 300: ragged row blocks and column tails
        q, k, v = (rng.standard_normal((b, H, t, D), dtype=np.float32) for _ in range(3))
        args, bias = [q, k, v], None
        if BIAS_SHAPES[module] is not None:
            bias = rng.standard_normal(BIAS_SHAPES[module](b, t), dtype=np.float32)
            args.append(bias)
        got = vm["main"](*[tvm.runtime.tensor(a, tvm.cpu()) for a in args]).numpy()
        np.testing.assert_allclose(got, _reference(q, k, v, bias), rtol=1e-5, atol=2e-6)


def test_softmax_over_another_axis_is_left_alone():
    assert "fused_attention" not in _kernel_names(SoftmaxOverQueries)
    vm = relax.VirtualMachine(tvm.compile(SoftmaxOverQueries, target=HOST, relax_pipeline=cpu_pipeline(HOST)),
                              tvm.cpu())
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, H, 9, D), dtype=np.float32) for _ in range(3))
    got = vm["main"](*[tvm.runtime.tensor(a, tvm.cpu()) for a in (q, k, v)]).numpy()
    np.testing.assert_allclose(got, _reference(q, k, v, axis=2), rtol=1e-5, atol=2e-6)


def test_the_shipped_encoder_runs_one_attention_kernel_per_layer():
    from portable_pe.compile import prepare
    from portable_pe.tune import fused_prim_funcs
    state = prepare("t5_bias", target="llvm")  # a bias shared by the layers
    names = list(fused_prim_funcs(state.relax, state.tvm_target))
    assert "fused_attention" in names
    assert not [n for n in names if "softmax" in n], names
    text = state.relax.script()
    with state.tvm_target:
        fused = tvm.transform.Sequential(fusion_passes())(state.relax)
    assert fused.script().count("fused_attention") - text.count("fused_attention") >= state.spec.model.n_layers
