"""bf16 matmul rule: ``C[..., i, j] += f32(A[..., i, k]) * f32(W[k, j])`` over uint16 bit
patterns (what bf16_linear emits), with a constant W packed [N/16, K/2, 16, 2].

With AMX (bf16_isa), amx_matmul's schedule: one 32 x 32 block of C per micro-kernel call
(K/32 steps of 4 tdpbf16ps), its epilogue (bias, activation, residual, the next rounding
to bf16) right after, while in L1. Without AMX (or when N or K is not a multiple of 32),
vdpbf16ps in the int8 kernels' register-tiled schedule; on aarch64, BFMMLA in that
schedule (bf16_neon).
"""

from __future__ import annotations

from .amx_matmul import schedule_amx_matmul
from .bf16_isa import AVX512_BF16, bf16_kernel
from .bf16_neon import NEON_BFMMLA, fits_bfmmla
from .int8_matmul import schedule_dot_matmul
from .tir_util import _region_buffer


def is_bf16_matmul(sch, mm_block) -> bool:
    """A float32 reduction over uint16 (bf16 bit pattern) operands."""
    stmt = sch.get(mm_block)
    out = _region_buffer(stmt.writes[0])
    inputs = {str(_region_buffer(r).dtype) for r in stmt.reads if not _region_buffer(r).same_as(out)}
    return str(out.dtype) == "float32" and inputs == {"uint16"}


def fits_avx512(k: int, n: int) -> bool:
    return k % AVX512_BF16.kg == 0 and n % AVX512_BF16.lanes == 0


#: the shapes (K, N) each kernel takes; bf16_linear keeps the others float32 (AMX: all of
#: them, padded to its tiles there)
FITS = {"amx-bf16": lambda k, n: True, "avx512-bf16": fits_avx512, "neon-bfmmla": fits_bfmmla}


def schedule_bf16_matmul(sch, mm_block, other_blocks, target) -> bool:
    kernel = bf16_kernel(target)
    if kernel is None:
        return False
    if kernel == "neon-bfmmla":
        return schedule_dot_matmul(sch, mm_block, other_blocks, NEON_BFMMLA)
    if kernel == "amx-bf16" and schedule_amx_matmul(sch, mm_block, other_blocks, target, "bf16"):
        return True
    return schedule_dot_matmul(sch, mm_block, other_blocks, AVX512_BF16)
