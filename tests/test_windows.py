"""Window attention (Swin v1, window_rel_bias_2d): the encoder's windowed, shifted blocks
against an independent numpy oracle written from Swin's recipe (np.roll, the region labels
of its attention mask, the relative index of each window's patches), and the compiled bias:
translation-invariant within a window, -100 on the pairs a shift joins across the image's
edges. The whole graph's parity at several sizes is test_vision.py's (tests/data/vision/)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import assert_parity
from portable_pe.spec.grid_encodings import WindowRelativeBias2d
from portable_pe.spec.model import EncoderConfig

#: the tiny Swin sits with the other vision specs: test_vision.py compiles it at three sizes
DATA = Path(__file__).parent / "data" / "vision"


# ------------------------------------------------------------------------------- the oracle
def swin_regions(gh: int, gw: int, window: int, shift: int) -> np.ndarray:
    """Swin's img_mask: a label per patch of the rolled grid, by slices, on each axis that
    has more than one window (Swin shifts only a grid larger than a window)."""
    labels = np.zeros((gh, gw), np.int64)
    count = 0
    rows = (slice(0, -window), slice(-window, -shift), slice(-shift, None)) if shift and gh > window else (slice(None),)
    cols = (slice(0, -window), slice(-window, -shift), slice(-shift, None)) if shift and gw > window else (slice(None),)
    for r in rows:
        for c in cols:
            labels[r, c] = count
            count += 1
    return labels


def swin_attention(x: np.ndarray, attn, table: np.ndarray, *, window: int, shift: int, n_heads: int) -> np.ndarray:
    """Swin's (shifted) window attention of x (gh, gw, D) in float64: roll, per window
    q·kᵀ/√d + table[(dr + W - 1)(2W - 1) + dc + W - 1] (dr, dc: key - query inside the
    window) + the region mask, softmax, ·v, roll back, the output projection."""
    w = {n: getattr(attn, n).weight.detach().double().numpy() for n in ("q", "k", "v", "proj")}
    b = {n: getattr(attn, n).bias.detach().double().numpy() for n in ("q", "k", "v", "proj")}
    gh, gw, d = x.shape
    sr, sc = (shift if gh > window else 0), (shift if gw > window else 0)
    rolled = np.roll(x, (-sr, -sc), axis=(0, 1))
    regions = swin_regions(gh, gw, window, shift)
    local = np.stack(np.meshgrid(np.arange(window), np.arange(window), indexing="ij"), -1).reshape(-1, 2)
    rel = local[None, :, :] - local[:, None, :]  # (T, T, 2): key - query
    bias = table[(rel[..., 0] + window - 1) * (2 * window - 1) + rel[..., 1] + window - 1].transpose(2, 0, 1)
    out = np.zeros_like(rolled)
    dh = d // n_heads
    for r0 in range(0, gh, window):
        for c0 in range(0, gw, window):
            t = rolled[r0:r0 + window, c0:c0 + window].reshape(-1, d)  # (T, D)
            q, k, v = ((t @ w[n].T + b[n]).reshape(-1, n_heads, dh).transpose(1, 0, 2) for n in "qkv")
            label = regions[r0:r0 + window, c0:c0 + window].reshape(-1)
            mask = np.where(label[:, None] != label[None, :], -100.0, 0.0)
            logits = q @ k.transpose(0, 2, 1) / np.sqrt(dh) + bias + mask  # (H, T, T)
            p = np.exp(logits - logits.max(-1, keepdims=True))
            y = (p / p.sum(-1, keepdims=True)) @ v  # (H, T, Dh)
            out[r0:r0 + window, c0:c0 + window] = y.transpose(1, 0, 2).reshape(window, window, d)
    return np.roll(out, (sr, sc), axis=(0, 1)) @ w["proj"].T + b["proj"]


def _layer_norm(x: np.ndarray, norm) -> np.ndarray:
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + norm.eps) * norm.weight.detach().double().numpy() + norm.bias.detach().double().numpy()


@pytest.mark.parametrize("static", [False, True], ids=["gathers", "static_reshapes"])
@pytest.mark.parametrize("window,grid", [(3, (6, 9)), (3, (3, 6)), (4, (8, 8)), (4, (12, 4))],
                         ids=[f"window_rel_bias_2d-{w}" for w in ("3x3-grid_2x3", "3x3-grid_1x2", "4x4-grid_2x2", "4x4-grid_3x1")])
def test_window_blocks_match_swins_recipe(window, grid, static):
    """A 2-block encoder (the second shifted by W // 2), MLPs zeroed so a block is
    x + attention(norm(x)): each block's output against the oracle, at grids with one
    window along an axis (Swin shifts nothing there) and several; with the windows cut by
    index gathers (any size) and by the static reshapes and slices of a build for one size
    (the Ethos-U path, which has no GATHER_ND)."""
    from portable_pe.spec.vision import VisionConfig, VisionEncoder
    torch.manual_seed(0)
    cfg = EncoderConfig(d_model=16, n_heads=2, n_layers=2, d_ff=32)
    pe = WindowRelativeBias2d(n_heads=2, window=window)
    with torch.no_grad():
        pe.table.normal_(0, 1.0)  # a bias big enough to matter
    model = VisionEncoder(cfg, VisionConfig(patch=1, cls_tokens=0), pe).eval()
    gh, gw = grid
    positions = torch.stack(torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij"), -1)
    x = torch.randn(1, gh * gw, 16)
    table = pe.table.detach().double().numpy()
    for block, shift in zip(model.blocks, (0, window // 2)):
        block.static_sides = grid if static else None
        with torch.no_grad():
            block.mlp.down.weight.zero_()
            block.mlp.down.bias.zero_()
            got = block(x, positions, pe).numpy()
        assert block.shift == shift
        xs = x[0].double().numpy()
        want = xs + swin_attention(_layer_norm(xs, block.norm1).reshape(gh, gw, 16), block.attn, table,
                                   window=window, shift=shift, n_heads=2).reshape(gh * gw, 16)
        assert_parity({"hidden": want.astype(np.float32)}, {"hidden": got[0]}, tolerance="float32_abs")


def test_the_oracle_can_tell_a_shift_and_a_mask_apart():
    """The oracle's shifted output differs from its unshifted one, and from a shift without
    the mask: so the parity above checks both."""
    torch.manual_seed(0)
    cfg = EncoderConfig(d_model=16, n_heads=2, n_layers=1, d_ff=32)
    from portable_pe.spec.model import Attention
    attn = Attention(cfg)
    table = np.random.default_rng(0).normal(size=(25, 2))
    x = np.random.default_rng(1).normal(size=(6, 6, 16))
    plain = swin_attention(x, attn, table, window=3, shift=0, n_heads=2)
    shifted = swin_attention(x, attn, table, window=3, shift=1, n_heads=2)
    assert not np.allclose(plain, shifted, atol=1e-3)
    labels = swin_regions(6, 6, 3, 1)
    assert sorted(np.unique(labels)) == list(range(9)) and labels[0, 0] == 0 and labels[5, 5] == 8


# --------------------------------------------------------------------------- the bias hook
def in_windows(labels: np.ndarray, window: int) -> np.ndarray:
    """(gh, gw) -> (nW, W * W): the windows row-major, each window's patches row-major."""
    gh, gw = labels.shape
    cells = labels.reshape(gh // window, window, gw // window, window).transpose(0, 2, 1, 3)
    return cells.reshape(-1, window * window)


def window_positions(gh: int, gw: int, window: int, shift: int) -> torch.Tensor:
    """(nW, W * W, 2) the image positions of each (shifted) window's patches, from np.roll."""
    grid = np.stack(np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij"), -1)
    rolled = np.roll(grid, (-shift, -shift), axis=(0, 1))
    cells = rolled.reshape(gh // window, window, gw // window, window, 2).transpose(0, 2, 1, 3, 4)
    return torch.from_numpy(cells.reshape(-1, window * window, 2).copy())


def test_the_bias_is_the_table_inside_a_region_and_swins_mask_across():
    torch.manual_seed(0)
    pe = WindowRelativeBias2d(n_heads=2, window=3)
    table = pe.table.detach().numpy()
    got = pe.bias(window_positions(6, 9, 3, 1)).detach().numpy()  # (6, H, 9, 9)
    regions = in_windows(swin_regions(6, 9, 3, 1), 3)
    local = np.stack(np.meshgrid(np.arange(3), np.arange(3), indexing="ij"), -1).reshape(9, 2)
    masked = 0
    for w in range(6):
        for m in range(9):
            for n in range(9):
                dr, dc = local[n] - local[m]
                if regions[w, m] == regions[w, n]:
                    np.testing.assert_array_equal(got[w, :, m, n], table[(dr + 2) * 5 + dc + 2])
                else:  # Swin's -100 on a table entry (Swin's: the offset in the window; here another, as exp() is 0 either way)
                    masked += 1
                    assert np.all(np.abs(got[w, :, m, n] + 100.0) < 1.0)
    assert masked == 3 * (81 - 6 * 6 - 3 * 3) + (81 - 4 * 4 - 2 * 2 - 2 * 2 - 1)  # 3 windows cut in 2 regions, 1 in 4
    with pytest.raises(ValueError, match=r"shift must be in 0\.\.2"):
        WindowRelativeBias2d(n_heads=2, window=3, shift=3)


# ---------------------------------------------------------------------------------- the specs
def test_window_graphs_refuse_prefix_tokens_and_sizes_that_are_not_whole_windows(tmp_path):
    from portable_pe.spec.graphs import load_graph
    text = (DATA / "tiny_swin_rel_bias_2d.toml").read_text()
    (tmp_path / "cls.toml").write_text(text.replace("cls_tokens = 0", "cls_tokens = 1"))
    with pytest.raises(ValueError, match=r"window attention \(Swin\) takes image patches only: set vision.cls_tokens = 0"):
        load_graph(tmp_path / "cls.toml")
    (tmp_path / "size.toml").write_text(text.replace("example_size = [48, 72]", "example_size = [48, 64]"))
    with pytest.raises(ValueError, match=r"width 64 is not a multiple of 24 \(whole windows: 3 patches of 8 pixels\)"):
        load_graph(tmp_path / "size.toml")
    hybrid = text.replace('name = "window_rel_bias_2d"\nwindow = 3',
                          'name = "hybrid"\nlayers = ["window_rel_bias_2d", "rope_2d"]')
    (tmp_path / "hybrid.toml").write_text(hybrid)
    with pytest.raises(ValueError, match=r"hybrid layers cannot mix window attention"):
        load_graph(tmp_path / "hybrid.toml")


def test_window_pixel_dims_are_whole_windows_and_the_runtime_says_so():
    """The manifest's pixel dims (io_names.pixel_bounds): a multiple of patch x window, the
    patch kept; the runtime's input check and --sizes name the window."""
    from portable_pe.run.local import InputError, check_inputs
    from portable_pe.run.parity import size_error
    from portable_pe.spec.graphs import load_graph
    from portable_pe.spec.io_names import pixel_bounds
    dims = pixel_bounds(load_graph(DATA / "tiny_swin_rel_bias_2d.toml"))
    assert dims["width"] == {"role": "width", "min": 24, "max": 240, "multiple": 24, "patch": 8}
    assert pixel_bounds(load_graph("swin_rel_bias_2d"))["height"]["multiple"] == 112  # 16-pixel patches, window 7
    manifest = {"inputs": [{"name": "pixel_values", "dtype": "float32", "dims": ["batch", 3, "height", "width"]}],
                "dims": {"batch": {"role": "batch", "min": 1, "max": 8}, **dims}}
    with pytest.raises(InputError, match=r"\(width\) is 32; it must be a multiple of 24 \(whole windows: 3 patches "
                                         r"of 8 pixels\) \(e\.g\. 24 or 48\)"):
        check_inputs(manifest, {"pixel_values": np.zeros((1, 3, 24, 32), np.float32)})
    check_inputs(manifest, {"pixel_values": np.zeros((1, 3, 24, 48), np.float32)})
    assert size_error(manifest, {"height": 24, "width": 32}) == \
        "width 32 is not a multiple of 24 (whole windows: 3 patches of 8 pixels)"


# ------------------------------------------------------------------------ compiled artifacts
class _BiasProbe(torch.nn.Module):
    def __init__(self, pe):
        super().__init__()
        self.pe = pe

    def forward(self, positions):  # (nW, T, 2)
        return self.pe.bias(positions)


def test_the_compiled_bias_is_translation_invariant_in_a_window_and_masks_a_shifted_windows_regions(tmp_path):
    """The bias hook exported with its positions as an input and compiled by portable-pe for
    llvm: an unshifted window moved along each axis gives the same bias; the windows of a
    shifted grid get -100 exactly on the pairs of different regions (Swin's labels)."""
    from portable_pe.compile.pipeline import compile_graph
    from portable_pe.run.local import LocalRunner
    torch.manual_seed(0)
    probe = _BiasProbe(WindowRelativeBias2d(n_heads=2, window=3)).eval()
    base = window_positions(6, 9, 3, 0)  # 6 windows, none shifted
    with torch.no_grad():
        torch.onnx.export(probe, (base,), str(tmp_path / "probe.onnx"), dynamo=False, opset_version=17,
                          input_names=["positions"], output_names=["bias"], dynamic_axes={"positions": {0: "windows"}})
    runner = LocalRunner(compile_graph(str(tmp_path / "probe.onnx"), target="llvm", out=tmp_path / "b", log=lambda m: None))
    first = runner.run({"positions": base[:1].numpy()})["bias"]
    for shift in ((3, 0), (0, 6), (5, 1)):
        got = runner.run({"positions": (base[:1] + torch.tensor(shift)).numpy()})["bias"]
        np.testing.assert_array_equal(got, first)
    every = runner.run({"positions": base.numpy()})["bias"]
    np.testing.assert_array_equal(every, np.broadcast_to(first, every.shape))  # the same bias in every window
    assert np.all(every > -50)  # unshifted: nothing masked

    shifted = window_positions(6, 9, 3, 1)
    got = runner.run({"positions": shifted.numpy()})["bias"]
    with torch.no_grad():
        assert_parity({"bias": probe(shifted).numpy()}, {"bias": got})
    labels = in_windows(swin_regions(6, 9, 3, 1), 3)
    apart = np.broadcast_to((labels[:, :, None] != labels[:, None, :])[:, None], got.shape)  # (nW, H, T, T)
    assert not apart[0].any() and apart[-1].all(axis=0).sum() == 9 * 9 - 4 * 4 - 2 * 2 - 2 * 2 - 1
    same = np.broadcast_to(first, got.shape)
    np.testing.assert_array_equal(got[~apart], same[~apart])  # a region's pairs: the table at their offset
    assert np.all(np.abs(got[apart] + 100.0) < 1.0)  # across regions: Swin's -100 (on a table entry)
