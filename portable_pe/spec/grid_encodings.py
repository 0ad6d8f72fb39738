"""Position encodings of patch grids: 2D (image patches: row, column) and 3D (video
patches: frame, row, column), behind the same three hooks as the 1D ones (encodings.py).

Their positions are an int64 tensor of shape (*grid, A): one entry per patch, A axes per
entry (A = `axes`), so an encoding sees the grid's shape (a learned table resized to it)
and N = prod(grid) patch tokens. Prefix tokens (CLS, registers) are not in it: the
encoder applies the hooks to the patch tokens only, as DINOv3 and Pixtral do.

    embed(x, positions)      x: (B, N, D)        absolute: 2D sin/cos, learned 2D table
    rotate(q, k, positions)  q, k: (B, H, N, Dh)  rotary: axial 2D RoPE, RoPE-Mixed, M-RoPE
    bias(positions)          -> (H, N, N)         relative: 2D relative position bias
                             -> (*win, H, T, T)   windowed (Swin): positions (*win, T, 2) per window

The rotary and relative ones depend on positions only through differences, per axis:
q(m)·k(n) (or the bias) is a function of m - n, which tests check on the compiled model.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .position import PositionEncoding


def _flat(positions: torch.Tensor) -> torch.Tensor:
    return positions.flatten(0, -2)  # (*grid, A) -> (N, A)


def _frequencies(n: int, base: float) -> torch.Tensor:
    """base^(-i / n) for i < n, computed in float64: the per-axis frequencies of the 2D
    encodings (RoPE's theta over one axis's pairs, sin/cos's omega over its channels)."""
    return (base ** (-torch.arange(n, dtype=torch.float64) / n)).float()


def _rotate_half(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x_i, x_{i+d/2}) by the angles whose cos/sin are given, (..., N, d/2)."""
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class AxialRope2d(PositionEncoding):
    """Axial 2D RoPE (DINOv3, Pixtral): the head's rotary pairs are split in two, the first
    half rotated by the patch row, the second by its column, each with the frequencies
    theta_j = base^(-j / (Dh/4)). A rotation per axis, so q(m)·k(n) depends on the 2D
    offset m - n only."""

    axes = 2

    def __init__(self, *, head_dim: int, base: float = 100.0):
        super().__init__()
        if head_dim % 4:
            raise ValueError(f"rope_2d splits the head dim into row and column pairs: it must be a multiple of 4, "
                             f"got {head_dim}")
        self.register_buffer("theta", _frequencies(head_dim // 4, base), persistent=False)  # (Dh/4,)

    def angles(self, positions):
        p = _flat(positions).to(torch.float32)  # (N, 2)
        return torch.cat([p[:, 0:1] * self.theta, p[:, 1:2] * self.theta], dim=-1)  # (N, Dh/2)

    def rotate(self, q, k, positions):
        angles = self.angles(positions)
        cos, sin = angles.cos(), angles.sin()
        return _rotate_half(q, cos, sin), _rotate_half(k, cos, sin)


class RopeMixed(PositionEncoding):
    """RoPE-Mixed (Heo et al., 2024): learned frequencies per head and pair, mixing both
    axes: angle = row * f_row[h, i] + col * f_col[h, i]. Initialized as in the paper: the
    1D frequencies, each head's turned by a random angle. Still linear in the position, so
    still a function of the 2D offset only."""

    axes = 2

    def __init__(self, *, n_heads: int, head_dim: int, base: float = 100.0):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"rope_mixed rotates pairs: the head dim must be even, got {head_dim}")
        magnitude = _frequencies(head_dim // 2, base)  # (Dh/2,)
        turn = torch.rand(n_heads, 1) * 2 * math.pi  # (H, 1)
        self.freqs = nn.Parameter(torch.stack([magnitude * turn.cos(), magnitude * turn.sin()]))  # (2, H, Dh/2)

    def angles(self, positions):
        p = _flat(positions).to(torch.float32)  # (N, 2)
        return p[:, 0, None, None] * self.freqs[0] + p[:, 1, None, None] * self.freqs[1]  # (N, H, Dh/2)

    def rotate(self, q, k, positions):
        angles = self.angles(positions).transpose(0, 1)  # (H, N, Dh/2)
        cos, sin = angles.cos(), angles.sin()
        return _rotate_half(q, cos, sin), _rotate_half(k, cos, sin)


def mrope_sections(head_dim: int) -> list[int]:
    """Qwen2-VL's split of the Dh/2 rotary pairs into (time, height, width) sections:
    [16, 24, 24] for Dh = 128, i.e. a quarter for time and the rest halved."""
    half = head_dim // 2
    spatial = (half - half // 4) // 2
    return [half - 2 * spatial, spatial, spatial]


class MRope(PositionEncoding):
    """M-RoPE (Qwen2-VL): 1D RoPE's frequencies theta_i = base^(-2i/Dh) over the Dh/2 pairs
    (half-split layout), each pair rotated by the position on its section's axis: the first
    `sections[0]` pairs by the frame, the next `sections[1]` by the row, the rest by the
    column. With the three axes equal it is exactly 1D RoPE."""

    axes = 3

    def __init__(self, *, head_dim: int, base: float = 10000.0, sections: list[int] | None = None):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"mrope rotates pairs: the head dim must be even, got {head_dim}")
        sections = list(sections) if sections is not None else mrope_sections(head_dim)
        if len(sections) != 3 or any(s < 0 for s in sections) or sum(sections) != head_dim // 2:
            raise ValueError(f"mrope sections must be 3 non-negative counts of rotary pairs summing to head_dim / 2 "
                             f"= {head_dim // 2} (time, height, width), got {sections}")
        theta = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        self.register_buffer("theta", theta.float(), persistent=False)  # (Dh/2,)
        # axis of each pair, as a one-hot (Dh/2, 3): the angle is positions (N, 3) @ select * theta
        select = torch.zeros(head_dim // 2, 3)
        select[torch.arange(head_dim // 2), torch.repeat_interleave(torch.arange(3), torch.tensor(sections))] = 1.0
        self.register_buffer("select", select, persistent=False)
        self.sections = sections

    def angles(self, positions):
        p = _flat(positions).to(torch.float32)  # (N, 3)
        return (p @ self.select.T) * self.theta  # (N, Dh/2)

    def rotate(self, q, k, positions):
        angles = self.angles(positions)
        cos, sin = angles.cos(), angles.sin()
        return _rotate_half(q, cos, sin), _rotate_half(k, cos, sin)


class Sinusoidal2d(PositionEncoding):
    """2D sin/cos (MAE): half the channels encode the row, half the column, each half as
    [sin(p * w_i), cos(p * w_i)] with w_i = base^(-i / (D/4)). Absolute: added to the
    patch embeddings."""

    axes = 2

    def __init__(self, *, d_model: int, base: float = 10000.0):
        super().__init__()
        if d_model % 4:
            raise ValueError(f"sincos_2d gives each axis half the channels as sin/cos pairs: d_model must be a "
                             f"multiple of 4, got {d_model}")
        self.register_buffer("omega", _frequencies(d_model // 4, base), persistent=False)  # (D/4,)

    def table(self, positions):
        p = _flat(positions).to(torch.float32)  # (N, 2)
        rows, cols = p[:, 0:1] * self.omega, p[:, 1:2] * self.omega  # (N, D/4)
        return torch.cat([rows.sin(), rows.cos(), cols.sin(), cols.cos()], dim=-1)  # (N, D)

    def embed(self, x, positions):
        return x + self.table(positions)


class Learned2d(PositionEncoding):
    """A learned table for a base grid (ViT, DINOv2), resized to the image's grid by bicubic
    interpolation (align_corners=False, as timm and transformers' interpolate_pos_encoding
    do). At the base grid the resize is the identity. The resize sits in the graph, so one
    dynamic build serves every resolution; an NPU build folds it per resolution."""

    axes = 2

    def __init__(self, *, d_model: int, grid: list[int] | None = None):
        super().__init__()
        grid = list(grid) if grid is not None else [14, 14]
        if len(grid) != 2 or min(grid) < 1:
            raise ValueError(f"learned_2d grid must be [rows, columns] of the base patch grid, got {grid}")
        self.grid = grid
        self.table = nn.Parameter(torch.randn(1, d_model, *grid) * 0.02)  # (1, D, gh0, gw0)

    def resized(self, positions):
        size = positions.shape[:2]  # the image's (gh, gw)
        table = F.interpolate(self.table, size=size, mode="bicubic", align_corners=False)  # (1, D, gh, gw)
        return table.flatten(2).transpose(1, 2)  # (1, N, D)

    def embed(self, x, positions):
        return x + self.resized(positions)


class RelativeBias2d(PositionEncoding):
    """2D relative position bias (BEiT; Swin within a window): a learned per-head bias per
    2D offset (d_row, d_col), a table of (2 gh0 - 1) x (2 gw0 - 1) rows for offsets up to
    the base grid; larger offsets use the table's edge (clamped, as T5 clamps distances)."""

    axes = 2

    def __init__(self, *, n_heads: int, grid: list[int] | None = None):
        super().__init__()
        grid = list(grid) if grid is not None else [14, 14]
        if len(grid) != 2 or min(grid) < 1:
            raise ValueError(f"rel_bias_2d grid must be [rows, columns] of the largest offsets' grid, got {grid}")
        self.grid = grid
        self.table = nn.Parameter(torch.randn((2 * grid[0] - 1) * (2 * grid[1] - 1), n_heads) * 0.02)

    def index(self, positions):
        p = _flat(positions)  # (N, 2)
        return self.offset_index(p[None, :, :] - p[:, None, :])  # (N, N)

    def offset_index(self, offset):
        """The table row of each 2D offset (..., 2), key - query, clamped to the table."""
        rows = offset[..., 0].clamp(-(self.grid[0] - 1), self.grid[0] - 1) + (self.grid[0] - 1)
        cols = offset[..., 1].clamp(-(self.grid[1] - 1), self.grid[1] - 1) + (self.grid[1] - 1)
        return rows * (2 * self.grid[1] - 1) + cols

    def bias(self, positions):
        return self.table[self.index(positions)].permute(2, 0, 1)  # (H, N, N)


#: Swin's mask: what a pair in one window but not one region of the image adds to its logit
WINDOW_MASK = -100.0


class WindowRelativeBias2d(RelativeBias2d):
    """Swin v1: attention within windows of window x window patches, a learned per-head bias
    per 2D offset inside a window (a table of (2W - 1)^2 rows), and every other block's
    windows shifted cyclically by `shift` patches (W // 2) along both axes. The encoder cuts
    the tokens into windows (spec/windows.py); the bias hook sees each window's patches,
    positions (*windows, W * W, 2) in the image, and returns (*windows, H, W * W, W * W).

    A shifted window joins patches from opposite edges of the image; Swin masks the pairs
    that come from different regions. Such a pair is further apart in the image than a
    window (by at least grid - W + 1) on some axis, and a pair of one region is not, so the
    bias masks exactly the pairs whose offset does not fit a window: a function of the 2D
    offset only, like the table (a masked pair adds -100 to the entry of its clamped offset,
    Swin's to that of its offset in the window: both weigh exp(-100) after the softmax).
    Along an axis of a single window nothing is masked, the roll only reorders that axis:
    no shift, as Swin has none at a one-window grid (Swin drops it on both axes at once).
    Offsets are key - query, as rel_bias_2d's; Swin's tables index query - key (flipped)."""

    axes = 2

    def __init__(self, *, n_heads: int, window: int = 7, shift: int | None = None):
        super().__init__(n_heads=n_heads, grid=[window, window])
        shift = window // 2 if shift is None else shift
        if not 0 <= shift < window:
            raise ValueError(f"window_rel_bias_2d shift must be in 0..{window - 1} (less than the window), got {shift}")
        self.window, self.shift = window, shift

    def bias(self, positions):  # (*windows, T, 2): each window's patches
        offset = positions[..., None, :, :] - positions[..., :, None, :]  # (*windows, T, T, 2): key - query
        bias = self.table[self.offset_index(offset)]  # (*windows, T, T, H)
        lead = bias.dim() - 3
        bias = bias.permute(*range(lead), lead + 2, lead, lead + 1)  # (*windows, H, T, T)
        apart = (offset.abs() >= self.window).any(dim=-1)  # (*windows, T, T): not one region of the image
        return bias + torch.where(apart, WINDOW_MASK, 0.0).unsqueeze(-3)


GRID_ENCODINGS: dict[str, type[PositionEncoding]] = {
    "rope_2d": AxialRope2d,
    "rope_mixed": RopeMixed,
    "mrope": MRope,
    "sincos_2d": Sinusoidal2d,
    "learned_2d": Learned2d,
    "rel_bias_2d": RelativeBias2d,
    "window_rel_bias_2d": WindowRelativeBias2d,
}
