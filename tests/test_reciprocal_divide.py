"""fast_math's x / c -> x · (1/c) for a constant scalar c, and what it leaves alone."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, tirx

from portable_pe.cpu_schedule import cpu_pipeline
from portable_pe.cpu_schedule.fast_math import CPUFastMath

HOST = tvm.target.Target({"kind": "llvm", "num-cores": 2})


def _divide(divisor) -> tvm.IRModule:
    """main(x [n, 8]) = x / divisor (a Relax constant or a second parameter)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([tirx.Var("n", "int64"), 8], "float32"))
    params = [x]
    if divisor is None:
        divisor = relax.Var("d", relax.TensorType([8], "float32"))
        params.append(divisor)
    else:
        divisor = relax.const(np.asarray(divisor, dtype="float32"))
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.divide(x, divisor)))
        bb.emit_func_output(out)
    return bb.get()


def _ops(mod) -> list[str]:
    return [b.value.op.name for b in mod["main"].body.blocks[0].bindings if isinstance(b.value, relax.Call)]


@pytest.mark.parametrize("divisor", [np.float32(1.4142135), np.array([3.0], "float32"), np.float32(-0.1)])
def test_division_by_a_constant_scalar_becomes_a_multiplication_within_an_ulp(divisor):
    mod = _divide(divisor)
    assert _ops(CPUFastMath()(mod)) == ["relax.multiply"]
    vm = relax.VirtualMachine(tvm.compile(mod, target=HOST, relax_pipeline=cpu_pipeline(HOST)), tvm.cpu())
    x = np.random.default_rng(0).standard_normal((5, 8)).astype("float32") * 100
    got = vm["main"](tvm.runtime.tensor(x)).numpy()
    exact = x.astype(np.float64) / np.float64(np.asarray(divisor).reshape(()))
    # x · fl(1/c) rounded: two roundings, each half an ulp of a float32
    np.testing.assert_allclose(got, exact, rtol=2 * np.finfo(np.float32).eps, atol=0)


@pytest.mark.parametrize("divisor", [None, np.arange(1, 9, dtype="float32"), np.float32(0.0), np.float32(1e-39),
                                     np.float32(3e38)])
def test_a_tensor_divisor_and_reciprocals_that_are_not_normal_floats_stay_divisions(divisor):
    """A divisor that is a parameter or has several elements; 0 (x/0 is inf or nan, not
    x · inf); a subnormal (its reciprocal overflows) and 3e38 (its reciprocal is subnormal,
    losing bits)."""
    assert _ops(CPUFastMath()(_divide(divisor))) == ["relax.divide"]
