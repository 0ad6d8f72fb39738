"""What a build runs in bf16: the manifest's "bf16" section (--precision bf16, and int8
builds whose attention runs on AMX); and which int8 builds' attentions take Q·Kᵀ in int8
(AVX2 without VNNI: int8_attention)."""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.ir import IRModule

from .attention import FuseAttention
from .bf16_isa import bf16_kernel
from .bf16_linear import lower_bf16_linear
from .patch_stem import PatchStemAsMatmul


# Builds whose attention runs on AMX's bf16 tiles where the CPU has them. int8 too: its
# attention (the scores and P·V, whose operands are activations) is not quantized, and
# in float32 it was 47% of the rope graph's int8 time at B = 8, T = 512; on the tiles
# the graph ran 1.5x faster, with a cosine against PyTorch 3e-8 to 5e-7 above
# onnxruntime int8's (it was -2e-8 to +5e-8 with float32 attention). OpenVINO's int8
# computes its unquantized ops in bf16 on these CPUs as well.
BF16_ATTENTION_PRECISIONS = ("bf16", "int8")


def attention_plan(mod: IRModule, target) -> dict:
    """The manifest's "bf16" section of an int8 build whose attention runs on AMX: the
    kernel (the run-time check of the CPU's instructions reads it) and the attentions."""
    with target:
        calls = _attention_calls(FuseAttention(bf16=True)(PatchStemAsMatmul(mod)))
    in_bf16 = calls.get("fused_attention_bf16", 0)
    return {"kernel": bf16_kernel(target), "attentions_bf16": in_bf16,
            "attentions_float32": sum(calls.values()) - in_bf16}


def bf16_plan(mod: IRModule, target) -> dict:
    """What a bf16 build of `mod` runs in bf16 (the manifest's "bf16" section): the
    pipeline's own passes up to this one, counted."""
    with target:
        fused = FuseAttention(bf16=True)(PatchStemAsMatmul(mod))
        _, lowered, kept = lower_bf16_linear(fused, target)
    calls = _attention_calls(fused)
    attention, in_bf16 = sum(calls.values()), calls.get("fused_attention_bf16", 0)
    kernel = bf16_kernel(target)
    why = ("bf16 on AMX with head dims that are multiples of 32" if kernel == "amx-bf16"
           else f"no bf16 attention kernel for {kernel}")  # attention in bf16 is AMX's only
    return {"kernel": kernel, "matmuls_bf16": lowered, "matmuls_float32": kept,
            "attentions_bf16": in_bf16, "attentions_float32": attention - in_bf16,
            "float32": "layer norm, softmax, residuals, biases and activations, position encodings"
                       + ("" if in_bf16 and in_bf16 == attention else f", attention's Q.K^T and P.V ({why})")}


def int8_attention_plan(mod: IRModule, target) -> dict:
    """An int8 build's attentions by their scores' precision: int8 (int8_attention, where
    the target's int8 kernel is avx2-u8s7) or float32."""
    with target:
        calls = _attention_calls(FuseAttention(int8=True)(PatchStemAsMatmul(mod)))
    in_int8 = calls.get("fused_attention_int8", 0)
    return {"attentions_int8_scores": in_int8, "attentions_float32": sum(calls.values()) - in_int8}


_ATTENTION_KINDS = ("fused_attention_bf16", "fused_attention_int8", "fused_attention")


def _attention_calls(mod: IRModule) -> dict[str, int]:
    """How many times the Relax functions call each fused attention kernel (by kind)."""
    call_tir, found = tvm.ir.Op.get("relax.call_tir"), {}

    def visit(expr):
        if isinstance(expr, relax.Call) and expr.op.same_as(call_tir) and expr.args[0].name_hint.startswith("fused_attention"):
            kind = next(k for k in _ATTENTION_KINDS if expr.args[0].name_hint.startswith(k))
            found[kind] = found.get(kind, 0) + 1
    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return found
