"""Hugging Face vision encoders as foreign ONNX exports at dynamic image sizes:
transformers' own classes (tiny configs of portable_pe.hf.vision, random weights, no
download), exported in the test with H and W dynamic, compiled for llvm with no --shape,
and one bundle run at image sizes the export never saw, against PyTorch.

Where PyTorch's export specialized the graph to the traced size (torch.export's ViT: its
position table stays at the traced grid), the compile must refuse it with the fix; the
test checks with onnxruntime that the file itself is wrong at a second size, so the
refusal is right and not our failure. Default run: ViT (TorchScript, its table resized in
the graph), DINOv3 and Pixtral (torch.export, 2D RoPE), BEiT (TorchScript, 2D relative
bias), Swin (TorchScript: windows with a cyclic shift and padding computed from H and W,
images in whole windows of every stage); the other models of the table with ``-m hf_full``.
Encoders whose export holds one size (Qwen2.5-VL vision, Llama-4 vision, Whisper's encoder)
are refused when exported dynamic, and compiled once per size.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers")

from conftest import assert_parity  # noqa: E402
from portable_pe.compile.pipeline import compile_graph  # noqa: E402
from portable_pe.compile.simplify import ort_session  # noqa: E402
from portable_pe.compile.size_probe import SpecializedExportError, probe_pixel_sizes  # noqa: E402
from portable_pe.hf.vision import VISION_ARCHITECTURES, export_vision  # noqa: E402
from portable_pe.run.local import LocalRunner  # noqa: E402
from portable_pe.spec.io_names import describe_io  # noqa: E402

pytestmark = pytest.mark.integration  # run by scripts/test.sh after the default run (pyproject.toml)

UNSEEN = ((16, 24), (48, 64), (64, 40))  # the export traces at 32 x 32
# Swin: multiples of 16 pixels, none traced, with more than one window along every side of
# every stage. Where a stage is one window (16 pixels high), transformers' SwinLayer stops
# shifting and sets its shift to 0 for good (set_shift_and_window_size mutates the module), so
# PyTorch's answer there, and at every size after it, is not the traced graph's: onnxruntime
# differs from it by 0.18 at 16x32 and by 0.22 at 32x48 afterwards.
WHOLE_WINDOWS = ((32, 48), (48, 64), (64, 32))
DEFAULT = [("vit", "torchscript"), ("dinov3", "dynamo"), ("pixtral", "dynamo"), ("beit", "torchscript"),
           ("swin", "torchscript")]
FULL = [("siglip", "torchscript"), ("dinov2", "torchscript"), ("pixtral", "torchscript"), ("dinov3", "torchscript"),
        ("swin", "dynamo")]


def _pixels(h: int, w: int) -> np.ndarray:
    return np.random.default_rng(h * 1000 + w).standard_normal((1, 3, h, w)).astype(np.float32)


def _torch(module, pixels: np.ndarray) -> np.ndarray:
    import torch
    with torch.no_grad():
        return module(torch.from_numpy(pixels)).numpy()


@pytest.mark.parametrize("arch,exporter", DEFAULT + [pytest.param(*c, marks=pytest.mark.hf_full) for c in FULL])
def test_one_bundle_matches_pytorch_at_unseen_image_sizes(arch, exporter, tmp_path):
    module, path = export_vision(arch, tmp_path / "model.onnx", exporter=exporter)
    bundle = compile_graph(str(path), target="llvm", out=tmp_path / "bundle", log=lambda m: None)
    dims = {info["role"]: info for info in bundle.manifest["dims"].values()}
    patch = VISION_ARCHITECTURES[arch].patch
    whole = _whole_windows(arch)  # the stem's stride, or Swin's window of its last stage
    assert dims["height"]["multiple"] == dims["width"]["multiple"] == whole
    runner = LocalRunner(bundle)
    for h, w in UNSEEN if whole == patch else WHOLE_WINDOWS:
        x = _pixels(h, w)
        got, want = next(iter(runner.run({"pixel_values": x}).values())), _torch(module, x)
        # the tokens follow the image: a patch each, or (Swin) a patch of its last stage each
        assert got.shape == want.shape and want.shape[1] >= (h // whole) * (w // whole)
        assert_parity(want, got, tolerance="float32_abs", name=f"{arch} {h}x{w}")


def _whole_windows(arch: str) -> int:
    options = VISION_ARCHITECTURES[arch].options
    if "window_size" not in options:
        return VISION_ARCHITECTURES[arch].patch
    return options["patch_size"] * options["window_size"] * 2 ** (len(options["depths"]) - 1)


def test_a_specialized_export_is_refused_with_the_fix(tmp_path):
    """torch.export's ViT keeps H and W symbolic but its position table at the traced 4 x 4
    grid: onnxruntime itself fails at 48 x 64, and the compile says why and what to do."""
    _, path = export_vision("vit", tmp_path / "model.onnx", exporter="dynamo")
    session = ort_session(str(path), quiet=True)
    session.run(None, {"pixel_values": _pixels(32, 32)})  # the traced size runs
    with pytest.raises(Exception, match="broadcast"):
        session.run(None, {"pixel_values": _pixels(48, 64)})
    with pytest.raises(SpecializedExportError) as err:
        compile_graph(str(path), target="llvm", out=tmp_path / "bundle", log=lambda m: None)
    text = str(err.value)
    assert "specialized it to the size it traced" in text and "--shape pixel_values=1x3x" in text
    assert "interpolate_pos_encoding" in text
    assert not (tmp_path / "bundle").exists()  # nothing written


def test_a_coarser_multiple_the_graph_needs_is_learned(tmp_path):
    """torch.export's Swin drops the window padding it traced as zero, so only sizes whose
    every stage is whole windows run: patch * window * 2 ** (stages - 1) pixels."""
    import onnx
    _, path = export_vision("swin", tmp_path / "model.onnx", exporter="dynamo")
    model = onnx.load(str(path))
    io = describe_io(model, None)
    assert {i["multiple"] for i in io["dims"].values() if "multiple" in i} == {4}  # the conv's stride
    probed = probe_pixel_sizes(model, io, log=lambda m: None)
    assert {i["multiple"] for i in probed["dims"].values() if "multiple" in i} == {_whole_windows("swin")}


# Encoders whose export holds one size (portable_pe.hf.per_size): Qwen2.5-VL's vision tower
# (a grid: windows and rotary positions computed from grid_thw's values), Llama-4's vision
# model (an image side: its position tables), Whisper's encoder (a frame count: its table).
DYNAMIC_REFUSED = [("whisper", "torchscript"), ("qwen2_5_vl", "torchscript"), ("llama4", "dynamo")]
PER_SIZE = [("whisper", "torchscript"), pytest.param("qwen2_5_vl", "torchscript", marks=pytest.mark.hf_full),
            pytest.param("llama4", "dynamo", marks=pytest.mark.hf_full),
            pytest.param("whisper", "dynamo", marks=pytest.mark.hf_full)]


@pytest.mark.parametrize("arch,exporter", DYNAMIC_REFUSED)
def test_an_export_of_one_size_is_refused_with_the_fix(arch, exporter, tmp_path):
    """The size axes exported symbolic: onnxruntime runs the traced size only, and the
    compile says so with --shape pins instead of writing a bundle."""
    from portable_pe.hf.per_size import PER_SIZE_ARCHITECTURES, export_per_size, torch_output
    spec = PER_SIZE_ARCHITECTURES[arch]
    module, path = export_per_size(arch, spec.sizes[0], tmp_path / "model.onnx", exporter=exporter, dynamic=True)
    session = ort_session(str(path), quiet=True)
    names = [i.name for i in session.get_inputs()]
    feeds = spec.inputs(spec.sizes[0], 1)
    assert np.abs(session.run(None, {n: feeds[n] for n in names})[0] - torch_output(module, feeds)).max() < 1e-4
    other = spec.inputs(spec.sizes[1], 1)
    with pytest.raises(Exception):  # the file itself is wrong at another size
        session.run(None, {n: other[n] for n in names})
    with pytest.raises(SpecializedExportError, match="--shape"):
        compile_graph(str(path), target="llvm", out=tmp_path / "bundle", log=lambda m: None)
    assert not (tmp_path / "bundle").exists()


@pytest.mark.parametrize("arch,exporter", PER_SIZE)
def test_one_export_per_size_matches_pytorch(arch, exporter, tmp_path):
    from portable_pe.hf.per_size import PER_SIZE_ARCHITECTURES, export_per_size, torch_output
    spec = PER_SIZE_ARCHITECTURES[arch]
    for i, size in enumerate(spec.sizes):
        module, path = export_per_size(arch, size, tmp_path / f"{i}.onnx", exporter=exporter)
        bundle = compile_graph(str(path), target="llvm", out=tmp_path / f"bundle{i}", log=lambda m: None)
        assert not bundle.manifest["dims"]  # static: this size only
        feeds = spec.inputs(size, 3)
        got = next(iter(LocalRunner(bundle).run({d["name"]: feeds[d["name"]]
                                                 for d in bundle.manifest["inputs"]}).values()))
        want = torch_output(module, feeds)
        assert got.shape == want.shape
        assert_parity(want, got, tolerance="float32_abs", name=f"{arch} {spec.label(size)}")


def test_siglips_attention_pinned_to_its_traced_size_compiles_and_matches(tmp_path):
    """torch.export's SigLIP pinned with --shape: onnxsim's fuse_attention used to write
    com.microsoft.Attention with SigLIP's scale, which TVM's importer refuses ("custom scale
    is not currently supported"); the simplify stage skips that fusion (the CPU pipeline
    fuses attention itself), and the bundle matches PyTorch."""
    module, path = export_vision("siglip", tmp_path / "model.onnx", exporter="dynamo")
    bundle = compile_graph(str(path), target="llvm", out=tmp_path / "bundle", log=lambda m: None,
                           shapes={"pixel_values": [1, 3, 32, 32]})
    pixels = _pixels(32, 32)
    (got,) = LocalRunner(bundle).run({"pixel_values": pixels}).values()
    assert_parity({"hidden": _torch(module, pixels)}, {"hidden": got}, tolerance="float32_abs")


@pytest.mark.nvcc
@pytest.mark.parametrize("arch,exporter", [("pixtral", "torchscript"), ("dinov3", "torchscript"),
                                           ("beit", "torchscript")])
def test_a_dynamic_export_builds_for_cuda_and_nvcc_compiles_it(arch, exporter, tmp_path):
    """One cuda build for every image size of a foreign export (parity on an H200: README,
    NVIDIA GPUs; there Pixtral first returned NaN: see cuda_math.py). Pixtral's TorchScript export
    holds TOPI's GPU scatter_nd, which launches its own threads: the last-resort schedule
    bound it again and nested two grids ("All loops that are bound to `blockIdx.x` should
    have the same extent"). BEiT's token count is an expression dim_vars cannot name: its
    matmuls fall through dlight's Matmul (cuda_rules._check_device_allocations), and the
    manifest says so."""
    import shutil
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not on PATH")
    import re
    from test_cuda import nvcc_ptx
    _, path = export_vision(arch, tmp_path / f"{arch}.onnx", exporter=exporter)
    out = tmp_path / "bundle"
    bundle = compile_graph(str(path), target="cuda", target_options={"arch": "sm_90"}, out=out,
                           keep_intermediates=True, log=lambda m: None)
    source = (tmp_path / "bundle.intermediates" / "06-kernels.cu").read_text()
    assert sorted(re.findall(r"\.entry (\w+)\(", nvcc_ptx(source, "sm_90"))) == bundle.manifest["cuda"]["kernels"]
    # Pixtral's RMSNorm squares with Pow: under nvcc's fast math powf is NaN for x < 0
    assert "powf(" not in source
    fell = bundle.manifest.get("cuda_schedules", {}).get("fell_through", {})
    sized = [k for k, why in fell.items() if any("non-constant size" in w for w in why)]
    assert bool(sized) == (arch == "beit"), fell
