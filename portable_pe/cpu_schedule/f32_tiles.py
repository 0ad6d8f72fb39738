"""The float32 dense micro-kernel on AVX-512, as LLVM IR: C [12, 32] = A [12, K] x B [K, 32]
with its 24 accumulators in registers for the whole K loop, and the tensor intrinsic
that f32_dense tensorizes the register tile with.

Why not TVM's own code for the tile: TVM keeps an accumulator tile in registers only as
a stack array under 1 KiB (matmul._STACK_ARRAY_LIMIT_BYTES), which caps it at 7 rows of
two vectors: 14 FMAs per 7 broadcasts and 2 weight loads. Here 12 rows (24 accumulators,
2 weight vectors, one broadcast: 27 of the 32 zmm registers) do 24 FMAs per 12
broadcasts and 2 loads, MLAS's AVX-512 SGEMM tile. Measured alone (2 threads, one
process, alternating blocks), the 12-row kernel took 0.88-0.94 of the 7-row one's time
on the encoders' dense shapes; 8, 10, 13 and 14 rows were slower than 12.

B is two 16-column panels of the packed weight [N/16, K, 16] (two streams, each one
64-byte vector per k). The block goes to memory (1.5 KiB, L1) for the epilogue, which
reads it right back: TVM has no way to hand it registers.
"""

from __future__ import annotations

from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T

#: rows and columns of C per micro-kernel call
F32_TILE_ROWS = 12
F32_TILE_COLUMNS = 32
#: the micro-kernel's name (suffixed with its tile shape)
F32_KERNEL = "portable_pe_f32_"
#: the packed weight's panel width: one AVX-512 vector of float32
F32_PANEL = 16
_LANES = 16
#: how many k steps ahead the kernel prefetches the weight panels into L1 (each step is one
#: 64-byte line per panel; they stream from L2, or L3 for a layer's first row tile): the
#: learned graph at B = 8, T = 128 / 512, B = 1 T = 512 ran 1.7-3.8% faster with 16 or 32
#: steps than without (whole bundles, one process, alternating blocks)
_PREFETCH_STEPS = 32


def micro_kernel_ir(rows: int) -> str:
    """LLVM IR of portable_pe_f32_{rows}x32(c, ldc, a, lda, b, ldb, k, rows_left): strides
    in elements; b the first of two [K, 16] panels, ldb apart; k >= 1; rows_left (i32,
    >= 1) the rows of A from a on (rows_in_place says why i32). Only the first
    min(rows, rows_left) rows of a are read: past them a tile (the last of A, read in
    place) repeats the last row there is, and C's rows past them hold that row's results,
    which the caller's epilogue never reads.

    Two copies of the loop: whole tiles (every tile but a matmul's last) address row r as
    a + r * lda, which, lda a constant once the kernel is inlined, is one pointer and a
    displacement per row; the last tile's rows are selected, so LLVM keeps a pointer per
    row there (one tile per matmul: its stack reloads cost little). Twelve row pointers
    with the k counter and the panels' pointers are more than x86's 16 general registers:
    with the select for every tile, nine of them were reloaded from the stack at each k
    step (23 loads per 24 FMAs instead of 14)."""
    name = f"{F32_KERNEL}{rows}x32"
    lines = [
        f"define internal i32 @{name}(ptr %c, i64 %ldc, ptr %a, i64 %lda, ptr %b, i64 %ldb, i64 %k, "
        "i32 %rows_left32) {",
        "entry:",
        "  %rows_left = zext i32 %rows_left32 to i64",
        "  %b_second = getelementptr float, ptr %b, i64 %ldb",
        f"  %whole = icmp uge i64 %rows_left, {rows}",
        "  br i1 %whole, label %whole.rows, label %last.rows",
        "whole.rows:",
    ]
    for r in range(rows):
        lines.append(f"  %whole.ra{r}.off = mul i64 %lda, {r}")
        lines.append(f"  %whole.ra{r} = getelementptr float, ptr %a, i64 %whole.ra{r}.off")
    lines += _k_loop_ir("whole", rows)
    lines += [
        "last.rows:",
        "  %last_row = sub i64 %rows_left, 1",
    ]
    for r in range(rows):
        lines.append(f"  %past{r} = icmp ugt i64 {r}, %last_row")
        lines.append(f"  %row{r} = select i1 %past{r}, i64 %last_row, i64 {r}")
        lines.append(f"  %last.ra{r}.off = mul i64 %lda, %row{r}")
        lines.append(f"  %last.ra{r} = getelementptr float, ptr %a, i64 %last.ra{r}.off")
    lines += _k_loop_ir("last", rows)
    lines += ["}", ""]
    return "\n".join(lines)


def _k_loop_ir(tag: str, rows: int) -> list[str]:
    """The K loop and the stores of C, from row pointers %{tag}.ra0.. (defined by the
    block that branches here), ending in ret."""
    acc = [(r, v) for r in range(rows) for v in range(2)]
    vec = f"<{_LANES} x float>"
    pre = f"{tag}."
    lines = [f"  br label %{pre}loop", f"{pre}loop:",
             f"  %{pre}kk = phi i64 [0, %{tag}.rows], [%{pre}kn, %{pre}loop]"]
    for r, v in acc:
        lines.append(f"  %{pre}acc{r}_{v} = phi {vec} [zeroinitializer, %{tag}.rows], [%{pre}nacc{r}_{v}, %{pre}loop]")
    lines += [
        f"  %{pre}boff = mul i64 %{pre}kk, 16",
        f"  %{pre}pb0 = getelementptr float, ptr %b, i64 %{pre}boff",
        f"  %{pre}pb1 = getelementptr float, ptr %b_second, i64 %{pre}boff",
        f"  %{pre}b0 = load {vec}, ptr %{pre}pb0, align 4",
        f"  %{pre}b1 = load {vec}, ptr %{pre}pb1, align 4",
    ]
    # (past the last panel's end on the last steps: a prefetch never faults)
    lines += [
        f"  %{pre}pf0 = getelementptr float, ptr %{pre}pb0, i64 {_PREFETCH_STEPS * _LANES}",
        f"  %{pre}pf1 = getelementptr float, ptr %{pre}pb1, i64 {_PREFETCH_STEPS * _LANES}",
        f"  call void @llvm.prefetch.p0(ptr %{pre}pf0, i32 0, i32 3, i32 1)",
        f"  call void @llvm.prefetch.p0(ptr %{pre}pf1, i32 0, i32 3, i32 1)",
    ]
    for r in range(rows):
        lines += [
            f"  %{pre}pa{r} = getelementptr float, ptr %{pre}ra{r}, i64 %{pre}kk",
            f"  %{pre}x{r} = load float, ptr %{pre}pa{r}, align 4",
            f"  %{pre}i{r} = insertelement {vec} poison, float %{pre}x{r}, i64 0",
            f"  %{pre}s{r} = shufflevector {vec} %{pre}i{r}, {vec} poison, <{_LANES} x i32> zeroinitializer",
        ]
        for v in range(2):
            lines.append(f"  %{pre}nacc{r}_{v} = call {vec} @llvm.fma.v16f32({vec} %{pre}s{r}, {vec} %{pre}b{v}, "
                         f"{vec} %{pre}acc{r}_{v})")
    lines += [f"  %{pre}kn = add i64 %{pre}kk, 1", f"  %{pre}done = icmp eq i64 %{pre}kn, %k",
              f"  br i1 %{pre}done, label %{pre}exit, label %{pre}loop", f"{pre}exit:"]
    for r, v in acc:
        lines += [
            f"  %{pre}co{r}_{v} = mul i64 %ldc, {r}",
            f"  %{pre}cr{r}_{v} = add i64 %{pre}co{r}_{v}, {v * _LANES}",
            f"  %{pre}pc{r}_{v} = getelementptr float, ptr %c, i64 %{pre}cr{r}_{v}",
            f"  store {vec} %{pre}nacc{r}_{v}, ptr %{pre}pc{r}_{v}, align 4",
        ]
    lines.append("  ret i32 0")
    return lines


def f32_ir(rows: int = F32_TILE_ROWS) -> str:
    """The micro-kernel with its declarations, for a kernel's ``pragma_import_llvm``."""
    vec = f"<{_LANES} x float>"
    return (f"declare void @llvm.prefetch.p0(ptr, i32, i32, i32)\n"
            f"declare {vec} @llvm.fma.v16f32({vec}, {vec}, {vec})\n" + micro_kernel_ir(rows))


def f32_intrin(k: int, rows: int = F32_TILE_ROWS) -> str:
    """The tensor intrinsic for C [rows, 32] = A [rows, k] x B, B a [2, k, 16] slice of the
    packed weight [N/16, K, 16]; registered once per (rows, k)."""
    name = f"{F32_KERNEL}{rows}x32x{k}"
    if TensorIntrin.get(name, allow_missing=True) is not None:
        return name

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        sa, sb, sc = T.int64(), T.int64(), T.int64()
        A = T.match_buffer(a, (rows, k), "float32", offset_factor=1, strides=[sa, 1])
        B = T.match_buffer(b, (2, k, 16), "float32", offset_factor=1, strides=[sb, 16, 1])
        C = T.match_buffer(c, (rows, 32), "float32", offset_factor=1, strides=[sc, 1])
        with T.sblock("root"):
            T.reads(A[0:rows, 0:k], B[0:2, 0:k, 0:16])
            T.writes(C[0:rows, 0:32])
            for i, j, r in T.grid(rows, 32, k):
                with T.sblock("update"):
                    vi, vj, vr = T.axis.remap("SSR", [i, j, r])
                    T.reads(C[vi, vj], A[vi, vr], B[vj // 16, vr, vj % 16])
                    T.writes(C[vi, vj])
                    with T.init():
                        C[vi, vj] = T.float32(0)
                    C[vi, vj] = C[vi, vj] + A[vi, vr] * B[vj // 16, vr, vj % 16]

    # impl declares the operands again, as amx_tiles.amx_intrin's does (built by a shared
    # helper, the buffers' stride variables came out int32 and tensorize did not match)
    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        sa, sb, sc = T.int64(), T.int64(), T.int64()
        A = T.match_buffer(a, (rows, k), "float32", offset_factor=1, strides=[sa, 1])
        B = T.match_buffer(b, (2, k, 16), "float32", offset_factor=1, strides=[sb, 16, 1])
        C = T.match_buffer(c, (rows, 32), "float32", offset_factor=1, strides=[sc, 1])
        with T.sblock("root"):
            T.reads(A[0:rows, 0:k], B[0:2, 0:k, 0:16])
            T.writes(C[0:rows, 0:32])
            T.evaluate(T.call_extern("int32", f"{F32_KERNEL}{rows}x32", C.access_ptr("w"), sc,
                                     A.access_ptr("r"), sa, B.access_ptr("r"), sb, T.int64(k), T.int32(rows)))

    TensorIntrin.register(name, desc, impl)
    return name
