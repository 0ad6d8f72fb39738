"""Vision encoders: a patch stem in front of the same Transformer blocks (model.py).

    pixel_values (B, C, H, W)       -> Conv2d, kernel = stride = patch -> (B, D, gh, gw)
    or (B, C, F, H, W) for video    -> Conv3d, (temporal_patch, patch, patch) -> (B, D, gf, gh, gw)
      -> patch tokens (B, N, D), N = prod(grid), and their positions (*grid, A)
      -> CLS and register tokens prepended (learned), the blocks, a final norm
         (a windowed encoding, Swin's: no prefix tokens, blocks attend within windows, windows.py)
      -> hidden (B, prefix + N, D)

The positions are computed in the graph from the stem's output shape, by a cumulative
sum of ones rather than a Range: the dims stay expressions of H and W (H / patch) all
the way through ONNX and TVM's importer, so one build runs every resolution. The position
hooks see the patch tokens only; prefix tokens pass through them unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .model import Block, EncoderConfig, seeded_encoding
from .position import PositionEncoding
from .windows import WindowBlock


@dataclass(frozen=True)
class VisionConfig:
    patch: int = 16
    channels: int = 3
    cls_tokens: int = 1
    registers: int = 0
    temporal_patch: int = 0  # > 0: video, pixel_values (B, C, F, H, W), frames in groups of this many

    def __post_init__(self):
        for name in ("patch", "channels"):
            if getattr(self, name) < 1:
                raise ValueError(f"vision.{name} must be positive, got {getattr(self, name)}")
        for name in ("cls_tokens", "registers", "temporal_patch"):
            if getattr(self, name) < 0:
                raise ValueError(f"vision.{name} must be >= 0, got {getattr(self, name)}")

    @property
    def video(self) -> bool:
        return self.temporal_patch > 0

    @property
    def axes(self) -> int:
        """Position axes of a patch: (row, column), or (frame, row, column)."""
        return 3 if self.video else 2

    @property
    def prefix(self) -> int:
        return self.cls_tokens + self.registers


def _counting(ones: torch.Tensor) -> torch.Tensor:
    """0, 1, ..., n-1 for a 1-D tensor of n ones."""
    return ones.cumsum(0) - 1


def grid_positions(grid: torch.Tensor) -> torch.Tensor:
    """(*grid, A) int64 positions of a stem output (B, D, *grid): each axis counts its
    index; built from ones of the grid's shape, so the grid dims stay symbolic."""
    first = grid[0, 0]  # (*grid)
    spatial = first.dim()
    axes = []
    for axis in range(spatial):
        index = [0] * spatial
        index[axis] = slice(None)
        count = _counting(torch.ones_like(first[tuple(index)], dtype=torch.int64))  # (g_axis,)
        for other in range(spatial):  # unsqueeze, not view(-1): the importer keeps the dims symbolic
            if other != axis:
                count = count.unsqueeze(other)
        axes.append(count)
    zero = torch.zeros_like(first, dtype=torch.int64)  # broadcasts each axis's count over the grid
    return torch.stack([zero + a for a in axes], dim=-1)  # (*grid, A)


class PatchStem(nn.Module):
    def __init__(self, cfg: EncoderConfig, vision: VisionConfig):
        super().__init__()
        if vision.video:
            kernel = (vision.temporal_patch, vision.patch, vision.patch)
            self.proj = nn.Conv3d(vision.channels, cfg.d_model, kernel, stride=kernel)
        else:
            self.proj = nn.Conv2d(vision.channels, cfg.d_model, vision.patch, stride=vision.patch)

        self.fixed_positions: torch.Tensor | None = None  # fix_positions: one static size's

    def forward(self, pixel_values):
        static_video = self.fixed_positions is not None and isinstance(self.proj, nn.Conv3d)
        grid = self._conv3d_as_conv2d(pixel_values) if static_video else self.proj(pixel_values)  # (B, D, *grid)
        positions = grid_positions(grid) if self.fixed_positions is None else self.fixed_positions
        return grid.flatten(2).transpose(1, 2), positions  # (B, N, D), (*grid, A)

    def _conv3d_as_conv2d(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """self.proj (Conv3d, kernel = stride) as one Conv2d per frame group, the group's
        frames stacked as channels, for one static size: Vela has no CONV_3D (LiteRT keeps
        it float on the CPU, behind a rank-5 transpose Vela refuses). A group's channels are
        (channel, frame) in the kernel's order, so the weight reshapes to (D, C * kt, p, p),
        and a group's slice of the pixels is already in that order: no transpose. (Moving
        the groups ahead of the channels with one transpose instead, Vela left it on the
        CPU for Ethos-U55 at 4x224x224: "Transpose with permutation NWHC has shape out of
        range: 3, 2, 100352".)"""
        b, c, frames, h, w = pixel_values.shape
        kt, d = self.proj.kernel_size[0], self.proj.out_channels
        groups = frames // kt
        clips = pixel_values.reshape(b, c, groups, kt * h * w)
        weight = self.proj.weight.reshape(d, c * kt, *self.proj.kernel_size[1:])
        outs = [nn.functional.conv2d(clips[:, :, g].reshape(b, c * kt, h, w), weight, self.proj.bias,
                                     stride=self.proj.stride[1:]) for g in range(groups)]  # each (B, D, gh, gw)
        return torch.stack(outs, dim=2)  # (B, D, groups, gh, gw)

    def fix_positions(self, pixel_values: torch.Tensor) -> None:
        """Use the positions of `pixel_values`' size as a constant: a program exported at one
        static size (the Ethos-U path's) then folds every position computation (RoPE's
        tables, a resized learned table, a relative bias), which, computed from the stem's
        output, torch's constant folding cannot see are constants."""
        with torch.no_grad():
            self.fixed_positions = grid_positions(self.proj(pixel_values))


class VisionEncoder(nn.Module):
    def __init__(self, cfg: EncoderConfig, vision: VisionConfig, encoding: PositionEncoding):
        super().__init__()
        if encoding.axes not in (None, vision.axes):
            raise ValueError(f"the encoding's positions have {encoding.axes} axis(es); this graph's "
                             f"patches have {vision.axes} ({'frame, row, column' if vision.video else 'row, column'}): "
                             f"choose a {vision.axes}D encoding")
        if encoding.window is not None and (vision.prefix or vision.video):
            raise ValueError("window attention (Swin) takes image patches only: set vision.cls_tokens = 0 and "
                             f"vision.registers = 0 (got {vision.cls_tokens} and {vision.registers}), no temporal_patch")
        self.cfg, self.vision, self.pe = cfg, vision, encoding
        self.stem = PatchStem(cfg, vision)
        self.prefix_tokens = nn.Parameter(torch.randn(1, vision.prefix, cfg.d_model) * 0.02) if vision.prefix else None
        self.blocks = nn.ModuleList(_block(cfg, encoding, i) for i in range(cfg.n_layers))
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        x, positions = self.stem(pixel_values)  # (B, N, D), (*grid, A)
        x = self.pe.embed(x, positions)
        if self.prefix_tokens is not None:
            x = self._with_prefix(x)  # (B, P + N, D)
        for i, block in enumerate(self.blocks):
            x = block(x, positions, self.pe.for_layer(i), prefix=self.vision.prefix)
        return self.norm(x)


    def _with_prefix(self, x: torch.Tensor) -> torch.Tensor:
        if self.stem.fixed_positions is None:
            return torch.cat([self.prefix_tokens.expand(x.shape[0], -1, -1), x], dim=1)
        # one static size (fix_positions): the same tokens as padding plus a constant, because
        # ai-edge-quantizer cannot quantize a Concatenation with a constant operand ("Ranks of
        # scales (4) and zps (4) must be the same as the tensor rank (3)")
        tail = torch.zeros(1, x.shape[1], x.shape[2], dtype=x.dtype)
        return torch.nn.functional.pad(x, (0, 0, self.vision.prefix, 0)) + torch.cat([self.prefix_tokens, tail], dim=1)

    def fix_positions(self, pixel_values: torch.Tensor) -> None:
        """Built for `pixel_values`' size only (PatchStem.fix_positions); window blocks cut
        their grid with static reshapes (windows.static_windows)."""
        self.stem.fix_positions(pixel_values)
        sides = tuple(self.stem.fixed_positions.shape[-3:-1])  # (gh, gw)
        for block in self.blocks:
            if isinstance(block, WindowBlock):
                block.static_sides = sides


def _block(cfg: EncoderConfig, encoding: PositionEncoding, index: int) -> Block:
    """Block `index`: attending over all tokens, or within windows, shifted in every other block (Swin)."""
    if encoding.window is None:
        return Block(cfg)
    return WindowBlock(cfg, window=encoding.window, shift=encoding.shift if index % 2 else 0)


def build_vision_encoder(cfg: EncoderConfig, vision: VisionConfig, encoding: str, options: dict | None = None, *,
                         seed: int = 0) -> VisionEncoder:
    """A VisionEncoder in eval mode whose weights are a pure function of (cfg, vision,
    encoding, seed)."""
    return VisionEncoder(cfg, vision, seeded_encoding(cfg, encoding, options, seed=seed)).eval()
