"""AMX's tile micro-kernel (Sapphire Rapids and later Xeons: AMX-BF16 for ``--precision
bf16``, AMX-INT8 for int8's matmuls): its LLVM IR, the tile scopes it runs in, and the
tensor intrinsic the dense schedule (amx_matmul) tensorizes with; the fused bf16
attention (bf16_attention) calls it directly.

AMX holds C in tile registers (8 tiles of 16 rows x 64 bytes): the micro-kernel keeps a
32 x 32 block of 4-byte lanes (float32, int32) in four of them, loads two activation
tiles and two weight tiles per 64 bytes of reduction (32 bf16, 64 int8), and stores the
block for the epilogue. Its weights are packed [N/16, K/G, 16, G] (G = 2 bf16 pairs, the
ones vdpbf16ps takes per lane too; G = 4 int8 quads, vpdpbusd's), so one weight tile is
16 consecutive rows of 64 bytes. Linux hands AMX's tile data state to a process only
after it asks (arch_prctl ARCH_REQ_XCOMP_PERM). The tiles are used inside a scope, one
per parallel work item: ``portable_pe_amx_begin`` asks (once per process) and loads the
tile configuration, ``portable_pe_amx_end`` releases the tiles (tilerelease), so a thread
switched out between kernels has no 8 KiB of tile data to save, and code outside our
kernels (a oneDNN in the same process) finds them as it expects. Configuring and
releasing cost about 0.16 us: paid per 32 x 32 block, they made a K = 256 dense 1.3x
slower (one thread, M = 1024); per work item they cost nothing measurable.
"""

from __future__ import annotations

from tvm import tirx
from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T
from tvm_ffi.structural import structural_mutate

from .bf16_isa import widen
from .tir_util import loop_with

AMX_TILE = 32  # rows and columns of the micro-kernel's float32 block (2 x 2 tiles)
AMX_K = 32     # reduction elements per tile step (64 bytes of bf16 per row)


def _tile_config() -> str:
    """ldtilecfg's 64 bytes, as an LLVM string: palette 1, tiles 0..7 of 16 rows x 64 bytes."""
    config = bytearray(64)
    config[0] = 1
    for tile in range(8):
        config[16 + 2 * tile] = 64  # colsb, little-endian uint16
        config[48 + tile] = 16      # rows
    return "".join(f"\\{b:02X}" for b in config)


# portable_pe_amx_KIND_onto, the micro-kernel, for one tile instruction (tdpbf16ps: bf16
# pairs into float32; tdpbusd: uint8 x int8 quads into int32). Both take 64-byte rows of
# A and B (32 bf16 or 64 int8 reduction elements per step) and a C of 16 x 16 4-byte lanes
# per tile, so one body serves both.
_MICRO_KERNEL_IR = r"""
define internal i32 @portable_pe_amx_KIND(ptr %c, i64 %ldc, ptr %a, i64 %lda, ptr %b, i64 %ldb, i64 %steps, i64 %blocks, i64 %accumulate) {
  %from_zero = icmp eq i64 %accumulate, 0
  %init = select i1 %from_zero, ptr null, ptr %c
  %rc = call i32 @portable_pe_amx_KIND_onto(ptr %c, i64 %ldc, ptr %init, i64 %ldc, ptr %a, i64 %lda, ptr %b, i64 %ldb, i64 %steps, i64 %blocks)
  ret i32 %rc
}

define internal i32 @portable_pe_amx_KIND_onto(ptr %c, i64 %ldc, ptr %init, i64 %ldi, ptr %a, i64 %lda, ptr %b, i64 %ldb, i64 %steps, i64 %blocks) {
entry:
  %a_rows = mul i64 %lda, 16
  %a1 = getelementptr i8, ptr %a, i64 %a_rows
  %c_rows = mul i64 %ldc, 16
  %i_rows = mul i64 %ldi, 16
  %b_block = mul i64 %ldb, 2
  %from_zero = icmp eq ptr %init, null
  br label %block
block:
  %n = phi i64 [0, %entry], [%n_next, %store]
  %c_off = mul i64 %n, 128
  %cn = getelementptr i8, ptr %c, i64 %c_off
  %c1 = getelementptr i8, ptr %cn, i64 64
  %c2 = getelementptr i8, ptr %cn, i64 %c_rows
  %c3 = getelementptr i8, ptr %c2, i64 64
  %in = getelementptr i8, ptr %init, i64 %c_off
  %i1 = getelementptr i8, ptr %in, i64 64
  %i2 = getelementptr i8, ptr %in, i64 %i_rows
  %i3 = getelementptr i8, ptr %i2, i64 64
  %b_off = mul i64 %n, %b_block
  %bn0 = getelementptr i8, ptr %b, i64 %b_off
  %bn1 = getelementptr i8, ptr %bn0, i64 %ldb
  br i1 %from_zero, label %zero, label %load
zero:
  call void @llvm.x86.tilezero(i8 0)
  call void @llvm.x86.tilezero(i8 1)
  call void @llvm.x86.tilezero(i8 2)
  call void @llvm.x86.tilezero(i8 3)
  br label %step
load:
  call void @llvm.x86.tileloadd64(i8 0, ptr %in, i64 %ldi)
  call void @llvm.x86.tileloadd64(i8 1, ptr %i1, i64 %ldi)
  call void @llvm.x86.tileloadd64(i8 2, ptr %i2, i64 %ldi)
  call void @llvm.x86.tileloadd64(i8 3, ptr %i3, i64 %ldi)
  br label %step
step:
  %k = phi i64 [0, %zero], [0, %load], [%k_next, %step]
  %a_off = mul i64 %k, 64
  %bk_off = mul i64 %k, 1024
  %pa0 = getelementptr i8, ptr %a, i64 %a_off
  %pa1 = getelementptr i8, ptr %a1, i64 %a_off
  %pb0 = getelementptr i8, ptr %bn0, i64 %bk_off
  %pb1 = getelementptr i8, ptr %bn1, i64 %bk_off
  call void @llvm.x86.tileloadd64(i8 4, ptr %pa0, i64 %lda)
  call void @llvm.x86.tileloadd64(i8 5, ptr %pa1, i64 %lda)
  call void @llvm.x86.tileloadd64(i8 6, ptr %pb0, i64 64)
  call void @llvm.x86.tileloadd64(i8 7, ptr %pb1, i64 64)
  call void @llvm.x86.INSTRUCTION(i8 0, i8 4, i8 6)
  call void @llvm.x86.INSTRUCTION(i8 1, i8 4, i8 7)
  call void @llvm.x86.INSTRUCTION(i8 2, i8 5, i8 6)
  call void @llvm.x86.INSTRUCTION(i8 3, i8 5, i8 7)
  %k_next = add i64 %k, 1
  %k_done = icmp eq i64 %k_next, %steps
  br i1 %k_done, label %store, label %step
store:
  call void @llvm.x86.tilestored64(i8 0, ptr %cn, i64 %ldc)
  call void @llvm.x86.tilestored64(i8 1, ptr %c1, i64 %ldc)
  call void @llvm.x86.tilestored64(i8 2, ptr %c2, i64 %ldc)
  call void @llvm.x86.tilestored64(i8 3, ptr %c3, i64 %ldc)
  %n_next = add i64 %n, 1
  %n_done = icmp eq i64 %n_next, %blocks
  br i1 %n_done, label %exit, label %block
exit:
  ret i32 0
}
"""


def _micro_kernel(kind: str, instruction: str) -> str:
    return _MICRO_KERNEL_IR.replace("KIND", kind).replace("INSTRUCTION", instruction)


# tiles 0..3: C (rows 0-15 / 16-31 x columns 0-15 / 16-31); 4, 5: A rows; 6, 7: B columns.
# portable_pe_amx_bf16_onto computes NB blocks side by side (C [32, 32 NB]) inside an open
# scope (begin ... end), from zero (init null) or onto a [32, 32 NB] float32 start read
# from init (row stride ldi bytes: the C in memory, or an attention bias); portable_pe_amx_bf16
# is it from zero or (accumulate != 0) onto C itself.
# 158 = SYS_arch_prctl, 4131 = ARCH_REQ_XCOMP_PERM, 18 = XFEATURE_XTILEDATA.
AMX_IR = r"""
declare void @llvm.x86.ldtilecfg(ptr)
declare void @llvm.x86.tilezero(i8)
declare void @llvm.x86.tileloadd64(i8, ptr, i64)
declare void @llvm.x86.tdpbf16ps(i8, i8, i8)
declare void @llvm.x86.tilestored64(i8, ptr, i64)
declare void @llvm.x86.tilerelease()
declare i64 @syscall(i64, ...)
@portable_pe_amx_config = internal constant [64 x i8] c"CONFIG", align 64
@portable_pe_amx_permitted = internal global i1 false

define internal i32 @portable_pe_amx_begin() {
entry:
  %permitted = load i1, ptr @portable_pe_amx_permitted
  br i1 %permitted, label %start, label %permit
permit:
  %rc = call i64 (i64, ...) @syscall(i64 158, i64 4131, i64 18)
  store i1 true, ptr @portable_pe_amx_permitted
  br label %start
start:
  call void @llvm.x86.ldtilecfg(ptr @portable_pe_amx_config)
  ret i32 0
}

define internal i32 @portable_pe_amx_end() {
  call void @llvm.x86.tilerelease()
  ret i32 0
}

""".replace("CONFIG", _tile_config()) + _micro_kernel("bf16", "tdpbf16ps")

# AMX-INT8's micro-kernel (portable_pe_amx_i8, _onto): imported after AMX_IR, whose
# declarations, tile configuration and scopes it uses
AMX_INT8_IR = "declare void @llvm.x86.tdpbusd(i8, i8, i8)\n" + _micro_kernel("i8", "tdpbusd")

#: the loop annotation whose every iteration is one tile scope (open_amx_scopes)
AMX_SCOPE = "portable_pe.amx_scope"


def amx_scope_call(which: str):
    """``T.call_extern`` opening ("begin") or closing ("end") a tile scope."""
    return tirx.call_extern("int32", f"portable_pe_amx_{which}")


def open_amx_scopes(func):
    """Each loop annotated AMX_SCOPE (a parallel work item, by the schedule) with its body
    between portable_pe_amx_begin and portable_pe_amx_end."""
    def scope(loop, mutator):
        loop = mutator.default_mutate(loop)
        if AMX_SCOPE not in loop.annotations:
            return loop
        body = tirx.SeqStmt([tirx.Evaluate(amx_scope_call("begin")), loop.body, tirx.Evaluate(amx_scope_call("end"))])
        return loop_with(loop, body=body, without=AMX_SCOPE)
    # TVM 0.27's Python has no TIR mutator (stmt_functor); tvm_ffi's structural one serves
    return func.with_body(structural_mutate(func.body, [(tirx.For, scope)]))


#: per tile kind: A's, B's and C's element types (bf16 as its uint16 bit patterns)
AMX_KINDS = {"bf16": ("uint16", "uint16", "float32"), "i8": ("uint8", "int8", "int32")}


def amx_element_bytes(kind: str) -> int:
    """Bytes of one A or B element: a 64-byte tile row holds 64 // this reduction elements
    (32 bf16, 64 int8), and one 4-byte lane of B holds 4 // this (bf16 pairs, int8 quads)."""
    return {"uint16": 2, "uint8": 1}[AMX_KINDS[kind][0]]


def amx_intrin(k: int, *, accumulate: bool = False, kind: str = "bf16") -> str:
    """The tensor intrinsic for one 32 x 32 block over k reduction elements (64 bytes of
    them per tile step: k % 32 == 0 in bf16, k % 64 == 0 in int8): C [32, 32] = A [32, k] x B,
    or with `accumulate` C += A x B (a K split into chunks: C is loaded into the tiles
    first). B is a [2, k/G, 16, G] slice of the packed weight [N/16, K/G, 16, G] (two
    16-column panels; G = 2 bf16 pairs, 4 int8 quads). bf16: bit patterns (uint16) into
    float32; "i8": uint8 activations x int8 weights into int32 (tdpbusd). Registered once
    per (k, accumulate, kind); it must run in a tile scope (open_amx_scopes)."""
    name = f"portable_pe_amx_{kind}_32x32x{k}{'_acc' if accumulate else ''}"
    if TensorIntrin.get(name, allow_missing=True) is not None:
        return name
    a_dtype, b_dtype, c_dtype = AMX_KINDS[kind]
    size = amx_element_bytes(kind)  # the extern takes strides in bytes
    g, steps = 4 // size, k * size // 64

    def product(a, b):
        if kind == "bf16":
            return widen(a) * widen(b)
        return T.Cast("int32", a) * T.Cast("int32", b)
    zero = T.float32(0) if c_dtype == "float32" else T.int32(0)

    # (TVMScript resolves `if accumulate` while parsing: one of the two forms is built)
    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        sa, sb, sc = T.int64(), T.int64(), T.int64()
        A = T.match_buffer(a, (32, k), a_dtype, offset_factor=1, strides=[sa, 1])
        B = T.match_buffer(b, (2, k // g, 16, g), b_dtype, offset_factor=1, strides=[sb, 16 * g, g, 1])
        C = T.match_buffer(c, (32, 32), c_dtype, offset_factor=1, strides=[sc, 1])
        with T.sblock("root"):
            if accumulate:
                T.reads(C[0:32, 0:32], A[0:32, 0:k], B[0:2, 0:k // g, 0:16, 0:g])
            else:
                T.reads(A[0:32, 0:k], B[0:2, 0:k // g, 0:16, 0:g])
            T.writes(C[0:32, 0:32])
            for i, j, r in T.grid(32, 32, k):
                with T.sblock("update"):
                    vi, vj, vr = T.axis.remap("SSR", [i, j, r])
                    T.reads(C[vi, vj], A[vi, vr], B[vj // 16, vr // g, vj % 16, vr % g])
                    T.writes(C[vi, vj])
                    if not accumulate:
                        with T.init():
                            C[vi, vj] = zero
                    C[vi, vj] = C[vi, vj] + product(A[vi, vr], B[vj // 16, vr // g, vj % 16, vr % g])

    # impl declares the operands again: a TVMScript prim_func binds its own buffers (built by
    # a shared helper, their stride variables came out int32 and tensorize did not match)
    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        sa, sb, sc = T.int64(), T.int64(), T.int64()
        A = T.match_buffer(a, (32, k), a_dtype, offset_factor=1, strides=[sa, 1])
        B = T.match_buffer(b, (2, k // g, 16, g), b_dtype, offset_factor=1, strides=[sb, 16 * g, g, 1])
        C = T.match_buffer(c, (32, 32), c_dtype, offset_factor=1, strides=[sc, 1])
        with T.sblock("root"):
            T.reads(C[0:32, 0:32], A[0:32, 0:k], B[0:2, 0:k // g, 0:16, 0:g])
            T.writes(C[0:32, 0:32])
            # byte strides: C's rows, A's rows, one 16-column panel of B; 64-byte tile steps
            T.evaluate(T.call_extern("int32", f"portable_pe_amx_{kind}", C.access_ptr("rw" if accumulate else "w"),
                                     sc * 4, A.access_ptr("r"), sa * size, B.access_ptr("r"), sb * size,
                                     T.int64(steps), T.int64(1), T.int64(int(accumulate))))

    TensorIntrin.register(name, desc, impl)
    return name
