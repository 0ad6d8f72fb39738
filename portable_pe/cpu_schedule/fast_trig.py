"""float32 sin and cos from TIR arithmetic only, so the position tables' loops vectorize.

LLVM has no vector sin/cos on x86 or aarch64 without a vector math library: a vectorized
``T.sin`` becomes one libm call per element (sinf@plt). The position tables are computed
every run (positions are an input): with libm, the sinusoidal graph's table kernel (which
also adds the table to x) took 0.123 ms at B = 1 T = 128, 0.072 with these; RoPE's cos and
sin tables at B = 1 T = 512 0.245 ms, 0.064 (kernel_profile, 2 threads, Zen 3). That is
about 1% of those graphs, within a whole-graph A/B's noise.

    sin x = ±sin r or ±cos r,  r = x - k·π/2,  k = nearest integer to x·2/π,  |r| <= π/4

The reduction runs in float64: for |x| up to 1e7 (float32 positions times frequencies
stop being integers at 2^24) k·π/2 is off by under 1e-9, so r, rounded to float32, is as
exact as the argument; a float32 reduction in parts (Cody-Waite) loses digits as k grows,
and positions times frequency reach max_length radians, more with position offsets.
sin r and cos r are Cephes' single-precision polynomials on [-π/4, π/4]; the quadrant
k mod 4 picks the polynomial and the sign. Measured within 9.2e-8 of numpy's float64
sin/cos on arguments to 1e7 (tests/test_fast_math.py; libm's sinf: 7e-8). No integer
conversion of k: an infinite or NaN x gives NaN, as libm's, instead of a poisoned cast.
"""

from __future__ import annotations

import math

from .tir_util import horner_f32

#: sin r = r + r^3 (s0 + s1 r^2 + s2 r^4) on [-π/4, π/4] (Cephes sinf)
_SIN = (-1.6666654611e-1, 8.3321608736e-3, -1.9515295891e-4)
#: cos r = 1 - r^2/2 + r^4 (c0 + c1 r^2 + c2 r^4) on [-π/4, π/4] (Cephes cosf)
_COS = (4.166664568298827e-2, -1.388731625493765e-3, 2.443315711809948e-5)


def fast_sin(x, *, cosine: bool = False):
    """sin(x), or cos(x) with `cosine` (= sin(x + π/2): one quadrant on), for a float32
    TIR expression x."""
    from tvm import tirx
    f32, f64 = "float32", "float64"
    xd = tirx.Cast(f64, x)
    k = tirx.nearbyint(xd * tirx.const(2.0 / math.pi, f64))
    r = tirx.Cast(f32, xd - k * tirx.const(math.pi / 2.0, f64))
    s = r * r
    sin_r = r + r * s * horner_f32(_SIN, s)
    cos_r = tirx.const(1.0, f32) - tirx.const(0.5, f32) * s + s * s * horner_f32(_COS, s)
    quadrant = k + tirx.const(1.0 if cosine else 0.0, f64)
    quadrant = quadrant - tirx.const(4.0, f64) * tirx.floor(quadrant * tirx.const(0.25, f64))  # 0, 1, 2 or 3
    # compared as float32 (exact for 0..3): float64 masks would be repacked for each select
    quadrant = tirx.Cast(f32, quadrant)
    odd = tirx.Or(quadrant == tirx.const(1.0, f32), quadrant == tirx.const(3.0, f32))
    value = tirx.Select(odd, cos_r, sin_r)
    return tirx.Select(quadrant >= tirx.const(2.0, f32), -value, value)


def fast_sin_te(x):
    from tvm import te
    return te.compute(x.shape, lambda *i: fast_sin(x(*i)), name="fast_sin")


def fast_cos_te(x):
    from tvm import te
    return te.compute(x.shape, lambda *i: fast_sin(x(*i), cosine=True), name="fast_cos")
