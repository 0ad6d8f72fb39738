"""FlattenDenseRows (cpu_schedule/flat_rows.py): a float32 dense over [batch, seq, K] runs
over batch * seq rows, its epilogue (bias, activation, residual) still in its kernel, and
computes what the graph computes."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, tirx

from portable_pe.cpu_schedule import cpu_pipeline
from portable_pe.cpu_schedule.pipeline import fusion_passes

HOST = tvm.target.Target({"kind": "llvm", "num-cores": 2})
K, N = 32, 64


def _block(rng):
    """y = x + gelu(x @ W1 + b1) @ W2 + b2 over x [batch, seq, K], a pre-norm MLP block
    without its norm: a bias, an activation and a residual that is not a dense's output."""
    w1, w2 = (rng.standard_normal(s).astype("float32") * 0.2 for s in ((K, N), (N, K)))
    b1, b2 = rng.standard_normal(N).astype("float32"), rng.standard_normal(K).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([tirx.Var("batch", "int64"), tirx.Var("seq", "int64"), K], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.op.nn.gelu(relax.op.add(relax.op.matmul(x, relax.const(w1)), relax.const(b1))))
            y = bb.emit(relax.op.add(relax.op.add(relax.op.matmul(h, relax.const(w2)), relax.const(b2)), x))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get(), (w1, b1, w2, b2)


def _reference(x, w1, b1, w2, b2):
    from scipy.special import erf
    h = x.astype("float64") @ w1 + b1
    h = 0.5 * h * (1 + erf(h / np.sqrt(2)))
    return h @ w2 + b2 + x


def _fused(mod, precision="fp32"):
    with HOST:
        return tvm.transform.Sequential(fusion_passes(precision=precision))(mod)


def _matmul_kernels(fused):
    return {gv.name_hint: f for gv, f in fused.functions_items()
            if isinstance(f, tirx.PrimFunc) and "matmul" in gv.name_hint}


def test_each_dense_takes_one_row_dim_with_its_epilogue_in_its_kernel():
    mod, _ = _block(np.random.default_rng(0))
    kernels = _matmul_kernels(_fused(mod))
    assert len(kernels) == 2, sorted(kernels)
    for name, func in kernels.items():
        script = func.script()
        assert "rows" in script and "batch" not in script and "seq" not in script, (name, script)
    second = next(name for name in kernels if "gelu" not in name)
    assert second.count("add") == 2, f"the bias and the residual add belong in the dense's kernel: {sorted(kernels)}"


def test_bf16_builds_keep_the_batch_dim():
    """(the bf16 attention reads K from a [batch, keys, width] projection: flat_rows says why)"""
    assert "FlattenDenseRows" not in [p.info.name for p in _passes_of(fusion_passes(precision="bf16"))]
    assert "FlattenDenseRows" in [p.info.name for p in _passes_of(fusion_passes(precision="fp32"))]


def _passes_of(passes):
    from portable_pe.cpu_schedule.dim_vars import WithNamedDims
    out = []
    for p in passes:
        out.extend(p.passes.passes if isinstance(p, WithNamedDims) else [p])
    return out


@pytest.mark.parametrize("batch,seq", [(1, 1), (3, 5), (2, 13), (8, 12)])
def test_the_flattened_block_matches_numpy(batch, seq):
    rng = np.random.default_rng(batch * 100 + seq)
    mod, weights = _block(rng)
    vm = relax.VirtualMachine(tvm.compile(mod, target=HOST, relax_pipeline=cpu_pipeline(HOST)), tvm.cpu())
    x = rng.standard_normal((batch, seq, K)).astype("float32")
    got = vm["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(got, _reference(x, *weights), rtol=1e-5, atol=1e-4)
