"""fast_math's erf for bf16 builds and fast_trig's sin and cos, through the compiled Relax ops."""

from __future__ import annotations

import numpy as np
import tvm
from scipy.special import erf
from tvm import relax, tirx

from portable_pe.cpu_schedule.fast_math import CPUFastMath

HOST = tvm.target.Target({"kind": "llvm", "num-cores": 2})


def _unary(op) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([tirx.Var("n", "int64")], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(op(x)))
        bb.emit_func_output(out)
    return bb.get()


def _run(mod, precision, x):
    """The op as fast math rewrites it for `precision`, on any x86 host (a whole bf16
    pipeline would need a CPU with bf16 instructions; the erf has none)."""
    exe = tvm.compile(CPUFastMath(bf16=precision == "bf16")(mod), target=HOST)
    return relax.VirtualMachine(exe, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()


def test_the_bf16_erf_is_within_5e_6_of_scipy_and_odd():
    """Over [-7, 7]: past the clamp at 4 too, where it stays at its value at 4."""
    half = np.linspace(0, 7, 100_001, dtype=np.float32)
    x = np.concatenate([-half[::-1], half])
    got = _run(_unary(relax.op.erf), "bf16", x)
    assert np.abs(got - erf(x.astype(np.float64))).max() <= 5e-6
    np.testing.assert_array_equal(got[:half.size], -got[half.size:][::-1])


def test_bf16_builds_take_the_bf16_erf_in_gelu_and_float32_builds_topis():
    """The bf16 rational's leading coefficient in the bf16 build's GELU, not in float32's;
    both GELUs within their bounds of x·Φ(x)."""
    mod = _unary(relax.op.nn.gelu)
    scripts = {bf16: CPUFastMath(bf16=bf16)(mod).script() for bf16 in (True, False)}
    assert "0.47821" in scripts[True] and "0.47821" not in scripts[False]
    x = np.linspace(-8, 8, 40_001, dtype=np.float32)
    exact = 0.5 * x.astype(np.float64) * (1 + erf(x.astype(np.float64) / np.sqrt(2)))
    for precision, bound in (("bf16", 5e-6 * 8), ("fp32", 2e-6 * 8)):
        assert np.abs(_run(mod, precision, x) - exact).max() <= bound, precision


def _trig_arguments() -> np.ndarray:
    """Small angles, a sinusoidal table's (positions to 4096 times 10000^(-2i/256)), and
    arguments to 1e7, far past where a float32 range reduction loses digits."""
    rng = np.random.default_rng(0)
    table = np.arange(4096)[:, None] * (10000.0 ** (-np.arange(0, 256, 2) / 256))[None]
    return np.concatenate([np.linspace(-10, 10, 20_001), table.ravel(), rng.uniform(-5e3, 5e3, 50_000),
                           rng.uniform(-1e7, 1e7, 50_000)]).astype(np.float32)


def test_sin_and_cos_are_within_an_ulp_of_one_of_the_exact_values():
    """Against numpy's float64 sin and cos of the same float32 arguments: within 1.2e-7
    (an ulp at 1; libm's float32 sinf is within 7e-8 here), and NaN where libm's is."""
    x = _trig_arguments()
    for op, exact in ((relax.op.sin, np.sin), (relax.op.cos, np.cos)):
        got = _run(_unary(op), "fp32", x)
        assert np.abs(got.astype(np.float64) - exact(x.astype(np.float64))).max() <= 1.2e-7, op
        special = _run(_unary(op), "fp32", np.array([np.inf, -np.inf, np.nan], np.float32))
        assert np.isnan(special).all(), (op, special)


def test_sin_and_cos_vectorize_instead_of_calling_libm():
    """LLVM turns a vectorized T.sin into one sinf call per element: the rewritten ops
    build to vector code with no libm call (the stock ones call sinf and cosf)."""
    from portable_pe.cpu_schedule import cpu_pipeline
    from portable_pe.cpu_schedule.work_claims import cpu_tir_pipeline
    target = tvm.target.Target({"kind": "llvm", "mcpu": "haswell", "num-cores": 2})
    for op, libm in ((relax.op.sin, "sinf"), (relax.op.cos, "cosf")):
        stock = tvm.compile(_unary(op), target=target).mod.imports[0].inspect_source("asm")
        fast = tvm.compile(_unary(op), target=target, relax_pipeline=cpu_pipeline(target),
                           tir_pipeline=cpu_tir_pipeline(target)).mod.imports[0].inspect_source("asm")
        assert libm in stock, f"the stock build no longer calls {libm}: this test shows nothing"
        assert libm not in fast and "vroundpd" in fast, op
