"""A Hugging Face vision encoder on Rockchip's NPU, judged by RKNN-Toolkit2 itself.

transformers' ViT (tiny config, TorchScript export, the image size dynamic in the file),
pinned to 1 x 3 x 32 x 32 with --shape as an NPU build needs, compiled for `--target npu
--profile rknpu2`: RKNN builds it for rk3588, its layer table says where each op runs, and
its x86 simulator runs it on NCHW input (the worker tells it the layout; its default is
NHWC). What is measured is recorded, not relabeled: on this random-weight tiny ViT the
int8 simulator's output has cosine 0.9976 against the float graph, which the NPU's parity
row (max rel 0.1) does not pass.

portable-pe's own vision graphs (tiny specs in tests/data/vision) are built at one static
image size (--image-size, default the spec's export.example_size): the pinned export's
patch positions fold to constants, and RKNN places every op on the NPU. Measured at 32x32
(18 tokens) on rk3588: int8 simulator cosine 0.99887 (rope_2d), 0.99924 (rel_bias_2d);
fp16 0.9999997 (both). scripts/results/npu-rknn-vision.md has the shipped graphs at 224x224.
"""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from conftest import DATA  # noqa: E402
from portable_pe.compile.pipeline import compile_graph, prepare  # noqa: E402
from portable_pe.hf.vision import export_vision  # noqa: E402
from portable_pe.npu.rknn_log import placement  # noqa: E402
from portable_pe.npu.toolchain import toolchain_python  # noqa: E402

pytestmark = pytest.mark.integration  # run by scripts/test.sh after the default run (pyproject.toml)

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


@needs_rknn
def test_a_pinned_swin_builds_on_the_npu_with_its_window_partition_at_rank_four(tmp_path):
    """transformers' Swin cuts windows with a rank-6 view and Transpose, which stopped the
    build ("rank reduction: no rule for Transpose"); on merged axes it is rank 4 and RKNN
    places every op on the NPU. Measured at 32x32: 145 ops, int8 simulator cosine 0.9954."""
    _, path = export_vision("swin", tmp_path / "swin.onnx", exporter="torchscript")
    bundle = compile_graph(str(path), target="npu", out=tmp_path / "b", shapes={"pixel_values": [1, 3, 32, 32]},
                           target_options={"profile": "rknpu2"}, log=lambda m: None)
    manifest = bundle.manifest
    assert manifest["npu"]["rewrite"]["transposes_on_merged_axes"] > 0
    placement = manifest["vendor"]["placement"]
    assert placement["ops_cpu"] == 0 and placement["ops_npu"] > 0, placement
    simulated = manifest["vendor"]["simulator"]
    assert simulated["last_hidden_state"]["cosine"] > 0.99, simulated


@needs_rknn
def test_a_pinned_swin_at_224_matches_pytorch_in_rknns_fp16_simulator(tmp_path):
    """At 224x224 (196 windows of 2 x 2 patches in stage 2) RKNN computed the transposed head
    merge [196, 4, 4, 8] wrong: fp16 simulator cosine 0.997184 against PyTorch. The graph
    RKNN is handed has each merge as a concatenation of the heads (npu/head_merge.py):
    measured 181 ops on the NPU, 0 on the CPU, cosine 1.000000."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from portable_pe.npu.head_merge import CONCAT_OF_HEADS
    _, path = export_vision("swin", tmp_path / "swin.onnx", exporter="torchscript")
    st = prepare(str(path), target="npu", shapes={"pixel_values": [1, 3, 224, 224]}, through="vendor",
                 target_options={"profile": "rknpu2", "npu_dtype": "fp16", "vendor_build": "require"},
                 host_build=False, log=lambda m: None)
    handed = onnx.ModelProto.FromString(st.files["rknn/model.onnx"])
    assert sum(n.name.endswith(CONCAT_OF_HEADS) for n in handed.graph.node) == 4  # one per block, 2 stages of 2
    vendor = st.report["vendor"]
    assert vendor["placement"]["ops_cpu"] == 0, vendor["placement"]["cpu_ops"]
    # the graph RKNN is handed computes what the export does (the rewrite is exact)
    x = {"pixel_values": np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)}
    exported = ort.InferenceSession(str(path)).run(None, x)[0]
    assert np.abs(ort.InferenceSession(handed.SerializeToString()).run(None, x)[0] - exported).max() < 1e-4
    simulated = vendor["simulator"]["last_hidden_state"]
    assert simulated["cosine"] >= 0.999, simulated  # #23's fp16 goal


def test_a_dynamic_image_is_refused_for_the_npu_with_the_fix(tmp_path):
    _, path = export_vision("vit", tmp_path / "vit.onnx", exporter="torchscript")
    with pytest.raises(ValueError, match=r"pass --shape pixel_values=1x3xHxW"):
        compile_graph(str(path), target="npu", out=tmp_path / "b", target_options={"profile": "rknpu2"},
                      log=lambda m: None)
    assert not (tmp_path / "b").exists()


#: the simulator's cosine against PyTorch must stay above these (measured: see the docstring)
COSINE_FLOOR = {"int8": 0.995, "fp16": 0.9999}


@needs_rknn
@pytest.mark.parametrize("graph,size,dtype,tokens", [
    ("tiny_vit_rope_2d", [32, 32], "int8", 2 + 16),  # a CLS and a register token, 4x4 patches
    ("tiny_vit_rope_2d", None, "fp16", 2 + 12),  # export.example_size 24x32: 3x4 patches
    ("tiny_vit_rel_bias_2d", [32, 32], "int8", 2 + 16),
    ("tiny_swin_rel_bias_2d", [48, 72], "int8", 6 * 9),  # 2 x 3 windows of 3 x 3 patches, shifted in block 2
])
def test_a_native_vision_graph_builds_on_the_npu_at_a_static_size(graph, size, dtype, tokens):
    options = {"profile": "rknpu2", "npu_dtype": dtype, "vendor_build": "require",
               **({"image_size": size} if size else {})}
    st = prepare(str(DATA / "vision" / f"{graph}.toml"), target="npu", target_options=options, through="vendor",
                 host_build=False, log=lambda m: None)
    npu, vendor = st.report["npu"], st.report["vendor"]
    assert npu["image"] == {"input": "pixel_values", "shape": [1, 3, *(size or st.spec.example_size)]}
    assert npu["fold"]["runtime_position_ops_left"] == {}, npu["fold"]  # the 2D positions are constants
    assert st.io["outputs"][0]["dims"] == [1, tokens, st.spec.model.d_model]
    placed = vendor["placement"]
    assert placed == placement(st.files["rknn/build.log"].decode()), "placement is RKNN's own layer table"
    assert npu["coverage"]["source"].startswith("rknn-toolkit2") and "build log" in npu["coverage"]["source"]
    assert placed["ops_npu"] > 0 and placed["npu_ops"].get("Conv", 0) >= 1, placed  # the patch stem on the NPU
    assert placed["ops_cpu"] == 0, placed["cpu_ops"]
    simulated = vendor["simulator"]["hidden"]  # the simulator ran on the reference case's pixels
    assert simulated["cosine"] > COSINE_FLOOR[dtype], simulated
