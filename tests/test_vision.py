"""Positions beyond one axis: the 2D and 3D encodings against independent oracles, and
the vision graphs (a patch stem in front of the encoder) compiled once for llvm and
checked against PyTorch at several image sizes.

Oracles: rotations as complex multiplications in numpy (not the module's own code), the
2D sin/cos and bicubic resize from their formulas, the relative bias from its table. The
relative encodings are shown translation-invariant per axis on compiled artifacts: a probe
graph (the encoding's scores, positions as an input) is compiled like a foreign ONNX file
and run at positions shifted along each axis."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import assert_parity
from portable_pe.spec.grid_encodings import (AxialRope2d, Learned2d, MRope, RelativeBias2d, RopeMixed,
                                             Sinusoidal2d, mrope_sections)

DATA = Path(__file__).parent / "data" / "vision"
VISION_SPECS = sorted(DATA.glob("*.toml"))


def grid(gh: int, gw: int, *, start=(0, 0)) -> torch.Tensor:
    """(gh, gw, 2) int64 positions (row, column), offset by `start`."""
    rows, cols = torch.meshgrid(torch.arange(gh) + start[0], torch.arange(gw) + start[1], indexing="ij")
    return torch.stack([rows, cols], dim=-1)


def rotate_complex(x: np.ndarray, angles: np.ndarray) -> np.ndarray:
    """The half-split pairs (x_i, x_{i+d/2}) of x (..., N, d) as complex numbers, turned by angles (..., N, d/2)."""
    h = x.shape[-1] // 2
    z = (x[..., :h] + 1j * x[..., h:]) * np.exp(1j * angles)
    return np.concatenate([z.real, z.imag], axis=-1)


def scores(pe, q, k, positions) -> np.ndarray:
    rq, rk = pe.rotate(q, k, positions)
    return (rq @ rk.transpose(-1, -2)).detach().numpy()


# ---------------------------------------------------------------------------------- oracles
def test_rope_2d_is_an_axial_rotation():
    torch.manual_seed(0)
    pe = AxialRope2d(head_dim=16, base=100.0)
    q, k = torch.randn(1, 2, 12, 16), torch.randn(1, 2, 12, 16)
    pos = grid(3, 4, start=(2, 5))
    theta = 100.0 ** (-np.arange(4) / 4)  # Dh/4 frequencies per axis
    p = pos.reshape(-1, 2).numpy()
    angles = np.concatenate([p[:, :1] * theta, p[:, 1:] * theta], axis=-1)  # rows drive the first half of the pairs
    got, _ = pe.rotate(q, k, pos)
    assert_parity({"q": rotate_complex(q.numpy(), angles).astype(np.float32)}, {"q": got.detach().numpy()},
                  tolerance="float32_abs")
    np.testing.assert_allclose(got.norm(dim=-1), q.norm(dim=-1), rtol=1e-5)  # a rotation keeps norms


@pytest.mark.parametrize("cls,kw", [(AxialRope2d, {"head_dim": 16}), (RopeMixed, {"head_dim": 16, "n_heads": 2}),
                                    (RelativeBias2d, {"n_heads": 2, "grid": [6, 6]})])
def test_relative_grid_encodings_depend_on_the_2d_offset_only(cls, kw):
    """Shifting every position by the same (dr, dc) leaves q·k (or the bias) as it was; a
    different offset between two patches changes it."""
    torch.manual_seed(0)
    pe = cls(**kw)
    q, k = torch.randn(1, 2, 12, 16), torch.randn(1, 2, 12, 16)
    values = (lambda pos: pe.bias(pos).detach().numpy()) if cls is RelativeBias2d else (lambda pos: scores(pe, q, k, pos))
    base = values(grid(3, 4))
    for shift in ((1, 0), (0, 3), (2, 5)):
        np.testing.assert_allclose(values(grid(3, 4, start=shift)), base, rtol=1e-4, atol=1e-5)
    transposed = grid(4, 3).permute(1, 0, 2)  # the same patches, rows and columns swapped: other offsets
    assert not np.allclose(values(transposed.reshape(3, 4, 2)), base, atol=1e-3)


def test_rope_mixed_mixes_the_axes_with_learned_frequencies():
    torch.manual_seed(0)
    pe = RopeMixed(n_heads=2, head_dim=8)
    q, k = torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    pos = grid(2, 3, start=(1, 1))
    f = pe.freqs.detach().numpy()  # (2, H, Dh/2): row and column frequencies per head and pair
    p = pos.reshape(-1, 2).numpy()
    angles = p[None, :, 0, None] * f[0][:, None] + p[None, :, 1, None] * f[1][:, None]  # (H, N, Dh/2)
    got, _ = pe.rotate(q, k, pos)
    assert_parity({"q": rotate_complex(q.numpy()[0], angles).astype(np.float32)}, {"q": got[0].detach().numpy()},
                  tolerance="float32_abs")
    assert np.all(f[1] != 0), "each head's frequencies should mix both axes"


def test_mrope_sections_and_equal_axes_give_1d_rope():
    from portable_pe.spec.encodings import Rotary
    assert mrope_sections(128) == [16, 24, 24]  # Qwen2-VL's
    torch.manual_seed(0)
    q, k = torch.randn(1, 2, 7, 16), torch.randn(1, 2, 7, 16)
    t = torch.arange(7) + 3
    three = torch.stack([t, t, t], dim=-1)  # (N, 3): every axis the same position
    got = MRope(head_dim=16).rotate(q, k, three)
    want = Rotary(head_dim=16).rotate(q, k, t)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy())
    # and each section follows its own axis
    pe = MRope(head_dim=16, sections=[2, 3, 3])
    pos = torch.stack([torch.arange(7), 2 * torch.arange(7), 5 + torch.arange(7)], dim=-1)
    theta = 10000.0 ** (-np.arange(0, 16, 2) / 16)
    axis = np.repeat([0, 1, 2], [2, 3, 3])
    angles = pos.numpy()[:, axis] * theta
    assert_parity({"q": rotate_complex(q.numpy(), angles).astype(np.float32)}, {"q": pe.rotate(q, k, pos)[0].detach().numpy()},
                  tolerance="float32_abs")


def test_sincos_2d_follows_its_formula_and_is_absolute():
    pe = Sinusoidal2d(d_model=16)
    pos = grid(3, 4, start=(1, 2))
    p = pos.reshape(-1, 2).numpy().astype(np.float64)
    w = 10000.0 ** (-np.arange(4) / 4)
    want = np.concatenate([np.sin(p[:, :1] * w), np.cos(p[:, :1] * w), np.sin(p[:, 1:] * w), np.cos(p[:, 1:] * w)], 1)
    assert_parity({"pe": want.astype(np.float32)}, {"pe": pe.table(pos).numpy()}, tolerance="float32_abs")
    assert not np.allclose(pe.table(grid(3, 4)).numpy(), pe.table(pos).numpy(), atol=1e-3)  # a shift changes it


def _bicubic(table: np.ndarray, size: int) -> np.ndarray:
    """Keys' cubic (a = -0.75), half-pixel centres, edges clamped, along axis 0: what
    align_corners=False bicubic resizing does per axis."""
    n = table.shape[0]
    a = -0.75

    def w(x):
        x = abs(x)
        return ((a + 2) * x - (a + 3)) * x * x + 1 if x <= 1 else ((a * x - 5 * a) * x + 8 * a) * x - 4 * a if x < 2 else 0.0
    out = []
    for o in range(size):
        src = (o + 0.5) * n / size - 0.5
        i0 = int(np.floor(src))
        t = src - i0
        out.append(sum(w(t - j) * table[min(max(i0 + j, 0), n - 1)] for j in (-1, 0, 1, 2)))
    return np.stack(out)


def test_learned_2d_is_its_table_at_the_base_grid_and_bicubic_elsewhere():
    torch.manual_seed(0)
    pe = Learned2d(d_model=4, grid=[3, 4])
    table = pe.table.detach().numpy()[0].transpose(1, 2, 0)  # (gh0, gw0, D)
    same = pe.resized(grid(3, 4))[0].detach().numpy()
    np.testing.assert_allclose(same, table.reshape(12, 4), atol=1e-6)
    want = _bicubic(_bicubic(table, 5).transpose(1, 0, 2), 7).transpose(1, 0, 2)  # rows to 5, columns to 7
    assert_parity({"pe": want.reshape(35, 4).astype(np.float32)}, {"pe": pe.resized(grid(5, 7))[0].detach().numpy()},
                  tolerance="float32_abs")


def test_rel_bias_2d_indexes_its_table_by_the_clamped_offset():
    torch.manual_seed(0)
    pe = RelativeBias2d(n_heads=2, grid=[2, 3])
    pos = grid(3, 4)
    p = pos.reshape(-1, 2).numpy()
    table = pe.table.detach().numpy()
    got = pe.bias(pos).detach().numpy()
    for m in range(12):
        for n in range(12):
            dr = np.clip(p[n, 0] - p[m, 0], -1, 1) + 1
            dc = np.clip(p[n, 1] - p[m, 1], -2, 2) + 2
            np.testing.assert_array_equal(got[:, m, n], table[dr * 5 + dc])


# ------------------------------------------------------------------- specs and their errors
@pytest.mark.parametrize("frames", [2, 6], ids=["one_frame_group", "three_frame_groups"])
def test_a_video_stem_built_for_one_size_is_its_conv3d_as_a_conv2d(frames):
    """Vela has no CONV_3D: a video stem fixed to one size (the Ethos-U path) runs its
    Conv3d as a Conv2d over stacked frames; the tokens and positions are the Conv3d's. No
    transpose of the pixels (Ethos-U55 refused one at 4x224x224, shape out of range)."""
    from portable_pe.spec.model import EncoderConfig
    from portable_pe.spec.vision import PatchStem, VisionConfig
    torch.manual_seed(0)
    stem = PatchStem(EncoderConfig(d_model=8, n_heads=2, n_layers=1, d_ff=16), VisionConfig(patch=4, temporal_patch=2))
    pixels = torch.randn(2, 3, frames, 8, 12)
    with torch.no_grad():
        want_tokens, want_positions = stem(pixels)
        stem.fix_positions(pixels[:1])
        got_tokens, got_positions = stem(pixels)
        traced = torch.export.export(stem, (pixels,)).graph_module.code
    assert "conv3d" not in traced and "conv2d" in traced, traced
    # one transpose: the tokens' (B, D, N) -> (B, N, D), none of the pixels or the grid
    assert traced.count("aten.transpose") + traced.count("aten.permute") == 1, traced
    assert torch.equal(got_positions, want_positions)
    torch.testing.assert_close(got_tokens, want_tokens, rtol=1e-5, atol=1e-5)


def test_a_grid_encoding_on_a_sequence_graph_is_refused_naming_the_axes(tmp_path):
    from portable_pe.spec.graphs import load_graph
    spec = tmp_path / "bad.toml"
    spec.write_text('name = "bad"\n[model]\nd_model = 32\nn_heads = 2\n[encoding]\nname = "rope_2d"\n')
    with pytest.raises(ValueError, match=r"encoding 'rope_2d' takes positions of 2 axes; a sequence graph .* has 1"):
        load_graph(spec)
    video = (DATA / "tiny_video_mrope.toml").read_text().replace('name = "mrope"', 'name = "rope_2d"')
    (tmp_path / "v.toml").write_text(video)
    with pytest.raises(ValueError, match=r"a video graph .* has 3: choose mrope"):
        load_graph(tmp_path / "v.toml")
    image = (DATA / "tiny_vit_rope_2d.toml").read_text().replace("example_size = [24, 32]", "example_size = [24, 30]")
    (tmp_path / "i.toml").write_text(image)
    with pytest.raises(ValueError, match=r"width 30 is not a multiple of its patch size 8"):
        load_graph(tmp_path / "i.toml")


# ----------------------------------------------------------------------- compiled artifacts
def _encoding_of(spec: Path) -> str:
    import tomllib
    return tomllib.loads(spec.read_text())["encoding"]["name"]


@pytest.mark.parametrize("spec", VISION_SPECS, ids=_encoding_of)
def test_every_vision_graph_compiles_once_and_matches_pytorch_at_three_sizes(spec, bundle_factory):
    """One llvm build with symbolic image dims, checked against PyTorch (the parity harness)
    at three sizes none of which is the export example's (a non-square one among them; the
    windowed graph's in whole 3 x 3-patch windows, one a single window high)."""
    from portable_pe.run.parity import check_bundle
    bundle = bundle_factory(spec)
    dims = bundle.manifest["dims"]
    windowed = _encoding_of(spec) == "window_rel_bias_2d"
    assert {"height", "width"} <= set(dims) and dims["height"]["multiple"] == (24 if windowed else 8)
    video = "frames" in dims
    sizes = [dict(zip(("frames", "height", "width") if video else ("height", "width"), s))
             for s in ([(4, 16, 40), (6, 32, 32), (2, 56, 24)] if video
                       else [(24, 48), (72, 72), (48, 24)] if windowed else [(16, 40), (32, 32), (56, 24)])]
    report = check_bundle(bundle, sizes=sizes)
    assert report.ok and len({r.length for r in report.rows}) == 3, report.to_markdown()
    assert {r.candidate for r in report.rows} == {"onnxruntime", "tvm"}


@pytest.mark.parametrize("spec", VISION_SPECS, ids=_encoding_of)
def test_simplified_vision_graphs_keep_one_table_and_one_stem(spec, bundle_factory):
    """The patch stem is one Conv and the encoding's tables are computed once (TABLE_OPS,
    test_pipeline.py), not per layer; the input's pixel dims stay symbolic."""
    import onnx
    from portable_pe.compile.simplify import op_counts
    from test_pipeline import TABLE_OPS
    bundle = bundle_factory(spec)
    model = onnx.load(str(bundle.file("model.onnx")))
    ops = op_counts(model)
    assert ops["Conv"] == 1
    for op, count in TABLE_OPS[_encoding_of(spec)].items():
        assert ops.get(op, 0) == count, f"{op}: {ops.get(op, 0)} != {count} ({ops})"
    (pixels,) = [[d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim] for vi in model.graph.input]
    assert pixels == ["batch", 3, *(["frames"] if "video" in spec.stem else []), "height", "width"]


def test_the_npu_target_pins_a_vision_graph_to_its_image_size_with_positions_folded():
    """--image-size fixes pixel_values for the NPU (checked before the vendor stage: no RKNN needed),
    and the fold leaves no op that computes positions at run time."""
    from portable_pe.compile.pipeline import prepare
    st = prepare(str(DATA / "tiny_vit_rope_2d.toml"), target="npu", through="legalize", log=lambda m: None,
                 target_options={"profile": "rknpu2", "image_size": [24, 16]})
    (pixels,) = [vi for vi in st.model.graph.input if vi.name == "pixel_values"]
    assert [d.dim_value for d in pixels.type.tensor_type.shape.dim] == [1, 3, 24, 16]
    ops = {n.op_type for n in st.model.graph.node}
    assert not ops & {"Sin", "Cos", "CumSum", "Range", "Shape"}, ops
    assert st.report["npu"]["fold"]["runtime_position_ops_left"] == {}


@pytest.mark.integration  # an NPU bundle's compile (29 s): with the vendor tests, keeping the default run short
def test_an_npu_vision_bundles_parity_is_at_its_image_size(bundle_factory):
    """Its one case is the pinned image (the spec's example size, 24x32), not a "length" read
    off its first pixel dim (the 3 channels, as the parity table once said)."""
    from portable_pe.run.parity import check_bundle
    bundle = bundle_factory(str(DATA / "tiny_vit_rope_2d.toml"), "npu", profile="rknpu2", vendor_build="skip")
    report = check_bundle(bundle)
    assert report.ok and {r.length for r in report.rows} == {"24x32"}, report.to_markdown()
    assert "| candidate | size |" in report.to_markdown()


def test_a_vision_bundle_refuses_an_image_that_is_not_whole_patches(bundle_factory):
    from portable_pe.run.local import InputError, LocalRunner
    runner = LocalRunner(bundle_factory(DATA / "tiny_vit_rope_2d.toml"))
    with pytest.raises(InputError, match=r"\(height\) is 20; it must be a multiple of the patch size 8"):
        runner.run({"pixel_values": np.zeros((1, 3, 20, 16), np.float32)})
    out = runner.run({"pixel_values": np.zeros((1, 3, 24, 16), np.float32)})
    assert out["hidden"].shape == (1, 2 + 3 * 2, 32)  # CLS + register + 3 x 2 patches


def test_compile_sizes_are_the_bundles_stored_reference_cases(tmp_path):
    """`compile --sizes` stores its reference at those sizes, so the bundle checks itself there
    on another machine (run_on_board.py, run here); a size the graph cannot take is refused
    naming --sizes, and nothing is written."""
    import subprocess
    import sys
    from portable_pe.compile.pipeline import compile_graph
    spec = str(DATA / "tiny_vit_rope_2d.toml")
    bundle = compile_graph(spec, target="llvm", out=tmp_path / "b", reference_sizes=("40x16", "32x56"),
                           log=lambda m: None)
    stored = sorted((c["sizes"]["height"], c["sizes"]["width"]) for c in bundle.manifest["reference"]["cases"])
    assert stored == [(32, 56), (40, 16)]
    proc = subprocess.run([sys.executable, str(bundle.file("run_on_board.py"))], capture_output=True, text=True)
    assert proc.returncode == 0 and "| tvm@board | 40x16 |" in proc.stdout and "| tvm@board | 32x56 |" in proc.stdout, \
        proc.stdout + proc.stderr
    with pytest.raises(Exception, match=r"--sizes 20x16: height 20 is not a multiple"):
        compile_graph(spec, target="llvm", out=tmp_path / "bad", reference_sizes=("20x16",), log=lambda m: None)
    assert not (tmp_path / "bad").exists()


def _probe(pe, kind: str, n_rows: int, n_cols: int, axes: int = 2):
    """A torch module computing the encoding's scores (rotary: q·k, bias: the bias, absolute:
    (x + pe)(x + pe)ᵀ) from fixed content and positions given as an input."""
    torch.manual_seed(1)
    n = n_rows * n_cols
    q, k, x = torch.randn(1, 2, n, 16), torch.randn(1, 2, n, 16), torch.randn(1, n, 16)

    class Probe(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.pe = pe  # a submodule: its learned tables export as weights

        def forward(self, positions):  # (N, A)
            if kind == "rotary":
                rq, rk = self.pe.rotate(q, k, positions)
                return rq @ rk.transpose(-1, -2)
            if kind == "bias":
                return self.pe.bias(positions)
            y = self.pe.embed(x, positions)
            return y @ y.transpose(-1, -2)
    return Probe().eval()


PROBES = [pytest.param(AxialRope2d(head_dim=16), "rotary", True, id="rope_2d"),
          pytest.param(RopeMixed(n_heads=2, head_dim=16), "rotary", True, id="rope_mixed"),
          pytest.param(MRope(head_dim=16), "rotary", True, id="mrope"),
          pytest.param(RelativeBias2d(n_heads=2, grid=[6, 6]), "bias", True, id="rel_bias_2d"),
          pytest.param(Sinusoidal2d(d_model=16), "absolute", False, id="sincos_2d")]


@pytest.mark.parametrize("pe,kind,relative", PROBES)
def test_translation_invariance_holds_on_the_compiled_artifact_for_relative_encodings_only(
        pe, kind, relative, tmp_path):
    """The probe exported to ONNX and compiled by portable-pe for llvm; its positions shifted
    along each axis: the relative encodings' scores stay (within float32 rounding), the
    absolute one's move."""
    from portable_pe.compile.pipeline import compile_graph
    from portable_pe.run.local import LocalRunner
    axes = 3 if isinstance(pe, MRope) else 2
    probe = _probe(pe, kind, 3, 4, axes)
    base = grid(3, 4).reshape(12, 2)
    if axes == 3:
        base = torch.cat([torch.zeros(12, 1, dtype=torch.int64), base], dim=1)
    with torch.no_grad():
        torch.onnx.export(probe, (base,), str(tmp_path / "probe.onnx"), dynamo=False, opset_version=17,
                          input_names=["positions"], output_names=["scores"])
    bundle = compile_graph(str(tmp_path / "probe.onnx"), target="llvm", out=tmp_path / "b", log=lambda m: None)
    runner = LocalRunner(bundle)
    at = {}
    for shift in [(0,) * axes, *(tuple(5 if a == i else 0 for a in range(axes)) for i in range(axes))]:
        positions = (base + torch.tensor(shift)).numpy()
        at[shift] = runner.run({"positions": positions})["scores"]
        with torch.no_grad():
            assert_parity({"scores": probe(torch.from_numpy(positions)).numpy()}, {"scores": at[shift]})
    first = at[(0,) * axes]
    for shift, got in at.items():
        same = np.allclose(got, first, rtol=1e-4, atol=1e-4 * np.abs(first).max())
        assert same == (relative or shift == (0,) * axes), f"shift {shift}: max diff {np.abs(got - first).max():.3g}"


def test_an_int8_vision_build_calibrates_at_image_sizes_and_matches_pytorch(bundle_factory):
    """--precision int8 on llvm: the calibration feeds are images of several sizes (a
    vision graph has no sequence length to spread them over; it failed with a division
    by zero), and the build passes the int8 row against PyTorch at three sizes, its cosine
    no worse than onnxruntime's int8 of the same QDQ graph by more than 1e-6."""
    from portable_pe.quant.calibration import CALIBRATION_GRIDS
    from portable_pe.run.parity import check_bundle
    bundle = bundle_factory(str(DATA / "tiny_vit_rope_2d.toml"), precision="int8")
    q = bundle.manifest["quantization"]
    assert q["matmuls_int8"] > 0 and "calibration_lengths" not in q
    assert len(q["calibration_sizes"]) == len(q["calibration_shapes"]) >= 3, q
    heights = [shape["pixel_values"][2] for shape in q["calibration_shapes"]]
    assert heights == sorted(heights) and heights[0] == CALIBRATION_GRIDS[0][0] * 8, heights  # patch 8
    sizes = [{"height": h, "width": w} for h, w in [(16, 40), (32, 32), (56, 24)]]
    report = check_bundle(bundle, sizes=sizes)
    assert report.ok, report.to_markdown()
    rows = {(r.candidate, r.length): r for r in report.rows}
    for (candidate, case), row in rows.items():
        if candidate == "tvm":
            assert row.cosine >= rows[("onnxruntime", case)].cosine - 1e-6, report.to_markdown()
