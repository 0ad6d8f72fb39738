"""FusableHeadReshapes (cpu_schedule/head_reshapes.py): a take of consecutive constant
indices becomes the slice it is, so FuseOps can put it, and what feeds it, in its reader's
kernel; other takes are left as they were, and the compiled result is numpy's take."""

from __future__ import annotations

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")
from tvm import relax, tirx  # noqa: E402

from portable_pe.cpu_schedule.head_reshapes import FusableHeadReshapes  # noqa: E402


def _prefix_module(indices, seq=None, mode="fast"):
    """x [1, T, 4, 8] -> heads [1, 4, T, 8] -> take(heads, indices, axis=2) and the heads
    scaled, concatenated on the token axis (DINOv3's CLS/register tokens beside its rotated
    patch tokens)."""
    t = seq if seq is not None else tirx.Var("T", "int64")
    x = relax.Var("x", relax.TensorType([1, t, 4, 8], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            heads = bb.emit(relax.op.permute_dims(x, [0, 2, 1, 3]))
            prefix = bb.emit(relax.op.take(heads, relax.const(np.asarray(indices, "int64")), axis=2,
                                                mode=mode))
            scaled = bb.emit(relax.op.multiply(heads, relax.const(np.float32(2.0))))
            out = bb.emit_output(relax.op.concat([prefix, scaled], axis=2))
        bb.emit_func_output(out)
    return bb.get()


def _ops(mod) -> list:
    found = []
    relax.analysis.post_order_visit(mod["main"], lambda e: found.append(e.op.name) if isinstance(e, relax.Call)
                                    and isinstance(e.op, tvm.ir.Op) else None)
    return found


@pytest.mark.parametrize("indices, sliced", [([0, 1, 2, 3, 4], True), ([2, 3], True), ([0, 2], False),
                                             ([1, 0], False), ([3], True)])
def test_only_a_run_of_consecutive_indices_is_a_slice(indices, sliced):
    ops = _ops(FusableHeadReshapes()(_prefix_module(indices)))
    assert ("relax.take" not in ops) == sliced, ops
    assert ("relax.strided_slice" in ops) == sliced, ops


def test_a_take_that_defines_out_of_range_indices_is_left_alone():
    """"clip" and "wrap" say what an index past the axis gives; a slice cannot say it."""
    for mode in ("clip", "wrap"):
        assert "relax.take" in _ops(FusableHeadReshapes()(_prefix_module([0, 1], mode=mode)))


def test_a_static_graph_is_left_alone():
    """Fully static functions keep TOPI's forms (the module docstring says why)."""
    ops = _ops(FusableHeadReshapes()(_prefix_module([0, 1], seq=6)))
    assert "relax.take" in ops, ops


def test_the_prefix_and_its_heads_are_one_kernel_and_match_numpy():
    from portable_pe.backends import get_backend
    from portable_pe.backends.targets import load_target
    from portable_pe.cpu_schedule.pipeline import fusion_passes
    spec = load_target("llvm")
    backend = get_backend(spec.backend)
    target = backend.tvm_target(spec)
    with target:
        fused = tvm.transform.Sequential(fusion_passes())(_prefix_module([0, 1, 2]))
    kernels = [gv.name_hint for gv, f in fused.functions_items() if isinstance(f, tirx.PrimFunc)]
    assert len(kernels) == 1 and "strided_slice" in kernels[0], kernels

    run = relax.VirtualMachine(tvm.compile(_prefix_module([0, 1, 2]), target=target,
                                           relax_pipeline=backend.relax_pipeline(target)), tvm.cpu())["main"]
    for t in (3, 7, 20):
        x = np.random.default_rng(t).standard_normal((1, t, 4, 8)).astype("float32")
        heads = x.transpose(0, 2, 1, 3)
        want = np.concatenate([np.take(heads, [0, 1, 2], axis=2), heads * 2.0], axis=2)
        np.testing.assert_array_equal(run(tvm.runtime.tensor(x)).numpy(), want)
