"""Position encodings behind one interface, and the ENCODINGS registry.

Attention calls the same three hooks whatever the encoding, so swapping encodings never
touches the model code:

    embed(x, positions)      -> x          absolute encodings add to the token embeddings
    rotate(q, k, positions)  -> (q, k)     rotary encodings rotate queries and keys
    bias(positions)          -> (H, T, T)  relative encodings add to the attention logits
                                           (or None)

`positions` is an explicit int64 tensor of shape (T,) for a token sequence: the sequence
length stays dynamic through ONNX and TVM, and offsets (positions = start + arange(T)) just
work. The grid encodings (grid_encodings.py, in ENCODINGS too) take (*grid, A) positions of
image or video patches; an encoding's `axes` says how many it takes (1 here).
"""

from __future__ import annotations

import inspect
import math

import torch
from torch import nn

from .grid_encodings import GRID_ENCODINGS
from .position import NoPosition, PositionEncoding, _exporting


class Sinusoidal(PositionEncoding):
    """Vaswani et al.: PE(p, 2i) = sin(p / base^(2i/d)), PE(p, 2i+1) = cos(p / base^(2i/d))."""

    def __init__(self, *, d_model: int, base: float = 10000.0):
        super().__init__()
        if d_model % 2:
            raise ValueError(f"sinusoidal encoding needs an even d_model, got {d_model}")
        inv_freq = base ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)  # (D/2,)

    def embed(self, x, positions):
        angles = positions.to(torch.float32)[:, None] * self.inv_freq  # (T, D/2)
        table = torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(-2)  # (T, D)
        return x + table


class LearnedAbsolute(PositionEncoding):
    """A learned table of max_len rows: positions at or past max_len are an error."""

    def __init__(self, *, d_model: int, max_len: int = 512):
        super().__init__()
        self.max_length = max_len
        self.table = nn.Embedding(max_len, d_model)

    def embed(self, x, positions):
        if not _exporting() and positions.numel():
            lo, hi = int(positions.min()), int(positions.max())
            if lo < 0 or hi >= self.max_length:
                raise ValueError(
                    f"position {hi if hi >= self.max_length else lo} is outside the learned "
                    f"position table (valid positions: 0..{self.max_length - 1}); "
                    f"this encoder accepts sequences of at most {self.max_length} tokens")
        return x + self.table(positions)  # (B, T, D) + (T, D)


def t5_relative_buckets(relative: torch.Tensor, *, num_buckets: int, max_distance: int) -> torch.Tensor:
    """Bidirectional T5 bucketing of relative = key_pos - query_pos.

    Half the buckets hold keys after the query. Within a half, distances below
    max_exact = half // 2 get a bucket each, and larger ones share log-spaced buckets
    up to max_distance, beyond which everything lands in the last bucket.
    """
    half = num_buckets // 2
    buckets = (relative > 0).to(torch.int64) * half
    distance = relative.abs()
    max_exact = half // 2
    # clamp(min=1) only keeps log() finite where the `where` below picks `distance` anyway
    log_ratio = torch.log(distance.clamp(min=1).to(torch.float32) / max_exact)
    large = max_exact + (log_ratio / math.log(max_distance / max_exact) * (half - max_exact)).to(torch.int64)
    large = large.clamp(max=half - 1)
    return buckets + torch.where(distance < max_exact, distance, large)


class RelativeBias(PositionEncoding):
    """T5 relative position bias: a learned per-head scalar per distance bucket."""

    def __init__(self, *, n_heads: int, num_buckets: int = 32, max_distance: int = 128):
        super().__init__()
        if num_buckets < 4 or num_buckets % 2:
            raise ValueError(f"t5_bias num_buckets must be an even number >= 4, got {num_buckets}")
        if max_distance <= num_buckets // 4:
            raise ValueError(f"t5_bias max_distance must exceed num_buckets/4, got {max_distance}")
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.table = nn.Embedding(num_buckets, n_heads)
        # The bucket of each relative distance in -max_distance..max_distance; past those the
        # rule's buckets no longer change (its log-spaced buckets end at max_distance).
        within = torch.arange(-max_distance, max_distance + 1)
        self.register_buffer("distance_buckets", t5_relative_buckets(within, num_buckets=num_buckets,
                                                                     max_distance=max_distance), persistent=False)

    def bias(self, positions):
        # A (H, 2 * max_distance + 1) bias per relative distance, gathered at each pair's
        # clamped distance. Bucketing the (T, T) distances themselves took a float log per
        # pair at run time, and the lookup's (T, T, H) a transpose: 6% of t5_bias at B=1 T=512.
        per_distance = self.table(self.distance_buckets).t()  # (H, 2 * max_distance + 1)
        relative = positions[None, :] - positions[:, None]  # (T, T): key - query
        index = relative.clamp(-self.max_distance, self.max_distance) + self.max_distance
        return per_distance[:, index]  # (H, T, T)


def alibi_slopes(n_heads: int) -> list[float]:
    """Press et al.: geometric slopes starting at 2^(-8/n); for a head count that is not a
    power of two, the closest lower power's slopes plus every other slope of twice that."""
    def geometric(n):
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]
    closest = 2 ** int(math.floor(math.log2(n_heads)))
    return geometric(closest) + geometric(2 * closest)[0::2][: n_heads - closest]


class ALiBi(PositionEncoding):
    """Attention with linear biases: logits get -slope_h * |query_pos - key_pos|."""

    def __init__(self, *, n_heads: int):
        super().__init__()
        self.register_buffer("slopes", torch.tensor(alibi_slopes(n_heads)), persistent=False)

    def bias(self, positions):
        distance = (positions[None, :] - positions[:, None]).abs().to(torch.float32)  # (T, T)
        return -self.slopes[:, None, None] * distance  # (H, T, T)


class Rotary(PositionEncoding):
    """RoPE: rotate each pair of q/k features by position * theta_i, theta_i = base^(-2i/r).

    Pairs are (x_i, x_{i+r/2}) ("half", GPT-NeoX / Llama layout) or (x_{2i}, x_{2i+1})
    ("interleaved", GPT-J layout). Only the first r = rotary_dim features of each head
    rotate (partial rotary); the rest pass through. Being a rotation, it keeps norms, and
    q(m).k(n) depends on m - n only.
    """

    def __init__(self, *, head_dim: int, base: float = 10000.0, rotary_dim: int | None = None,
                 interleaved: bool = False):
        super().__init__()
        rotary_dim = head_dim if rotary_dim is None else rotary_dim
        if rotary_dim % 2 or not 0 < rotary_dim <= head_dim:
            raise ValueError(f"rope rotary_dim must be even and in 2..{head_dim} (head_dim), got {rotary_dim}")
        self.rotary_dim, self.interleaved = rotary_dim, interleaved
        theta = base ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
        self.register_buffer("theta", theta.float(), persistent=False)  # (r/2,)

    def rotate(self, q, k, positions):
        angles = positions.to(torch.float32)[:, None] * self.theta  # (T, r/2)
        cos, sin = angles.cos(), angles.sin()
        return self._rotate(q, cos, sin), self._rotate(k, cos, sin)

    def _rotate(self, x, cos, sin):  # x: (B, H, T, Dh)
        r = self.rotary_dim
        rot, rest = x[..., :r], x[..., r:]
        if self.interleaved:
            pairs = rot.unflatten(-1, (r // 2, 2))  # (B, H, T, r/2, 2)
            x1, x2 = pairs[..., 0], pairs[..., 1]
            out = torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)
        else:
            x1, x2 = rot[..., : r // 2], rot[..., r // 2:]
            out = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
        return out if r == x.shape[-1] else torch.cat([out, rest], dim=-1)


class Hybrid(PositionEncoding):
    """A per-layer choice, e.g. RoPE in the lower layers and relative bias above.

    Each named encoding is built once and shared by the layers that use it (T5 shares
    its bias table across layers the same way). Absolute encodings in the list add to
    the embeddings once, at the input.
    """

    def __init__(self, *, layers: list[str], n_layers: int, options: dict, **dims):
        super().__init__()
        if len(layers) != n_layers:
            raise ValueError(f"hybrid encoding lists {len(layers)} layers, the model has {n_layers}")
        for name in layers:
            if name not in ENCODINGS or name == "hybrid":
                raise ValueError(f"hybrid layer encoding {name!r} is unknown; valid: "
                                 f"{', '.join(n for n in ENCODINGS if n != 'hybrid')}")
        self.layers = list(layers)
        self.parts = nn.ModuleDict({
            name: build_encoding(name, options.get(name, {}), n_layers=n_layers, **dims)
            for name in dict.fromkeys(layers)})
        windowed = [n for n, p in self.parts.items() if p.window is not None]
        if windowed:
            raise ValueError(f"hybrid layers cannot mix window attention into an encoder ({', '.join(windowed)}): "
                             "a windowed encoding is the whole encoder's")
        bounds = [p.max_length for p in self.parts.values() if p.max_length is not None]
        self.max_length = min(bounds) if bounds else None
        axes = {p.axes for p in self.parts.values()} - {None}
        if len(axes) > 1:
            raise ValueError(f"hybrid layers take positions of different axes ({sorted(axes)}): "
                             f"{', '.join(f'{n} {p.axes}' for n, p in self.parts.items())}; mix encodings of one kind")
        self.axes = axes.pop() if axes else None

    def embed(self, x, positions):
        for part in self.parts.values():
            x = part.embed(x, positions)
        return x

    def for_layer(self, index):
        return self.parts[self.layers[index]]


ENCODINGS: dict[str, type[PositionEncoding]] = {
    "sinusoidal": Sinusoidal,
    "learned": LearnedAbsolute,
    "t5_bias": RelativeBias,
    "rope": Rotary,
    "alibi": ALiBi,
    "hybrid": Hybrid,
    "none": NoPosition,
    **GRID_ENCODINGS,  # 2D and 3D: positions (*grid, A) of image and video patches
}

_DIMENSION_ARGS = ("d_model", "n_heads", "head_dim", "n_layers")


def build_encoding(name: str, options: dict, *, d_model: int, n_heads: int, head_dim: int,
                   n_layers: int) -> PositionEncoding:
    """Build ENCODINGS[name] with the model's dimensions and the spec's options."""
    if name not in ENCODINGS:
        raise ValueError(f"unknown encoding {name!r}; valid: {', '.join(ENCODINGS)}")
    cls = ENCODINGS[name]
    dims = dict(d_model=d_model, n_heads=n_heads, head_dim=head_dim, n_layers=n_layers)
    params = inspect.signature(cls.__init__).parameters
    if name == "hybrid":
        layers = options.get("layers")
        if not isinstance(layers, list):
            raise ValueError("hybrid encoding needs `layers`, a list of encoding names, one per layer")
        sub = {k: v for k, v in options.items() if k != "layers"}
        return cls(layers=layers, options=sub, **dims)
    allowed = [p for p in params if p not in ("self", *_DIMENSION_ARGS)]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(f"encoding {name!r} has no option {', '.join(map(repr, unknown))}; "
                         f"valid options: {', '.join(allowed) or 'none'}")
    return cls(**options, **{k: v for k, v in dims.items() if k in params})
