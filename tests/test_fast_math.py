"""fast_math's erf for bf16 builds against scipy's, through the compiled Relax op."""

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
