"""Rounding to bf16 in one instruction where the CPU has it.

bf16_linear.bf16_bits_expr rounds a float32 to bf16 (to nearest even) with integer
arithmetic: about nine instructions per 16 values once vectorized, in the epilogue of every
kernel that produces a bf16 activation (the FFN dense's GELU, the layer norms, the head
packs). On CPUs with AVX512-BF16 (which every AMX CPU has) vcvtneps2bf16 does it in one
(bf16_isa.BF16_ROUND_IR). TVM 0.27 vectorizes no call to it from a scalar TIR expression,
so this pass runs after lowering, when the loops are vectors: each 16-lane rounding
bf16_bits_expr wrote (a Let of ROUNDING_VAR) becomes the call.

The instruction flushes subnormal inputs (below 1.2e-38) to zero, where the integer
rounding keeps them, and a NaN keeps its sign and payload, where the integer rounding
gives 0x7FC0; every other value rounds to the same bits.
"""

from __future__ import annotations

import tvm
from tvm import tirx

from .bf16_isa import BF16_ROUND_IR
from .int8_isa import _features
from .tir_util import each_prim_func

#: the name of the Let variable bf16_bits_expr binds the float's bits to
ROUNDING_VAR = "bf16_rne_bits"
_LANES = 16  # vcvtneps2bf16 on zmm: 16 float32 in, 16 bf16 out


def _dtype(expr) -> str:
    return str(expr.ty)  # TVM 0.27: an expression's dtype is its type, "float32x16"


def _rounded_float(let: tirx.Let):
    """The float32x16 that `let` (a vectorized bf16_bits_expr) rounds, or None."""
    if let.var.name != ROUNDING_VAR:
        return None
    value = let.value  # reinterpret(uint32x16, x)
    if not (isinstance(value, tvm.ir.expr.Call) and value.op.same_as(tvm.ir.Op.get("tirx.reinterpret"))):
        return None
    x = value.args[0]
    return x if _dtype(x) == f"float32x{_LANES}" else None


def native_rounding(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """`func` with its 16-lane bf16 roundings as vcvtneps2bf16, when its target has
    avx512bf16; unchanged otherwise."""
    from tvm_ffi.structural import structural_mutate

    target = func.attrs["target"] if func.attrs is not None and "target" in func.attrs else None
    if target is None or "avx512bf16" not in _features(target):
        return func
    rewritten = []

    def rewrite(let, mutator):
        let = mutator.default_mutate(let)
        x = _rounded_float(let)
        if x is None:
            return let
        rewritten.append(let)
        bits = tirx.call_extern(f"uint16x{_LANES}", "portable_pe_bf16x16", x)
        # bf16_bits_expr's dtype="uint32" form (two roundings packed into a word)
        return bits if _dtype(let) == f"uint16x{_LANES}" else tirx.Cast(_dtype(let), bits)

    body = structural_mutate(func.body, [(tirx.Let, rewrite)])
    if not rewritten:
        return func
    return func.with_body(tirx.AttrStmt(tirx.const(0, "int32"), "pragma_import_llvm",
                                        tvm.ir.StringImm(BF16_ROUND_IR), body))


@tvm.transform.module_pass(opt_level=0, name="NativeBF16Rounding")
def NativeBF16Rounding(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """native_rounding on every PrimFunc of a lowered module."""
    return each_prim_func(mod, native_rounding)
