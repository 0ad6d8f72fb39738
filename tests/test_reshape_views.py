"""Reshapes over compound symbolic dims (cpu_schedule.reshape_views): kept as views where
TVM's legalization would leave an opaque copy kernel, legalized as before elsewhere, and
the numbers unchanged either way."""

from __future__ import annotations

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")
from tvm import relax, tirx  # noqa: E402

from conftest import assert_parity  # noqa: E402
from portable_pe.backends import get_backend  # noqa: E402
from portable_pe.backends.targets import load_target  # noqa: E402
from portable_pe.cpu_schedule.reshape_views import stays_a_copy  # noqa: E402
from portable_pe.cpu_schedule.work_claims import cpu_tir_pipeline


def _dims(*names):
    return [tirx.Var(n, "int64") for n in names]


def _reshape(source_shape, shape):
    """A normalized relax.reshape call of a float32 tensor of `source_shape`."""
    data = relax.Var("data", relax.TensorType(source_shape, "float32"))
    return relax.BlockBuilder().normalize(relax.op.reshape(data, shape))


def test_a_flatten_of_symbolic_grid_dims_would_stay_a_copy():
    batch, n0, n1, n2 = _dims("batch", "n0", "n1", "n2")
    # a video graph's patch grid flattened into tokens: TVM cannot prove the copy is a reshape
    assert stays_a_copy(_reshape([batch, 8, n0, n1, n2], [batch, 8, n0 * n1 * n2]))
    # the patch stem's split of a video's whole tubelets into (tubelets, tubelet size)
    f, h, w = _dims("f", "h", "w")
    assert stays_a_copy(_reshape([batch, 3, f // 2 * 2, h // 4 * 4, w // 4 * 4],
                                 [batch, 3, f // 2, 2, h // 4, 4, w // 4, 4]))


def test_reshapes_tvm_recognizes_are_legalized_as_before():
    assert not stays_a_copy(_reshape([2, 3, 4], [6, 4]))
    batch, t = _dims("batch", "t")
    # a text graph's head split: RewriteDataflowReshape makes TVM's copy a view itself
    assert not stays_a_copy(_reshape([batch, t, 64], [batch, t, 4, 16]))


def _grid_flatten_module():
    """x + 1, its (n0, n1, n2) grid flattened, times 2: the reshape between two kernels."""
    batch, n0, n1, n2 = _dims("batch", "n0", "n1", "n2")
    x = relax.Var("x", relax.TensorType([batch, 4, n0, n1, n2], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            shifted = bb.emit(relax.op.add(x, relax.const(1.0, "float32")))
            flat = bb.emit(relax.op.reshape(shifted, [batch, 4, n0 * n1 * n2]))
            out = bb.emit_output(relax.op.multiply(flat, relax.const(2.0, "float32")))
        bb.emit_func_output(out)
    return bb.get()


def test_the_flatten_runs_as_a_view_with_the_same_numbers():
    spec = load_target("llvm")
    backend = get_backend(spec.backend)
    target = backend.tvm_target(spec)
    mod = _grid_flatten_module()
    with target:
        lowered = backend.relax_pipeline(target)(mod)
    kernels = [gv.name_hint for gv, f in lowered.functions_items() if isinstance(f, tirx.PrimFunc)
               and not (f.attrs is not None and f.attrs.get("tirx.is_host_func"))]
    assert not [k for k in kernels if "reshape" in k], kernels  # no copy kernel left for the flatten
    vm = relax.VirtualMachine(tvm.compile(mod, target=target, relax_pipeline=backend.relax_pipeline(target),
                                          tir_pipeline=cpu_tir_pipeline(target)),
                              tvm.cpu())
    rng = np.random.default_rng(0)
    for shape in ((1, 4, 2, 3, 5), (2, 4, 3, 1, 7)):
        x = rng.standard_normal(shape).astype(np.float32)
        expected = ((x + 1) * 2).reshape(shape[0], 4, -1)  # numpy: the oracle
        assert_parity(expected, vm["main"](tvm.runtime.tensor(x)).numpy(), name=str(shape))
