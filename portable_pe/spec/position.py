"""The interface every position encoding implements (encodings.py: 1D, grid_encodings.py:
2D and 3D), so the encoder calls the same three hooks whatever the encoding."""

from __future__ import annotations

import torch
from torch import nn


class PositionEncoding(nn.Module):
    """Base class: every hook is the identity, so an encoding overrides only its own."""

    #: longest sequence the encoding can represent (None: unbounded)
    max_length: int | None = None
    #: position axes it takes: 1 for a sequence (positions (T,)), 2 or 3 for image or video
    #: patches (positions (*grid, A)); None: any (an encoding that ignores positions)
    axes: int | None = 1
    #: attention within windows of window x window patches (Swin; the encoder cuts the tokens
    #: into windows and `bias` gets each window's positions), every other layer's windows
    #: shifted by `shift` patches; None: attention over all tokens
    window: int | None = None
    shift: int = 0

    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return x

    def rotate(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor):
        return q, k

    def bias(self, positions: torch.Tensor) -> torch.Tensor | None:
        return None

    def for_layer(self, index: int) -> PositionEncoding:
        """The encoding that layer `index` uses (hybrids differ per layer)."""
        return self


def _exporting() -> bool:
    return torch.compiler.is_compiling() or torch.jit.is_tracing() or torch.compiler.is_exporting()


class NoPosition(PositionEncoding):
    """No position information at all (every hook is the identity): the baseline that the
    guide measures every encoding against. The encoder is then permutation-equivariant."""

    axes = None  # a sequence, an image or a video: it ignores them all
