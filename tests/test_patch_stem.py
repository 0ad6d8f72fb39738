"""The patch-stem rewrite (cpu_schedule.patch_stem): a conv whose stride is its kernel,
run as a matmul, gives the conv's numbers at sizes that are and are not whole patches,
and any other conv is left to TOPI."""

from __future__ import annotations

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")
from tvm import relax, tirx  # noqa: E402

from conftest import assert_parity  # noqa: E402
from portable_pe.backends import get_backend  # noqa: E402
from portable_pe.backends.targets import load_target  # noqa: E402
from portable_pe.cpu_schedule.patch_stem import PatchStemAsMatmul  # noqa: E402
from portable_pe.cpu_schedule.work_claims import cpu_tir_pipeline


def _conv_module(weight: np.ndarray, *, stride: int, padding: int = 0):
    h, w = tirx.Var("h", "int64"), tirx.Var("w", "int64")
    x = relax.Var("x", relax.TensorType([1, weight.shape[1], h, w], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.nn.conv2d(x, relax.const(weight), strides=stride, padding=padding))
        bb.emit_func_output(y)
    return bb.get()


def _ops(mod) -> str:
    return mod["main"].script()


def _conv_reference(x: np.ndarray, weight: np.ndarray, stride: int) -> np.ndarray:
    """Direct loops over the output pixels: an oracle independent of TVM."""
    out_ch, _, k, _ = weight.shape
    hp, wp = (x.shape[2] - k) // stride + 1, (x.shape[3] - k) // stride + 1
    out = np.zeros((1, out_ch, hp, wp), np.float64)
    for i in range(hp):
        for j in range(wp):
            patch = x[0, :, i * stride:i * stride + k, j * stride:j * stride + k]
            out[0, :, i, j] = np.tensordot(weight, patch, axes=([1, 2, 3], [0, 1, 2]))
    return out.astype(np.float32)


def _run(mod, x):
    spec = load_target("llvm")
    backend = get_backend(spec.backend)
    target = backend.tvm_target(spec)
    vm = relax.VirtualMachine(tvm.compile(mod, target=target, relax_pipeline=backend.relax_pipeline(target),
                                          tir_pipeline=cpu_tir_pipeline(target)), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


def test_a_patch_stem_is_a_matmul_with_the_convs_numbers():
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((16, 3, 4, 4)).astype(np.float32)
    mod = _conv_module(weight, stride=4)
    assert "conv2d" not in _ops(PatchStemAsMatmul(mod)) and "matmul" in _ops(PatchStemAsMatmul(mod))
    for h, w in ((8, 12), (16, 16), (10, 13)):  # 10 x 13: not whole patches, the conv drops the rest
        x = rng.standard_normal((1, 3, h, w)).astype(np.float32)
        assert_parity(_conv_reference(x, weight, 4), _run(mod, x), name=f"{h}x{w}")


@pytest.mark.parametrize("stride,padding", [(2, 0), (4, 1)])
def test_other_convs_are_left_alone(stride, padding):
    weight = np.ones((8, 3, 4, 4), np.float32)
    assert "conv2d" in _ops(PatchStemAsMatmul(_conv_module(weight, stride=stride, padding=padding)))


def _conv3d_module(weight: np.ndarray, stride):
    f, h, w = (tirx.Var(n, "int64") for n in ("f", "h", "w"))
    x = relax.Var("x", relax.TensorType([1, weight.shape[1], f, h, w], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.nn.conv3d(x, relax.const(weight), strides=stride))
        bb.emit_func_output(y)
    return bb.get()


def _conv3d_reference(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """Direct loops over the output tubelets (stride = kernel): an oracle independent of TVM."""
    out_ch, _, kt, kh, kw = weight.shape
    grid = [x.shape[2] // kt, x.shape[3] // kh, x.shape[4] // kw]
    out = np.zeros((1, out_ch, *grid), np.float64)
    for t in range(grid[0]):
        for i in range(grid[1]):
            for j in range(grid[2]):
                tube = x[0, :, t * kt:(t + 1) * kt, i * kh:(i + 1) * kh, j * kw:(j + 1) * kw]
                out[0, :, t, i, j] = np.tensordot(weight, tube, axes=([1, 2, 3, 4], [0, 1, 2, 3]))
    return out.astype(np.float32)


def test_a_video_tubelet_stem_is_a_matmul_with_the_conv3ds_numbers():
    """A video ViT's conv3d over (2, 4, 4) tubelets (TOPI's conv3d was 78% of video_none's
    time at 4 x 224 x 224), at sizes that are and are not whole tubelets."""
    rng = np.random.default_rng(1)
    weight = rng.standard_normal((8, 3, 2, 4, 4)).astype(np.float32)
    mod = _conv3d_module(weight, stride=(2, 4, 4))
    assert "conv3d" not in _ops(PatchStemAsMatmul(mod)) and "matmul" in _ops(PatchStemAsMatmul(mod))
    for f, h, w in ((2, 8, 12), (4, 16, 16), (5, 10, 13)):  # 5 x 10 x 13: the conv drops the rest
        x = rng.standard_normal((1, 3, f, h, w)).astype(np.float32)
        assert_parity(_conv3d_reference(x, weight), _run(mod, x), name=f"{f}x{h}x{w}")
    assert "conv3d" in _ops(PatchStemAsMatmul(_conv3d_module(weight, stride=(1, 4, 4))))  # overlapping: TOPI's
