"""Which integer dot product a CPU target has, and the tensor intrinsics that use it.

An int8 matmul micro-kernel multiplies a broadcast group of KG activations by a
[LANES, KG] panel of weights into LANES int32 accumulators, one instruction per group:

    isa            instruction                      operands        LANES  KG
    avx512-vnni    vpdpbusd zmm                     uint8 x int8    16     4
    avx-vnni       vpdpbusd ymm (VEX)               uint8 x int8     8     4
    avx512bw       vpmaddwd zmm + vpaddd            int16 x int16   16     2
    avx2-u8s7      vpmaddubsw, vpmaddwd(1), vpaddd  uint8 x int7     8     4   (|w| <= 64)
    avx2           vpmaddwd ymm + vpaddd            int16 x int16    8     2
    neon-i8mm      smmla v.4s: a 2 x 2 tile         int8 x int8      2     8   (2 rows)
    neon-dotprod   sdot v.4s                        int8 x int8      4     4
    neon           smlal (LLVM picks it; no intrin) int16 x int16    4     1
With AMX-INT8 (``has_amx_int8``), int8_matmul runs avx512-vnni's operands on the tiles
instead (tdpbusd: 32 x 32 int32 blocks, amx_matmul) wherever K and N fit them.

smmla (FEAT_I8MM) multiplies two rows of 8 activations by two columns of 8 weights into
a 2 x 2 int32 tile: 32 multiply-adds per instruction against sdot's 16. Its instruction
covers ROWS = 2 rows of the register tile, so the schedule gives it a (2, LANES) block.

Without VNNI, x86 has no exact 8-bit dot product: vpmaddubsw adds two uint8 x int8
products into a saturating int16 (255 * 127 * 2 > 32767), which is why onnxruntime's
U8S8 kernels lose accuracy on AVX2 machines with full-range weights. With weights within
+-64 no pair can saturate (255 * 64 * 2 = 32640), so ``avx2-u8s7`` is exact: vpmaddubsw
makes int16 pairs, vpmaddwd by ones adds them into int32 lanes, vpaddd accumulates. That
is onnxruntime's own advice for CPUs without VNNI (its quantizer's ``reduce_range``: 7-bit
weights), and what ``--precision int8`` quantizes to where this kernel is the target's
(``int8_isas``: quant/qdq.py). It takes three instructions per 32 multiply-adds where
vpmaddwd + vpaddd take four: on a Zen 3 core vpmaddwd and vpmaddubsw share two ports, and
vpmaddwd next to its vpaddd ran at 1.5 per cycle (a loop of the pair in assembly), so the
7-bit kernel's ceiling is 32 multiply-adds a cycle against 24, with half the bytes per
operand and half the broadcasts (the learned graph's int8 matmuls at B=8 T=128 profiled
1.4-2x faster than on the int16 kernel). Weights outside +-64 (a QDQ graph quantized
elsewhere) take ``avx2``: widened to int16, vpmaddwd adds pairs into int32 exactly. The
activations are quantized to 8 bits either way. aarch64 NEON without the dot product
extension gets plain TIR (int16 operands) that LLVM turns into smlal by-element
multiply-accumulates.

The kernel's operand types decide how the Relax pass stores weights and converts the
quantized activations (``quant_matmul``); the schedule rule (``int8_matmul``) tensorizes
with ``intrin``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T

from .mmla import register_mmla


@dataclass(frozen=True)
class DotIsa:
    """A dot-product micro-kernel's instruction: the int8 ones here, bf16's in bf16_isa."""
    name: str
    a_dtype: str        # the activation operand in the kernel
    w_dtype: str        # the weight operand (packed [N/NJ, K/KG, NJ, KG])
    lanes: int          # int32 accumulators per instruction
    kg: int             # reduction elements per accumulator per instruction
    intrin: str | None  # registered TensorIntrin; None: plain TIR, LLVM picks instructions
    tile_rows: int      # MI: rows of the register tile ...
    tile_vectors: int   # ... by this many vectors of LANES int32 (fits the SIMD register file)
    rows: int = 1       # tile rows one instruction covers (smmla: 2)
    llvm_ir: str | None = None  # LLVM IR the intrinsic calls (imported into each kernel using it)
    k_unroll: int = 1   # reduction steps unrolled together (a power of two)
    w_max: int | None = None  # the largest |weight| the instruction keeps exact (None: any int8)

    def takes(self, weights: np.ndarray) -> bool:
        """Whether this kernel computes with these int8 weights exactly."""
        return self.w_max is None or int(np.abs(weights.astype(np.int16)).max(initial=0)) <= self.w_max


def _features(target) -> set[str]:
    from tvm.target.codegen import llvm_get_cpu_features
    try:
        return set(llvm_get_cpu_features(target))
    except Exception:  # pylint: disable=broad-except
        return set()


AMX_INT8_FEATURES = ("amx-tile", "amx-int8")


def has_amx_int8(target) -> bool:
    """Whether `target` has AMX-INT8 (tdpbusd on tiles: Sapphire Rapids and later Xeons)
    with VNNI's uint8 x int8 operands, which tdpbusd takes: int8_matmul then uses the tiles
    before the dot product below where the shape fits."""
    return set(AMX_INT8_FEATURES) <= _features(target) and int8_isa(target).a_dtype == "uint8"


def int8_isa(target) -> DotIsa:
    """The best integer dot product `target` has (by its LLVM CPU features)."""
    return int8_isas(target)[0]


def int8_isas(target) -> tuple[DotIsa, ...]:
    """`target`'s integer dot products, best first: each matmul takes the first whose
    ``w_max`` its weights fit (quant_matmul), the schedule the one whose operands the
    matmul has (int8_matmul). Only AVX2 without VNNI has two: the 7-bit kernel, then the
    int16 one for full-range weights."""
    best = _best_isa(target)
    return (best, ISAS["avx2"]) if best.name == "avx2-u8s7" else (best,)


def reduces_weight_range(target) -> bool:
    """Whether `target`'s best int8 kernel needs weights within +-64 (7 bits), so that
    ``--precision int8`` quantizes them so (onnxruntime's ``reduce_range``)."""
    return target is not None and target.kind.name == "llvm" and int8_isa(target).w_max is not None


def _best_isa(target) -> DotIsa:
    features = _features(target)
    triple = str(target.attrs.get("mtriple", "")) if target is not None else ""
    if "aarch64" in triple or "arm64" in triple:
        if "i8mm" in features:
            return ISAS["neon-i8mm"]
        if "dotprod" in features:
            return ISAS["neon-dotprod"]
        return ISAS["neon"]
    if "avx512vnni" in features:
        return ISAS["avx512-vnni"]
    if "avxvnni" in features:
        return ISAS["avx-vnni"]
    if "avx512bw" in features:
        return ISAS["avx512bw"]
    if "avx2" in features:
        return ISAS["avx2-u8s7"]
    return ISAS["generic"]


# --------------------------------------------------------------------------------------
# Tensor intrinsics: C[LANES] += sum_k A[k] * B[LANES, k], k < KG (A broadcast to every lane)
# --------------------------------------------------------------------------------------
def _desc(a_dtype: str, w_dtype: str, lanes: int, kg: int):
    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (kg,), a_dtype, offset_factor=1)
        B = T.match_buffer(b, (lanes, kg), w_dtype, offset_factor=1)
        C = T.match_buffer(c, (lanes,), "int32", offset_factor=1)
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:kg], B[0:lanes, 0:kg])
            T.writes(C[0:lanes])
            for i, k in T.grid(lanes, kg):
                with T.sblock("update"):
                    vi, vk = T.axis.remap("SR", [i, k])
                    C[vi] = C[vi] + T.Cast("int32", A[vk]) * T.Cast("int32", B[vi, vk])
    return desc


def _impl(a_dtype: str, w_dtype: str, lanes: int, kg: int, llvm_intrinsic: str, *, accumulates: bool,
          pair_sum: str | None = None):
    """A group of KG activations read as one int32 and broadcast; the panel read as one
    vector. ``accumulates``: the instruction adds into C itself (vpdpbusd, sdot);
    otherwise its int32 result is added (vpmaddwd), or, with ``pair_sum``, its int16
    result's neighbouring pairs are added into int32 lanes by that instruction first
    (vpmaddubsw, then vpmaddwd by ones)."""
    a_bits = {"uint8": 8, "int8": 8, "int16": 16}[a_dtype]
    w_bits = {"int8": 8, "int16": 16}[w_dtype]
    panel = 32 * lanes // w_bits  # operand elements in one vector of LANES int32
    a_vec, w_vec, c_vec = f"{a_dtype}x{panel}", f"{w_dtype}x{panel}", f"int32x{lanes}"
    pairs_vec = f"int16x{2 * lanes}"
    assert a_bits * kg == 32 and w_bits * kg == 32

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (kg,), a_dtype, offset_factor=1)
        B = T.match_buffer(b, (lanes, kg), w_dtype, offset_factor=1)
        C = T.match_buffer(c, (lanes,), "int32", offset_factor=1)
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:kg], B[0:lanes, 0:kg])
            T.writes(C[0:lanes])
            a_group = T.reinterpret(A.vload([0], f"{a_dtype}x{kg}"), dtype="int32")
            a_wide = T.reinterpret(T.broadcast(a_group, lanes), dtype=a_vec)
            w_panel = B.vload([0, 0], dtype=w_vec)
            if accumulates:
                C[T.ramp(T.int32(0), 1, lanes)] = T.call_llvm_pure_intrin(
                    T.llvm_lookup_intrinsic_id(llvm_intrinsic), C.vload([0], dtype=c_vec), a_wide, w_panel,
                    dtype=c_vec)
            elif pair_sum is None:
                C[T.ramp(T.int32(0), 1, lanes)] = C.vload([0], dtype=c_vec) + T.call_llvm_pure_intrin(
                    T.llvm_lookup_intrinsic_id(llvm_intrinsic), a_wide, w_panel, dtype=c_vec)
            else:
                C[T.ramp(T.int32(0), 1, lanes)] = C.vload([0], dtype=c_vec) + T.call_llvm_pure_intrin(
                    T.llvm_lookup_intrinsic_id(pair_sum),
                    T.call_llvm_pure_intrin(T.llvm_lookup_intrinsic_id(llvm_intrinsic), a_wide, w_panel,
                                            dtype=pairs_vec),
                    T.broadcast(T.int16(1), 2 * lanes), dtype=c_vec)
    return impl


def _register(name: str, a_dtype: str, w_dtype: str, lanes: int, kg: int, llvm_intrinsic: str, *,
              accumulates: bool, pair_sum: str | None = None) -> str:
    if TensorIntrin.get(name, allow_missing=True) is None:
        TensorIntrin.register(name, _desc(a_dtype, w_dtype, lanes, kg),
                              _impl(a_dtype, w_dtype, lanes, kg, llvm_intrinsic, accumulates=accumulates,
                                    pair_sum=pair_sum))
    return name


_VNNI512 = _register("portable_pe_vpdpbusd_16x4", "uint8", "int8", 16, 4, "llvm.x86.avx512.vpdpbusd.512",
                     accumulates=True)
_VNNI256 = _register("portable_pe_vpdpbusd_8x4", "uint8", "int8", 8, 4, "llvm.x86.avx512.vpdpbusd.256",
                     accumulates=True)
_PMADDWD512 = _register("portable_pe_vpmaddwd_16x2", "int16", "int16", 16, 2, "llvm.x86.avx512.pmaddw.d.512",
                        accumulates=False)
_PMADDWD256 = _register("portable_pe_vpmaddwd_8x2", "int16", "int16", 8, 2, "llvm.x86.avx2.pmadd.wd",
                        accumulates=False)
# uint8 x int8 products of neighbouring k added in int16 (exact while |w| <= 64), then
# pairs of those into int32 by vpmaddwd with ones
_MADDUBS256 = _register("portable_pe_vpmaddubsw_8x4", "uint8", "int8", 8, 4, "llvm.x86.avx2.pmadd.ub.sw",
                        accumulates=False, pair_sum="llvm.x86.avx2.pmadd.wd")


def _smmla(tile, rows, columns):
    return T.call_llvm_pure_intrin(T.llvm_lookup_intrinsic_id("llvm.aarch64.neon.smmla.v4i32.v16i8"),
                                   tile, rows, columns, dtype="int32x4")


# smmla: two activation rows of 8 bytes by two weight columns of 8 (the packed layout keeps a
# column's 8 reduction elements together) into a 2 x 2 int32 tile (mmla.py)
_SMMLA = register_mmla("portable_pe_smmla_2x2x8", "int8", 8, "int32", lambda x: T.Cast("int32", x), _smmla)
_SDOT = _register("portable_pe_sdot_4x4", "int8", "int8", 4, 4, "llvm.aarch64.neon.sdot.v4i32.v16i8",
                  accumulates=True)

#: every kernel variant by name (tests build each one; the CLI never picks one by hand)
# Tiles: MI x NV accumulator registers, plus NV weight vectors, the broadcast activation
# and, where the instruction does not accumulate, NV products in flight; the int32 tile
# stays under 1 KiB (matmul._STACK_ARRAY_LIMIT_BYTES) so it is a stack array LLVM keeps
# in registers.
ISAS: dict[str, DotIsa] = {
    "avx512-vnni": DotIsa("avx512-vnni", "uint8", "int8", 16, 4, _VNNI512, 7, 2),
    "avx-vnni": DotIsa("avx-vnni", "uint8", "int8", 8, 4, _VNNI256, 6, 2),
    "avx512bw": DotIsa("avx512bw", "int16", "int16", 16, 2, _PMADDWD512, 7, 2),
    # 5 x 2 int32 accumulators, 2 weight vectors, the broadcast, the ones and 2 products in
    # flight: 16 ymm. Profiled on the learned graph's int8 build (B=8 T=128): 6 x 2 and 3 x 4
    # spill (11% and 28% slower); 4 x 2 and 1, 2 or 4 steps unrolled were within the noise.
    "avx2-u8s7": DotIsa("avx2-u8s7", "uint8", "int8", 8, 4, _MADDUBS256, 5, 2, k_unroll=2, w_max=64),
    "avx2": DotIsa("avx2", "int16", "int16", 8, 2, _PMADDWD256, 5, 2),
    # smmla: 2 x 2 per instruction; an 8 x 8 tile is 16 accumulators, 4 weight and 4 row vectors
    "neon-i8mm": DotIsa("neon-i8mm", "int8", "int8", 2, 8, _SMMLA, 8, 4, rows=2),
    "neon-dotprod": DotIsa("neon-dotprod", "int8", "int8", 4, 4, _SDOT, 6, 4),
    "neon": DotIsa("neon", "int16", "int16", 4, 1, None, 6, 4),
    "generic": DotIsa("generic", "int16", "int16", 4, 1, None, 4, 2),
}
