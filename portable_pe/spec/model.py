"""A pre-norm Transformer encoder whose position encoding is a swappable part.

Inputs are token embeddings x (B, T, D) and positions (T,) int64. Reshapes name the
head dims (unflatten/flatten) instead of using -1, so the sequence length stays dynamic
through ONNX and TVM's importer. Attention also takes windows of tokens, x (B, *windows, T, D)
(window attention, windows.py): the leading dims are kept as they are.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .encodings import PositionEncoding, build_encoding


@dataclass(frozen=True)
class EncoderConfig:
    d_model: int = 256
    n_heads: int = 4
    n_layers: int = 4
    d_ff: int = 1024
    norm_eps: float = 1e-5

    def __post_init__(self):
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        for field in ("d_model", "n_heads", "n_layers", "d_ff"):
            if getattr(self, field) <= 0:
                raise ValueError(f"model.{field} must be positive, got {getattr(self, field)}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


class Attention(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.n_heads, self.head_dim = cfg.n_heads, cfg.head_dim
        self.q = nn.Linear(cfg.d_model, cfg.d_model)
        self.k = nn.Linear(cfg.d_model, cfg.d_model)
        self.v = nn.Linear(cfg.d_model, cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.scale = self.head_dim ** -0.5

    def _heads(self, x):
        return x.unflatten(-1, (self.n_heads, self.head_dim)).transpose(-3, -2)  # (B, H, T, Dh)

    def forward(self, x, positions, pe: PositionEncoding, prefix: int = 0):
        q, k, v = self._heads(self.q(x)), self._heads(self.k(x)), self._heads(self.v(x))
        q, k = _rotate(pe, q, k, positions, prefix)
        logits = (q @ k.transpose(-2, -1)) * self.scale  # (B, H, T, T)
        bias = pe.bias(positions)
        if bias is not None:
            logits = logits + _pad_prefix(bias, prefix)  # (H, T, T) broadcasts over B (windows: (*win, H, T, T))
        y = logits.softmax(dim=-1) @ v  # (B, H, T, Dh)
        return self.proj(y.transpose(-3, -2).flatten(-2))  # (B, T, D)


def _rotate(pe: PositionEncoding, q, k, positions, prefix: int):
    """pe.rotate on the tokens after the first `prefix` (a vision encoder's CLS and register
    tokens, which have no position); the whole sequence when prefix is 0."""
    if not prefix:
        return pe.rotate(q, k, positions)
    rq, rk = pe.rotate(q[:, :, prefix:], k[:, :, prefix:], positions)
    return torch.cat([q[:, :, :prefix], rq], dim=2), torch.cat([k[:, :, :prefix], rk], dim=2)


def _pad_prefix(bias, prefix: int):
    """A (H, N, N) bias of the patch tokens as (H, P + N, P + N): no bias to or from a prefix token."""
    return F.pad(bias, (prefix, 0, prefix, 0)) if prefix else bias


class MLP(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.up = nn.Linear(cfg.d_model, cfg.d_ff)
        self.act = nn.GELU()
        self.down = nn.Linear(cfg.d_ff, cfg.d_model)

    def forward(self, x):
        return self.down(self.act(self.up(x)))


class Block(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.attn = Attention(cfg)
        self.norm2 = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, positions, pe: PositionEncoding, prefix: int = 0):
        x = x + self.attn(self.norm1(x), positions, pe, prefix)
        return x + self.mlp(self.norm2(x))


class Encoder(nn.Module):
    def __init__(self, cfg: EncoderConfig, encoding: PositionEncoding):
        super().__init__()
        self.cfg = cfg
        self.pe = encoding
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if self.pe.axes not in (None, 1):
            raise ValueError(f"a sequence encoder's positions have one axis; this encoding takes {self.pe.axes} "
                             "(an image or video encoding: give the graph a [vision] table)")
        x = self.pe.embed(x, positions)  # (B, T, D)
        for i, block in enumerate(self.blocks):
            x = block(x, positions, self.pe.for_layer(i))
        return self.norm(x)


def seeded_encoding(cfg: EncoderConfig, encoding: str, options: dict | None = None, *,
                    seed: int = 0) -> PositionEncoding:
    """The encoding, built right after seeding torch: everything built after it (the
    blocks) is then a pure function of the seed too."""
    torch.manual_seed(seed)
    return build_encoding(encoding, options or {}, d_model=cfg.d_model, n_heads=cfg.n_heads,
                          head_dim=cfg.head_dim, n_layers=cfg.n_layers)


def build_encoder(cfg: EncoderConfig, encoding: str, options: dict | None = None, *,
                  seed: int = 0) -> Encoder:
    """An Encoder in eval mode whose weights are a pure function of (cfg, encoding, seed)."""
    return Encoder(cfg, seeded_encoding(cfg, encoding, options, seed=seed)).eval()
