"""Window attention (Swin v1): the patch grid cut into windows of W x W patches, each block
attending within its windows, every other block's windows shifted cyclically by `shift`.

    tokens (B, gh * gw, D) -> grid (B, gh, gw, D) -> rolled by -shift along both axes
      -> windows (B, gh / W, gw / W, W * W, D): the blocks and the bias keep both window axes
         (flattened, their count would be a dim TVM cannot tell equal to the bias's)
      -> the block -> the inverse: merged, rolled back, (B, gh * gw, D)

The grid's sides must be whole windows (the graph's pixel dims are multiples of patch * W).
The window counts are read off a tensor of that shape (a strided slice of the positions,
not gh // W, which tracing would fix to the example's), so they stay expressions of the
image's height and width through ONNX and TVM's importer.
"""

from __future__ import annotations

import torch

from .model import Block, EncoderConfig
from .position import PositionEncoding


def roll(grid: torch.Tensor, positions: torch.Tensor, shift: int) -> torch.Tensor:
    """grid (B, gh, gw, C) rolled by `shift` patches towards the top left (negative: back):
    rows, then columns, gathered at (index + shift) mod length, the indices from the grid's
    positions (gh, gw, 2). Slices at -shift would give shapes TVM cannot simplify
    (gh + min(1, gh) - 1), and lengths read off the example would be traced as constants."""
    for axis, index in ((1, positions[:, 0, 0]), (2, positions[0, :, 1])):  # (gh,), (gw,)
        length = index.amax(dim=0, keepdim=True) + 1  # (1,): not index[-1:], whose length TVM cannot tell is 1
        grid = grid.index_select(axis, (index + shift + length) % length)
    return grid


def partition(grid: torch.Tensor, rows, cols, window: int) -> torch.Tensor:
    """(B, gh, gw, C) -> (B, rows, cols, W * W, C): rows x cols windows, each window's patches row-major."""
    cells = grid.unflatten(2, (cols, window)).unflatten(1, (rows, window))  # (B, gh/W, W, gw/W, W, C)
    return cells.transpose(2, 3).flatten(3, 4)  # (B, gh/W, gw/W, W * W, C)


def merge(windows: torch.Tensor, window: int) -> torch.Tensor:
    """partition's inverse: (B, rows, cols, W * W, C) -> (B, rows * W, cols * W, C)."""
    cells = windows.unflatten(3, (window, window)).transpose(2, 3)  # (B, gh/W, W, gw/W, W, C)
    return cells.flatten(3, 4).flatten(1, 2)  # (B, gh, gw, C)


class WindowBlock(Block):
    """A Block run on each (shifted) window: Swin's block. Its norms, MLP and residuals act
    per token, so they commute with cutting the tokens into windows; only the attention
    sees the windows, as in Swin, where the partition sits around the attention alone."""

    def __init__(self, cfg: EncoderConfig, *, window: int, shift: int):
        super().__init__(cfg)
        self.window, self.shift = window, shift

    def forward(self, x, positions, pe: PositionEncoding, prefix: int = 0):
        if prefix:
            raise ValueError("window attention has no prefix (CLS, register) tokens")
        w, s = self.window, self.shift
        gh, gw = positions.shape[0], positions.shape[1]  # positions (gh, gw, 2)
        corners = positions[::w, ::w]  # (gh / W, gw / W, 2): a patch per window, its shape the window counts
        rows, cols = corners.shape[0], corners.shape[1]
        cells = x.unflatten(1, (gh, gw))  # (B, gh, gw, D)
        spots = positions.unsqueeze(0)  # (1, gh, gw, 2)
        if s:
            cells, spots = roll(cells, positions, s), roll(spots, positions, s)
        windows = partition(cells, rows, cols, w)  # (B, gh/W, gw/W, W * W, D)
        y = merge(super().forward(windows, partition(spots, rows, cols, w)[0], pe), w)  # (B, gh, gw, D)
        return (roll(y, positions, -s) if s else y).flatten(1, 2)  # (B, N, D)
