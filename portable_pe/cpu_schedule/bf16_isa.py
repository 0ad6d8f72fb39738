"""Which bf16 matmul instruction an x86 target has, and the kernels' building blocks.

A bf16 matmul here multiplies bf16 activations by bf16 weights into float32 accumulators
(``bf16_linear`` rounds the activations, round to nearest even, and stores the weights).
bf16 values travel as uint16 (their bit patterns): TVM 0.27's LLVM backend has no bfloat
type, so each instruction sits in a few lines of LLVM IR that take ``<N x i16>`` and
bitcast to bfloat (imported into the kernel with ``pragma_import_llvm``; LLVM inlines it):

    kernel       instruction                          per instruction            needs
    amx-bf16     tdpbf16ps tmm: [16 x 32] x [32 x 16]  16384 flops (a 16x16 tile)  amx-tile, amx-bf16
    avx512-bf16  vdpbf16ps zmm: 16 lanes x 2 pairs     64 flops                    avx512bf16
    neon-bfmmla  bfmmla v.4s: [2 x 4] x [4 x 2]        32 flops (a 2x2 tile)       bf16 (aarch64)

The aarch64 kernel is bf16_neon's.

AMX's tile micro-kernel, its tile scopes and tensor intrinsic are amx_tiles'.
"""

from __future__ import annotations

from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T

from .int8_isa import DotIsa, _features


#: each architecture's kernels, best first, with what each needs as LLVM names its target
#: features (the errors name them). aarch64's FEAT_BF16 brings BFMMLA and BFDOT together;
#: BFMMLA does twice BFDOT's multiply-adds per instruction, so it is the one kernel there.
KERNELS = {"x86": {"amx-bf16": ("amx-tile", "amx-bf16"), "avx512-bf16": ("avx512bf16",)},
           "aarch64": {"neon-bfmmla": ("bf16",)}}
KERNEL_FEATURES = {name: needs for kernels in KERNELS.values() for name, needs in kernels.items()}


def needed_features(arch: str | None) -> str:
    """What `arch`'s bf16 kernels need, as errors name it: "amx-tile+amx-bf16 or avx512bf16"."""
    return " or ".join("+".join(needs) for needs in KERNELS.get(arch, {}).values())


def target_arch(target) -> str | None:
    """"x86", "aarch64", or None (32-bit arm: no bf16 kernel), from the target's triple."""
    triple = str(target.attrs.get("mtriple", "")) if target is not None else ""
    if "aarch64" in triple or "arm64" in triple:
        return "aarch64"
    return None if "arm" in triple else "x86"


def bf16_kernel(target) -> str | None:
    """The best bf16 kernel (a KERNELS name) `target` has the features for, or None."""
    features = _features(target)
    kernels = KERNELS.get(target_arch(target), {})
    return next((name for name, needs in kernels.items() if set(needs) <= features), None)


def widen(load):
    """A bf16 bit pattern (uint16) as the float32 it is: the high half of the word."""
    return T.reinterpret("float32", T.shift_left(T.Cast("uint32", load), T.uint32(16)))


# --------------------------------------------------------------------------------------
# avx512-bf16: vdpbf16ps, C[16] += A[0] * B[16, 0] + A[1] * B[16, 1] (the pair broadcast)
# --------------------------------------------------------------------------------------
_DPBF16_IR = r"""
declare <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float>, <32 x bfloat>, <32 x bfloat>)
define internal <16 x float> @portable_pe_dpbf16ps(<16 x float> %acc, <32 x i16> %a, <32 x i16> %b) alwaysinline {
  %ab = bitcast <32 x i16> %a to <32 x bfloat>
  %bb = bitcast <32 x i16> %b to <32 x bfloat>
  %r = call <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float> %acc, <32 x bfloat> %ab, <32 x bfloat> %bb)
  ret <16 x float> %r
}
"""


def _dpbf16_desc():
    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (2,), "uint16", offset_factor=1)
        B = T.match_buffer(b, (16, 2), "uint16", offset_factor=1)
        C = T.match_buffer(c, (16,), "float32", offset_factor=1)
        with T.sblock("root"):
            T.reads(C[0:16], A[0:2], B[0:16, 0:2])
            T.writes(C[0:16])
            for i, k in T.grid(16, 2):
                with T.sblock("update"):
                    vi, vk = T.axis.remap("SR", [i, k])
                    C[vi] = C[vi] + widen(A[vk]) * widen(B[vi, vk])
    return desc


def _dpbf16_impl():
    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (2,), "uint16", offset_factor=1)
        B = T.match_buffer(b, (16, 2), "uint16", offset_factor=1)
        C = T.match_buffer(c, (16,), "float32", offset_factor=1)
        with T.sblock("root"):
            T.reads(C[0:16], A[0:2], B[0:16, 0:2])
            T.writes(C[0:16])
            pair = T.reinterpret(A.vload([0], "uint16x2"), dtype="int32")
            C[T.ramp(T.int32(0), 1, 16)] = T.call_extern(
                "float32x16", "portable_pe_dpbf16ps", C.vload([0], "float32x16"),
                T.reinterpret(T.broadcast(pair, 16), dtype="uint16x32"), B.vload([0, 0], "uint16x32"))
    return impl


_DPBF16 = "portable_pe_vdpbf16ps_16x2"
if TensorIntrin.get(_DPBF16, allow_missing=True) is None:
    TensorIntrin.register(_DPBF16, _dpbf16_desc(), _dpbf16_impl())

#: the vdpbf16ps kernel as the int8 kernels' register-tiled schedule takes it (int8_matmul)
AVX512_BF16 = DotIsa("avx512-bf16", "uint16", "uint16", 16, 2, _DPBF16, 7, 2, llvm_ir=_DPBF16_IR)


# 16 float32 rounded to bf16 (to nearest even) in one vcvtneps2bf16 (LLVM's fptrunc to
# bfloat with avx512bf16), where bf16_bits_expr takes about eight integer instructions.
# It flushes subnormal inputs to zero, as bf16_bits_expr does not: for softmax
# probabilities, whose row sums are at least 1, a difference below 1.2e-38.
BF16_ROUND_IR = r"""
define internal <16 x i16> @portable_pe_bf16x16(<16 x float> %x) alwaysinline {
  %b = fptrunc <16 x float> %x to <16 x bfloat>
  %r = bitcast <16 x bfloat> %b to <16 x i16>
  ret <16 x i16> %r
}
"""
