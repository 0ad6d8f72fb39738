"""Untuned CPU schedules for Relax-compiled Transformer encoders (TVM 0.27).

The stock Relax CPU pipeline (``relax/backend/cpu_generic/pipeline.py``) legalizes
and fuses operators but applies no schedule: every PrimFunc stays a serial,
scalar loop nest.  This module adds a rule-based scheduler, in the spirit of
``tvm.s_tir.dlight`` GPU rules, that gives every PrimFunc a parallel,
vectorized, register-tiled CPU schedule without any tuning:

* matmul / dense / batch-matmul (``C[..., i, j] += A[..., i, k] * B[..., k, j]``,
  including 4-D attention matmuls with a symbolic sequence length) get a
  register-blocked micro-kernel: ``i`` tiled by ``MI`` rows (unrolled), ``j``
  tiled by ``NJ`` lanes (vectorized), the reduction innermost over the tile,
  epilogue (bias, scale, GELU, residual ...) computed per tile; a constant weight
  is stored as contiguous ``[N/NJ, K, NJ]`` panels, packed once at compile time; on
  AVX-512, a float32 dense over such a weight calls a 12 x 32 micro-kernel written in
  LLVM IR instead (``f32_tiles``, ``f32_dense``);
* attention (``softmax(Q·Kᵀ·c [+ bias])·V``) is replaced, before legalization, by one
  kernel that keeps each block of score rows in cache;
* row reductions (softmax, layer-norm, RMS-norm, mean ...) get one parallel
  loop over rows, with all the row's stages computed inside it and the
  elementwise stages vectorized;
* everything else (transposes, RoPE slice/concat chains, splits, casts, ...)
  gets the generic rule: parallel outer fused loop, vectorized inner loop, work items
  of at least a few hundred elements; a concat along the vector dim (RoPE's rotate-half)
  is vectorized in parts, and a transposed copy along a dynamic dim (Kᵀ) in tiles;
* whoever scheduled a kernel (these rules or a tuning database), a parallel nest
  whose work is too small to pay for waking the thread pool runs serially;
* the matmuls' and attention's work items are claimed by the threads at run time, each
  thread's static share first, instead of split statically (``work_claims``, a TIR pass
  after lowering: ``cpu_tir_pipeline(target)`` for ``tvm.compile(..., tir_pipeline=...)``);
* in the same pipeline, bf16 roundings that vectorized to 16 lanes become one
  ``vcvtneps2bf16`` where the CPU has AVX512-BF16 (``bf16_rounding``).

Symbolic extents are handled by splitting with fixed factors; TVM adds a
predicate for the tail and the TIR ``LoopPartition`` pass peels it.

Every function is scheduled independently inside ``try``: if a rule raises, the
function is left unscheduled (logged at debug level) and the compile goes on.

Public API
----------
``cpu_schedule_passes(target) -> list[Pass]``
    Passes to insert after legalization/fusion, before TIR lowering.
``cpu_pipeline(target) -> Pass``
    A full Relax pipeline for ``tvm.compile(..., relax_pipeline=...)``.
``work_claims.cpu_tir_pipeline(target) -> str``
    The TIR pipeline to build it with (TVM's default, then ``ClaimWork`` and
    ``NativeBF16Rounding``).

Modules
-------
``tir_util``   target facts (SIMD lanes, cores) and small TIR inspection helpers
``relax_util`` a Relax tensor's dtype and dims; one mutator over every Relax function
``loops``      the parallel and vector loops every rule shapes (work-item sizes)
``spatial``    inlining and the generic injective rule
``concat_lanes``  a concat along the vector dim, vectorized in parts (no per-lane select)
``transpose_tiles``  a transposed copy along a dynamic dim, computed in tiles
``transpose_8x8``  x86: its whole tiles written in 8 x 8 register blocks (LLVM IR kernel)
``matmul``     matmul matching and the register-blocked micro-kernel schedule
``f32_tiles``  the float32 AVX-512 micro-kernel (12 x 32, LLVM IR) and its tensor intrinsic
``f32_dense``  the float32 dense schedule around it: (row tile, core group) work items
``reduction``  the row-reduction-chain rule (softmax / norms)
``fast_math``  ``CPUFastMath``: vectorizable gelu/softmax/exp/erf/tanh (bf16 builds: a cheaper
               erf), x / constant as x · (1/constant)
``attention`` ``FuseAttention``: softmax(Q·Kᵀ·c [+ bias])·V as one hand-scheduled kernel
``head_reshapes``  ``FusableHeadReshapes``: head splits/merges FuseOps can fuse at a symbolic T
``patch_stem``  ``PatchStemAsMatmul``: a vision stem (conv, stride = kernel) as a matmul
``dim_vars``   ``WithNamedDims``: a pixel graph's compound dims (its token count) as variables
``weight_packing``  constant weights marked, packing split out and folded at compile time
``small_work`` ``SerialWhenSmall``: serial copies of parallel nests, chosen by work size
``work_claims``  ``ClaimWork``: annotated parallel loops whose items threads claim at run time
``bf16_rounding``  ``NativeBF16Rounding``: 16-lane bf16 roundings as one vcvtneps2bf16
``softmax_rows``  the attention kernels' per-row max and 1/sum, reduced by halving
``pipeline``   rule dispatch per PrimFunc and the Relax pass lists / pipeline
"""

from .fast_math import CPUFastMath
from .pipeline import (
    ApplyTuningDatabase,
    CPUDefaultSchedule,
    cpu_pipeline,
    cpu_schedule_passes,
    fusion_passes,
    schedule_prim_func,
)

__all__ = ["cpu_schedule_passes", "cpu_pipeline", "fusion_passes", "ApplyTuningDatabase", "schedule_prim_func",
           "CPUDefaultSchedule", "CPUFastMath"]
