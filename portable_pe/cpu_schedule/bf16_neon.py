"""The aarch64 bf16 kernel: BFMMLA (FEAT_BF16) in the int8 kernels' register-tiled schedule.

BFMMLA multiplies a 2 x 4 bf16 matrix (two activation rows of 4) by a 4 x 2 one (two
weight columns of 4) into a 2 x 2 float32 tile, as SMMLA does for int8 with 8-element
rows (int8_isa): the same 2-row instruction in the same schedule (int8_matmul), with the
weights packed [N/NJ, K/4, NJ, 4] so that one instruction's two columns are 8 contiguous
bf16 values. Its products are exact and it accumulates in float32; without FEAT_EBF16
the sums round to odd and flush subnormals to zero, which moves the result by float32
rounding steps, far inside the bf16_linear tolerance that the rounded operands need.

TVM 0.27's LLVM backend has no bfloat type, so the instruction sits in a few lines of
LLVM IR taking ``<8 x i16>`` (the bf16 bit patterns the kernel loads as uint16) and
bitcasting them, imported into each kernel with ``pragma_import_llvm``, as the x86
vdpbf16ps kernel does (bf16_isa).
"""

from __future__ import annotations

from tvm.script import tirx as T

from .bf16_isa import widen
from .int8_isa import DotIsa
from .mmla import register_mmla

_BFMMLA_IR = r"""
declare <4 x float> @llvm.aarch64.neon.bfmmla(<4 x float>, <8 x bfloat>, <8 x bfloat>)
define internal <4 x float> @portable_pe_bfmmla(<4 x float> %acc, <8 x i16> %a, <8 x i16> %b) alwaysinline {
  %ab = bitcast <8 x i16> %a to <8 x bfloat>
  %bb = bitcast <8 x i16> %b to <8 x bfloat>
  %r = call <4 x float> @llvm.aarch64.neon.bfmmla(<4 x float> %acc, <8 x bfloat> %ab, <8 x bfloat> %bb)
  ret <4 x float> %r
}
"""


def _bfmmla(tile, rows, columns):
    return T.call_extern("float32x4", "portable_pe_bfmmla", tile, rows, columns)


# two activation rows of 4 bf16 values by two weight columns of 4 into a 2 x 2 float32 tile
_BFMMLA = register_mmla("portable_pe_bfmmla_2x2x4", "uint16", 4, "float32", widen, _bfmmla)

#: an 8 x 8 float32 tile as in neon-i8mm: 16 accumulator registers, 4 weight and 4 row vectors.
#: The tile's 2 x 2 blocks lie in the accumulator array as two rows of 2, so around every
#: step LLVM splits each result into those halves and joins them again (an ext and a mov
#: per bfmmla, kept in the loop's registers as halves): 4 steps unrolled pay that once.
#: Measured in the K = 256 loop: 74 instructions per 16 bfmmla, 165 per 64 unrolled.
NEON_BFMMLA = DotIsa("neon-bfmmla", "uint16", "uint16", 2, 4, _BFMMLA, 8, 4, rows=2, llvm_ir=_BFMMLA_IR,
                     k_unroll=4)


def fits_bfmmla(k: int, n: int) -> bool:
    """The shapes the kernel takes as they are (bf16_linear keeps the others float32)."""
    return k % NEON_BFMMLA.kg == 0 and n % NEON_BFMMLA.lanes == 0
