"""Each encoding against an independent formulation of its published definition.

The tolerances here are not the parity harness's (tests/conftest.assert_parity): they check
the PyTorch reference implementation itself, in float32, against a float64 formulation or
an exact property, several times tighter than any row of parity.TOLERANCES, so they stay.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from portable_pe.spec.encodings import (ALiBi, ENCODINGS, LearnedAbsolute, RelativeBias, Rotary, Sinusoidal,
                                   build_encoding, t5_relative_buckets)

ROPE_LAYOUTS = [dict(interleaved=False), dict(interleaved=True),
                dict(interleaved=False, rotary_dim=16), dict(interleaved=True, rotary_dim=8, base=500.0)]


def rope_by_complex_numbers(x: np.ndarray, positions: np.ndarray, *, rotary_dim, base, interleaved):
    """RoPE as Su et al. write it: feature pairs as complex numbers times e^(i p theta_j)."""
    r = rotary_dim
    if interleaved:
        z = x[..., 0:r:2] + 1j * x[..., 1:r:2]
    else:
        z = x[..., : r // 2] + 1j * x[..., r // 2: r]
    theta = np.array([base ** (-2.0 * j / r) for j in range(r // 2)])
    z = z * np.exp(1j * positions[:, None] * theta[None, :])
    out = x.astype(np.float64).copy()
    if interleaved:
        out[..., 0:r:2], out[..., 1:r:2] = z.real, z.imag
    else:
        out[..., : r // 2], out[..., r // 2: r] = z.real, z.imag
    return out


@pytest.mark.parametrize("layout", ROPE_LAYOUTS, ids=str)
def test_rope_matches_complex_rotation(layout):
    head_dim = 32
    rope = Rotary(head_dim=head_dim, **layout)
    q = torch.randn(2, 3, 9, head_dim, generator=torch.Generator().manual_seed(0))
    positions = torch.arange(9) + 5  # an offset window
    got, _ = rope.rotate(q, q, positions)
    expected = rope_by_complex_numbers(q.numpy().astype(np.float64), positions.numpy(),
                                       rotary_dim=layout.get("rotary_dim", head_dim),
                                       base=layout.get("base", 10000.0), interleaved=layout["interleaved"])
    np.testing.assert_allclose(got.numpy(), expected, atol=2e-5)  # float32 vs float64: rounding only


@pytest.mark.parametrize("layout", ROPE_LAYOUTS, ids=str)
def test_rope_scores_depend_only_on_relative_position(layout):
    head_dim = 32
    rope = Rotary(head_dim=head_dim, **layout)
    gen = torch.Generator().manual_seed(1)
    q, k = torch.randn(1, 1, 1, head_dim, generator=gen), torch.randn(1, 1, 1, head_dim, generator=gen)

    def score(m, n):
        qm, _ = rope.rotate(q, q, torch.tensor([m]))
        _, kn = rope.rotate(k, k, torch.tensor([n]))
        return float((qm * kn).sum())

    same_offset = [score(m, m - 3) for m in (3, 10, 57, 400)]
    np.testing.assert_allclose(same_offset, same_offset[0], rtol=1e-4, atol=1e-4)  # a property, not parity
    # and the check can fail: scores at other offsets differ (the tutorial mistake
    # x*cos + x*sin, which scales instead of rotating, fails the line above)
    other_offsets = [score(10, 10 - d) for d in (0, 1, 2, 5)]
    assert np.ptp(other_offsets) > 1e-2, "scores should change with the offset"


@pytest.mark.parametrize("layout", ROPE_LAYOUTS, ids=str)
def test_rope_preserves_norms(layout):
    rope = Rotary(head_dim=32, **layout)
    x = torch.randn(2, 4, 50, 32, generator=torch.Generator().manual_seed(2))
    rotated, _ = rope.rotate(x, x, torch.arange(50) * 7)
    np.testing.assert_allclose(rotated.norm(dim=-1).numpy(), x.norm(dim=-1).numpy(), rtol=1e-5)  # a rotation


def test_partial_rope_leaves_the_rest_untouched():
    rope = Rotary(head_dim=32, rotary_dim=8)
    x = torch.randn(1, 1, 5, 32)
    rotated, _ = rope.rotate(x, x, torch.arange(5))
    assert torch.equal(rotated[..., 8:], x[..., 8:])
    assert not torch.allclose(rotated[..., 1:, :8], x[..., 1:, :8])


def test_sinusoidal_matches_closed_form():
    d, base = 16, 10000.0
    pe = Sinusoidal(d_model=d)
    positions = torch.tensor([0, 1, 2, 17, 300])
    got = pe.embed(torch.zeros(1, 5, d), positions)[0].numpy()
    expected = np.zeros((5, d))
    for row, p in enumerate(positions.tolist()):
        for i in range(d // 2):
            expected[row, 2 * i] = math.sin(p / base ** (2 * i / d))
            expected[row, 2 * i + 1] = math.cos(p / base ** (2 * i / d))
    np.testing.assert_allclose(got, expected, atol=3e-5)  # float32 sin/cos at p = 300 vs math's


def t5_bucket_scalar(relative: int, num_buckets: int, max_distance: int) -> int:
    """The bidirectional rule of Raffel et al. (mesh-tensorflow), one pair at a time."""
    num_buckets //= 2
    bucket = num_buckets if relative > 0 else 0
    n = abs(relative)
    max_exact = num_buckets // 2
    if n < max_exact:
        return bucket + n
    large = max_exact + int(math.log(n / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact))
    return bucket + min(large, num_buckets - 1)


@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (64, 256), (8, 20)])
def test_t5_buckets_match_scalar_rule(num_buckets, max_distance):
    relative = torch.arange(-700, 701)
    got = t5_relative_buckets(relative, num_buckets=num_buckets, max_distance=max_distance)
    expected = [t5_bucket_scalar(r, num_buckets, max_distance) for r in relative.tolist()]
    mismatches = [(r, g, e) for r, g, e in zip(relative.tolist(), got.tolist(), expected) if g != e]
    assert not mismatches, f"(relative, got, expected): {mismatches[:10]}"


@pytest.mark.parametrize("positions", [torch.arange(6) + 2, torch.tensor([0, 3, 200, 57, 1000, 39, 40, 41, -5, 80])],
                         ids=["consecutive", "scattered"])
def test_t5_bias_is_bucket_lookup_per_head(positions):
    """Per pair, the head's table entry at the scalar rule's bucket: scattered positions
    reach distances far past max_distance, where the bias reads a table per clamped distance."""
    enc = RelativeBias(n_heads=3, num_buckets=16, max_distance=40)
    bias = enc.bias(positions)
    t = len(positions)
    assert bias.shape == (3, t, t)
    for i in range(t):
        for j in range(t):
            bucket = t5_bucket_scalar(int(positions[j] - positions[i]), 16, 40)
            assert torch.equal(bias[:, i, j], enc.table.weight[bucket])


def alibi_slopes_from_paper(n_heads: int) -> list[float]:
    """Press et al. 2022, sec. 3: 2^(-8h/n) for h = 1..n when n is a power of two; otherwise
    the slopes of the closest lower power n', then odd-indexed slopes of 2n'."""
    n = 2 ** int(math.log2(n_heads))
    slopes = [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]
    return slopes + [2.0 ** (-8.0 * (2 * j - 1) / (2 * n)) for j in range(1, n_heads - n + 1)]


@pytest.mark.parametrize("n_heads", [1, 2, 4, 8, 16, 3, 6, 12, 20])
def test_alibi_slopes_follow_the_paper(n_heads):
    got = ALiBi(n_heads=n_heads).slopes.tolist()
    np.testing.assert_allclose(got, alibi_slopes_from_paper(n_heads), rtol=1e-6)  # float32 powers of two
    if n_heads == 8:  # the paper's worked example: 1/2, 1/4, ..., 1/256
        np.testing.assert_allclose(got, [2.0 ** -k for k in range(1, 9)], rtol=1e-6)


def test_alibi_bias_is_linear_in_distance():
    enc = ALiBi(n_heads=4)
    bias = enc.bias(torch.arange(5) + 100)
    slopes = alibi_slopes_from_paper(4)
    for h in range(4):
        for i in range(5):
            for j in range(5):
                assert bias[h, i, j].item() == pytest.approx(-slopes[h] * abs(i - j), abs=1e-6)


def test_learned_table_refuses_positions_past_its_length():
    enc = LearnedAbsolute(d_model=8, max_len=16)
    enc.embed(torch.zeros(1, 16, 8), torch.arange(16))
    with pytest.raises(ValueError, match="at most 16 tokens"):
        enc.embed(torch.zeros(1, 17, 8), torch.arange(17))


DIMS = dict(d_model=32, n_heads=4, head_dim=8, n_layers=4)


def test_hybrid_uses_one_encoding_per_layer():
    enc = build_encoding("hybrid", {"layers": ["rope", "rope", "t5_bias", "alibi"]}, **DIMS)
    kinds = [type(enc.for_layer(i)).__name__ for i in range(4)]
    assert kinds == ["Rotary", "Rotary", "RelativeBias", "ALiBi"]
    assert enc.for_layer(0) is enc.for_layer(1)  # shared, like T5's shared bias


@pytest.mark.parametrize("name,options,message", [
    ("hybrid", {"layers": ["rope", "rope"]}, "lists 2 layers, the model has 4"),
    ("hybrid", {"layers": ["rope", "rope", "nope", "rope"]}, "'nope' is unknown"),
    ("hybrid", {}, "needs `layers`"),
    ("rope", {"rotary_dim": 7}, "rotary_dim must be even"),
    ("rope", {"bse": 1.0}, "no option 'bse'; valid options: base, rotary_dim, interleaved"),
    ("wavelet", {}, "unknown encoding 'wavelet'; valid: sinusoidal"),
])
def test_bad_encoding_options_are_named(name, options, message):
    with pytest.raises(ValueError, match=message):
        build_encoding(name, options, **DIMS)


def test_registry_is_complete():
    assert set(ENCODINGS) == {"sinusoidal", "learned", "t5_bias", "rope", "alibi", "hybrid", "none",
                              "rope_2d", "rope_mixed", "mrope", "sincos_2d", "learned_2d", "rel_bias_2d",
                              "window_rel_bias_2d"}


def test_the_schemas_axes_are_the_encodings():
    """spec/schema.py spells out each encoding's axes (it must not import torch)."""
    from portable_pe.spec.schema import ENCODING_AXES
    assert ENCODING_AXES == {name: cls.axes for name, cls in ENCODINGS.items() if name != "hybrid"} | {"hybrid": None}


@pytest.mark.parametrize("name,equivariant", [("none", True), ("sinusoidal", False), ("rope", False)])
def test_no_position_encoder_is_permutation_equivariant_and_the_others_are_not(name, equivariant):
    """The baseline carries no position: permuting the tokens only permutes the outputs."""
    from portable_pe.spec.graphs import load_graph
    x, perm = torch.randn(1, 12, 256, generator=torch.Generator().manual_seed(0)), torch.randperm(12)
    model = load_graph(name).build()
    with torch.no_grad():
        out, out_perm = model(x, torch.arange(12)), model(x[:, perm], torch.arange(12))
    # an exact property up to float32 summation order; a position encoding moves it by O(1)
    assert torch.allclose(out[:, perm], out_perm, atol=1e-5) is equivariant, name
