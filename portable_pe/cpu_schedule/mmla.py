"""Arm's matrix multiply-accumulate instructions (SMMLA for int8, BFMMLA for bf16) as
TensorIntrins: a 2 x depth activation block (two rows, a row stride apart) times a
depth x 2 weight block (two columns of depth contiguous values, as the packed layout keeps
them) added into a 2 x 2 tile whose rows lie a tile row apart. The instructions differ
only in the operand type, the depth, the accumulator type and how the hardware is called;
int8_isa and bf16_neon register theirs here."""

from __future__ import annotations

from typing import Callable

from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T


def register_mmla(name: str, operand: str, depth: int, acc: str, widen: Callable, call: Callable) -> str:
    """Register (once) the 2 x 2 x `depth` intrinsic `name`: `operand` values of which `widen`
    gives the `acc` product terms, run as `call(tile, rows, columns)` on the accumulator
    tile (`acc` x 4), the two rows and the two columns (`operand` x 2 depth each)."""
    if TensorIntrin.get(name, allow_missing=True) is not None:
        return name

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        sa, sc = T.int64(), T.int64()
        A = T.match_buffer(a, (2, depth), operand, offset_factor=1, strides=[sa, 1])
        B = T.match_buffer(b, (2, depth), operand, offset_factor=1)
        C = T.match_buffer(c, (2, 2), acc, offset_factor=1, strides=[sc, 1])
        with T.sblock("root"):
            T.reads(C[0:2, 0:2], A[0:2, 0:depth], B[0:2, 0:depth])
            T.writes(C[0:2, 0:2])
            for i, j, k in T.grid(2, 2, depth):
                with T.sblock("update"):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                    C[vi, vj] = C[vi, vj] + widen(A[vi, vk]) * widen(B[vj, vk])

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        sa, sc = T.int64(), T.int64()
        A = T.match_buffer(a, (2, depth), operand, offset_factor=1, strides=[sa, 1])
        B = T.match_buffer(b, (2, depth), operand, offset_factor=1)
        C = T.match_buffer(c, (2, 2), acc, offset_factor=1, strides=[sc, 1])
        with T.sblock("root"):
            T.reads(C[0:2, 0:2], A[0:2, 0:depth], B[0:2, 0:depth])
            T.writes(C[0:2, 0:2])
            rows = T.vectorcombine(f"{operand}x{2 * depth}", A.vload([0, 0], f"{operand}x{depth}"),
                                   A.vload([1, 0], f"{operand}x{depth}"))
            tile = T.vectorcombine(f"{acc}x4", C.vload([0, 0], f"{acc}x2"), C.vload([1, 0], f"{acc}x2"))
            out = call(tile, rows, B.vload([0, 0], f"{operand}x{2 * depth}"))
            C[0, T.ramp(T.int64(0), 1, 2)] = T.vectorlow(f"{acc}x2", out)
            C[1, T.ramp(T.int64(0), 1, 2)] = T.vectorhigh(f"{acc}x2", out)

    TensorIntrin.register(name, desc, impl)
    return name
