"""A Hugging Face vision encoder on Rockchip's NPU, judged by RKNN-Toolkit2 itself.

transformers' ViT (tiny config, TorchScript export, the image size dynamic in the file),
pinned to 1 x 3 x 32 x 32 with --shape as an NPU build needs, compiled for `--target npu
--profile rknpu2`: RKNN builds it for rk3588, its layer table says where each op runs, and
its x86 simulator runs it on NCHW input (the worker tells it the layout; its default is
NHWC). What is measured is recorded, not relabeled: on this random-weight tiny ViT the
int8 simulator's output has cosine 0.9976 against the float graph, which the NPU's parity
row (max rel 0.1) does not pass.
"""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from portable_pe.compile.pipeline import compile_graph  # noqa: E402
from portable_pe.hf.vision import export_vision  # noqa: E402
from portable_pe.npu.toolchain import toolchain_python  # noqa: E402

needs_rknn = pytest.mark.skipif(toolchain_python("rknn") is None,
                                reason="RKNN-Toolkit2 is not set up: bash scripts/npu_toolchain.sh rknn")


@needs_rknn
def test_a_pinned_vit_builds_on_the_npu_with_every_op_there(tmp_path):
    _, path = export_vision("vit", tmp_path / "vit.onnx", exporter="torchscript")
    bundle = compile_graph(str(path), target="npu", out=tmp_path / "b", shapes={"pixel_values": [1, 3, 32, 32]},
                           target_options={"profile": "rknpu2"}, log=lambda m: None)
    manifest = bundle.manifest
    assert manifest["npu"]["image"] == {"input": "pixel_values", "shape": [1, 3, 32, 32]}
    placement = manifest["vendor"]["placement"]
    assert placement["ops_cpu"] == 0 and placement["ops_npu"] > 0, placement  # RKNN's own layer table
    assert placement["npu_ops"].get("Conv", 0) >= 1  # the patch stem among them
    assert manifest["vendor"]["agreement"]["agree"], manifest["vendor"]["agreement"]
    simulated = manifest["vendor"]["simulator"]
    assert simulated["last_hidden_state"]["cosine"] > 0.99, simulated  # it ran, on NCHW input, near the float graph


def test_a_dynamic_image_is_refused_for_the_npu_with_the_fix(tmp_path):
    _, path = export_vision("vit", tmp_path / "vit.onnx", exporter="torchscript")
    with pytest.raises(ValueError, match=r"pass --shape pixel_values=1x3xHxW"):
        compile_graph(str(path), target="npu", out=tmp_path / "b", target_options={"profile": "rknpu2"},
                      log=lambda m: None)
    assert not (tmp_path / "b").exists()
