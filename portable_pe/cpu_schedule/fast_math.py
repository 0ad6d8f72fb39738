"""Relax-level fast math: ``CPUFastMath`` rewrites float32 gelu/softmax/exp/erf/tanh/sigmoid
to TOPI's vectorizable approximations, sin and cos to fast_trig's, and a division by a
constant scalar to a multiplication by its reciprocal (applied before legalization)."""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relax
from tvm.ir import IRModule

from .relax_util import _mutate_relax_functions, constant_array
from .tir_util import horner_f32

_LOG2E = 1.4426950408889634
# ln 2 in two parts (Cody-Waite): n * _LN2_HI is exact in float32 for |n| <= 127, so
# r = x - n ln2 keeps its precision; one float32 ln 2 would cost n * 2e-8 of it.
_LN2_HI = 0.693359375
_LN2_LO = -2.12194440e-4


def _fast_exp(x, degree: int = 7, *, nonpositive: bool = False):
    """float32 exp(x) from TIR arithmetic only, so it vectorizes (LLVM scalarizes
    ``llvm.exp`` into libm calls on x86). exp(x) = 2^n · e^r with n = round(x·log2 e)
    and |r| <= ln2/2; e^r by its degree-7 Taylor polynomial (truncation error
    below 3e-9 relative, under float32 rounding; degree 5: below 2.5e-6, for values
    rounded to bf16 next, whose half step is 2e-3); 2^n assembled in the exponent
    bits. x is clamped to [-88, 88.3], which keeps n in [-127, 127]: -inf (the padded
    columns) and anything below about -87.7 give exactly 0 (n = -127 makes the
    exponent field 0); above 88.3 the result saturates at exp(88.3) ~ 2e38 instead of
    overflowing (softmax only calls it on s - max <= 0).

    `nonpositive`: x <= 0 is known (softmax's s - max), so only the lower clamp. (2^n by
    llvm.ldexp, vscalefps on AVX-512, was tried in the AMX attention kernel: 1% faster
    on learned bf16 B1 T512, 9% slower on alibi's, same process.)"""
    from tvm import tirx
    f32 = "float32"
    x = tirx.max(x if nonpositive else tirx.min(x, tirx.const(88.3, f32)), tirx.const(-88.0, f32))
    n = tirx.floor(x * tirx.const(_LOG2E, f32) + tirx.const(0.5, f32))
    r = (x - n * tirx.const(_LN2_HI, f32)) - n * tirx.const(_LN2_LO, f32)
    poly = tirx.const(1.0 / math.factorial(degree), f32)
    for k in range(degree - 1, -1, -1):
        poly = poly * r + tirx.const(1.0 / math.factorial(k), f32)
    bits = tirx.shift_left(tirx.Cast("int32", n) + tirx.const(127, "int32"), tirx.const(23, "int32"))
    return poly * tirx.reinterpret(f32, bits)


# --------------------------------------------------------------------------------------
# Relax-level fast math (optional): vectorizable polynomial exp / erf / tanh
# --------------------------------------------------------------------------------------
# LLVM has no vector erf/exp for x86 without a vector math library, so a
# vectorized T.erf / T.exp is scalarized into libm calls (~20 cycles/element).
# TOPI's fast_* variants are polynomial/rational approximations (float32 error
# well under 1e-6) that vectorize.  Applied before legalization.
#: erf(u) ~ u·P(u²)/Q(u²) on |u| <= 4 (clamped outside, where erf rounds to ±1 in
#: float32), P of degree 4 and Q of degree 3 in u², for bf16 builds, whose activations are
#: rounded to bf16 (a relative step of 2^-8) where they are produced: its error, at most
#: 5e-6 (tests/test_fast_math.py holds it against scipy), moves a value across a rounding
#: boundary at most about once in 400 (twice the error over the step). TOPI's fast_erf has
#: degrees 6 and 4 (error ~4e-7); in the bf16 FFN dense's epilogue (1024 x 256 x 1024, 2
#: threads) the GELU took 0.136 ms with it and 0.105 ms with this one, of a 0.485 ms
#: kernel; the learned graph in bf16, B = 8, paired runs: 0.98 of its time at T = 128 and
#: at T = 512 (max abs against PyTorch 3.75e-3 -> 3.85e-3 at T = 128). Fitted by linearized least
#: squares on the relative error (Sanathanan-Koerner iterations, then Lawson's weights
#: towards minimax) at 4000 Chebyshev points of [0, 4].
_BF16_ERF_P = (1.1283844, 0.16336659, 0.047228996, 0.0010736836, -4.5055644e-06)
_BF16_ERF_Q = (1.0, 0.4782122, 0.10091568, 0.011048691)


def _bf16_erf(u):
    """erf(u) to 5e-6 from the rational above, as a TIR expression of a float32 u."""
    from tvm import tirx
    f32 = "float32"
    u = tirx.max(tirx.min(u, tirx.const(4.0, f32)), tirx.const(-4.0, f32))
    s = u * u
    return u * horner_f32(_BF16_ERF_P, s) / horner_f32(_BF16_ERF_Q, s)


def _bf16_erf_te(x):
    from tvm import te  # pylint: disable=import-outside-toplevel
    return te.compute(x.shape, lambda *i: _bf16_erf(x(*i)), name="bf16_erf")


def _fast_gelu_te(x, bf16: bool = False):
    """x·Φ(x) = x·(1 + erf(x/√2))/2, erf by TOPI's fast_erf, or `bf16`: by _bf16_erf."""
    from tvm import te, topi  # pylint: disable=import-outside-toplevel

    half = tvm.tirx.const(0.5, x.dtype)
    scaled = te.compute(x.shape, lambda *i: x(*i) * tvm.tirx.const(0.7071067811865476, x.dtype),
                        name="gelu_scaled")
    erf = _bf16_erf_te(scaled) if bf16 else topi.fast_erf(scaled)
    return te.compute(x.shape, lambda *i: x(*i) * (half + half * erf(*i)), name="gelu_out")


def _fast_sigmoid_te(x):
    """1 / (1 + exp(-x)) with TOPI's fast_exp (SiLU gates: Llama-style MLPs)."""
    from tvm import te, topi  # pylint: disable=import-outside-toplevel

    one = tvm.tirx.const(1.0, x.dtype)
    e = topi.fast_exp(te.compute(x.shape, lambda *i: -x(*i), name="sigmoid_neg"))
    return te.compute(x.shape, lambda *i: one / (one + e(*i)), name="sigmoid_out")


@relax.expr_functor.mutator
class _FastMathMutator(relax.PyExprMutator):  # pylint: disable=abstract-method
    def __init__(self, mod: IRModule, bf16: bool = False):
        super().__init__(mod)
        self.bf16 = bf16  # a bf16 build: gelu and erf by _bf16_erf

    def visit_call_(self, call):  # pylint: disable=arguments-renamed
        call = super().visit_call_(call)
        op = getattr(call, "op", None)
        name = getattr(op, "name", None)
        if name is None or not call.args:
            return call
        try:
            # TVM 0.27: Relax vars expose ``ty`` (TensorType), not ``struct_info``.
            arg = call.args[0]
            ty = getattr(arg, "struct_info", None) or getattr(arg, "ty", None)
            if ty is None or str(ty.dtype) != "float32":
                return call
        except Exception:  # pylint: disable=broad-except
            return call
        from tvm import topi  # pylint: disable=import-outside-toplevel

        if name == "relax.nn.gelu":
            return self.builder_.call_te(_fast_gelu_te, call.args[0], self.bf16, primfunc_name_hint="fast_gelu")
        if name == "relax.nn.softmax":
            return self.builder_.call_te(topi.nn.fast_softmax, call.args[0], int(call.attrs.axis),
                                         primfunc_name_hint="fast_softmax")
        if name == "relax.exp":
            return self.builder_.call_te(topi.fast_exp, call.args[0], primfunc_name_hint="fast_exp")
        if name == "relax.erf":
            return self.builder_.call_te(_bf16_erf_te if self.bf16 else topi.fast_erf, call.args[0],
                                         primfunc_name_hint="fast_erf")
        if name == "relax.sigmoid":
            return self.builder_.call_te(_fast_sigmoid_te, call.args[0], primfunc_name_hint="fast_sigmoid")
        if name == "relax.tanh":
            return self.builder_.call_te(topi.fast_tanh, call.args[0], primfunc_name_hint="fast_tanh")
        if name in ("relax.sin", "relax.cos"):
            from .fast_trig import fast_cos_te, fast_sin_te
            return self.builder_.call_te(fast_sin_te if name == "relax.sin" else fast_cos_te, call.args[0],
                                         primfunc_name_hint=f"fast_{name[6:]}")
        if name == "relax.divide":
            return _times_reciprocal(call)
        return call


def _times_reciprocal(call):
    """x / c as x · (1/c) for a float32 constant scalar c whose reciprocal is a normal float32.

    A vector division is one instruction per 16 floats with a throughput of about 10 cycles,
    and exports put one in the dense's epilogue: DINOv3's GELU is x/sqrt(2) then erf.
    That dense (1608 x 384 x 1536, one thread) took 13.46 ms with the division and 12.90
    with the multiplication. The result differs from the division's by at most an ulp or
    so, as compilers' -freciprocal-math does."""
    value = constant_array(call.args[1])
    if value is None or value.size != 1 or value.dtype != np.float32:
        return call
    with np.errstate(divide="ignore", over="ignore"):
        inverse = (1.0 / value.astype(np.float64)).astype(np.float32)
    if not np.isfinite(inverse).all() or abs(float(inverse.reshape(()))) < np.finfo(np.float32).tiny:
        return call
    return relax.op.multiply(call.args[0], relax.const(inverse))


@tvm.transform.module_pass(opt_level=0, name="CPUFastMath")
class CPUFastMath:  # pylint: disable=too-few-public-methods
    """Rewrite float32 gelu/softmax/exp/erf/tanh/sigmoid/sin/cos to vectorizable
    approximations and x / constant to x · (1/constant). `bf16`: a --precision bf16 build (_bf16_erf)."""

    def __init__(self, bf16: bool = False):
        self.bf16 = bf16

    def transform_module(self, mod: IRModule, _ctx) -> IRModule:
        return _mutate_relax_functions(_FastMathMutator(mod, self.bf16), mod, skip_failures="fast math")
