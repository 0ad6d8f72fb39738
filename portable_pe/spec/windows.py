"""Window attention (Swin v1): the patch grid cut into windows of W x W patches, each block
attending within its windows, every other block's windows shifted cyclically by `shift`.

    tokens (B, gh * gw, D) -> gathered into windows (B, gh / W * (gw / W), W * W, D)
      -> the block -> gathered back, (B, gh * gw, D)

Both moves are one gather each, with indices computed in the graph from the patch grid's
positions; the shift is folded into them (window-major slot -> the row-major patch that the
rolled grid puts there, and back). Cutting the grid with reshapes and transposes instead
(B, gh, gw, D) -> (B, gh/W, W, gw/W, W, D) -> ... gives TVM 6-D reshapes whose index
arithmetic divides by one symbolic dim after another: LLVM's code generation spent minutes
to over half an hour simplifying a single such kernel. A gather's index is the tensor's
values, not shape arithmetic; the reshapes left only split or merge one axis (tokens <->
windows x W * W). The tokens and the bias's positions are gathered by the same index tensor,
so their window counts are one dim for TVM (legalize writes floor(H/8) * floor(W/8) / 9 as
floor(H/24) * floor(W/24), dimexpr.py); the blocks' tensors stay rank 4 (rank 5 once split
into heads), as the NPUs need.

The grid's sides must be whole windows (the graph's pixel dims are multiples of patch * W).
The window counts are read off a tensor of that shape (a strided slice of the positions,
not gh // W, which tracing would fix to the example's), so they stay expressions of the
image's height and width through ONNX and TVM's importer; the grid's sides used in index
arithmetic are values (the positions' maxima + 1), for the same reason.

Built for one static size (VisionEncoder.fix_positions, the Ethos-U path), the gathers'
indices are constants, but Vela has no GATHER_ND ("Unsupported opType": 8 ops of a 4-block
Swin on the CPU). There the sides are known numbers, so the moves are written as the NPU
wants them: the roll as two slices concatenated, the partition as reshapes around one
rank-4 transpose (static_windows, static_tokens), the same permutation of the tokens.
"""

from __future__ import annotations

import torch

from .model import Block, EncoderConfig
from .position import PositionEncoding


def _sides(positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """gh and gw as (1,) tensors: the largest row and column + 1 (positions (gh, gw, 2))."""
    return positions[:, 0, 0].amax(dim=0, keepdim=True) + 1, positions[0, :, 1].amax(dim=0, keepdim=True) + 1


def window_sources(positions: torch.Tensor, window: int, shift: int) -> torch.Tensor:
    """(gh / W * (gw / W), W * W) int64: for each window (row-major) and slot in it (row-major
    within the window), the row-major index of the patch there once the grid is rolled by
    `shift` patches towards the top left (Swin's torch.roll(x, -shift))."""
    gh, gw = _sides(positions)
    corners = positions[::window, ::window].flatten(0, 1)  # (windows, 2): each window's top-left patch
    slot = torch.arange(window * window, dtype=positions.dtype, device=positions.device)
    rows = (corners[:, :1] + slot // window + shift) % gh  # (windows, W * W)
    cols = (corners[:, 1:] + slot % window + shift) % gw
    return rows * gw + cols


def window_destinations(positions: torch.Tensor, window: int, shift: int) -> torch.Tensor:
    """(gh * gw,) int64: window_sources' inverse, for each row-major patch its index in the
    windows flattened (window-major, then slot)."""
    gh, gw = _sides(positions)
    rows = (positions[..., 0] - shift + gh) % gh  # (gh, gw): where the roll took each patch
    cols = (positions[..., 1] - shift + gw) % gw
    per_row = gw // window  # windows along a row
    window_index = (rows // window) * per_row + cols // window
    return (window_index * (window * window) + (rows % window) * window + cols % window).flatten()


def _roll(grid: torch.Tensor, shift: int) -> torch.Tensor:
    """torch.roll(grid, (-shift, -shift), dims=(1, 2)) as slices and concatenations
    (torch.export writes roll as an index gather)."""
    for axis in (1, 2):
        cut = shift % grid.shape[axis]
        if cut:
            grid = torch.cat([grid.narrow(axis, cut, grid.shape[axis] - cut), grid.narrow(axis, 0, cut)], dim=axis)
    return grid


def static_windows(x: torch.Tensor, sides: tuple[int, int], window: int, shift: int) -> torch.Tensor:
    """x (B, gh * gw, D) -> (B, windows, W * W, D), the tokens x[:, window_sources(...)]
    picks, for a grid of known sides. The partition's transpose is rank 4: the batch and
    the window row merge, as do a window's columns and the channels."""
    (gh, gw), (b, _, d) = sides, x.shape
    rolled = _roll(x.reshape(b, gh, gw, d), shift)
    cut = rolled.reshape(b * (gh // window), window, gw // window, window * d).transpose(1, 2)
    return cut.reshape(b, (gh // window) * (gw // window), window * window, d)


def static_tokens(y: torch.Tensor, sides: tuple[int, int], window: int, shift: int) -> torch.Tensor:
    """static_windows' inverse: (B, windows, W * W, D) -> (B, gh * gw, D)."""
    (gh, gw), (b, _, _, d) = sides, y.shape
    grid = y.reshape(b * (gh // window), gw // window, window, window * d).transpose(1, 2).reshape(b, gh, gw, d)
    return _roll(grid, -shift).reshape(b, gh * gw, d)


class WindowBlock(Block):
    """A Block run on each (shifted) window: Swin's block. Its norms, MLP and residuals act
    per token, so they commute with cutting the tokens into windows; only the attention
    sees the windows, as in Swin, where the partition sits around the attention alone."""

    def __init__(self, cfg: EncoderConfig, *, window: int, shift: int):
        super().__init__(cfg)
        self.window, self.shift = window, shift
        self.static_sides: tuple[int, int] | None = None  # (gh, gw) once built for one size (fix_positions)

    def forward(self, x, positions, pe: PositionEncoding, prefix: int = 0):
        if prefix:
            raise ValueError("window attention has no prefix (CLS, register) tokens")
        sources = window_sources(positions, self.window, self.shift)  # (windows, W * W)
        spots = positions.flatten(0, 1)[sources]  # (windows, W * W, 2): each patch's place in the image
        if self.static_sides is not None:
            y = super().forward(static_windows(x, self.static_sides, self.window, self.shift), spots, pe)
            return static_tokens(y, self.static_sides, self.window, self.shift)
        y = super().forward(x[:, sources], spots, pe)  # windows (B, windows, W * W, D)
        return y.flatten(1, 2)[:, window_destinations(positions, self.window, self.shift)]  # (B, N, D)
