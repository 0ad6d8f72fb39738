"""--precision bf16: the constant-weight matmuls in bf16 (Relax, before legalization).

    y = matmul(x, W)                x float32 [..., K]; W a float32 constant [K, N]
becomes
    a = bf16_bits(x)                uint16: x rounded to bf16, to nearest even
    y = bf16_matmul(a, W16)         float32 accumulation; W16 = W rounded at compile time

``bf16_bits`` is elementwise, so FuseOps fuses it into the kernel that produces x (the
layer norm, or the previous matmul's epilogue after its bias and activation): the
activation is rounded where it is made, and travels at half the bytes. The matmul's own
epilogue (bias, activation, residual) runs in float32 on its float32 accumulators.

Everything else stays float32: layer norm, softmax and residual sums (they accumulate,
and bf16's 8 mantissa bits would lose the small terms), the position encodings (RoPE's
cos/sin, bias tables, embeddings: a rotation by a rounded angle is a different rotation),
and attention's softmax (its Q.K^T and P.V run on AMX tiles in the fused attention
kernel, bf16_attention). With AMX every linear layer is rewritten, K and N padded to 32
with zeros (the weight here, the activation by its rounding kernel; N cropped after);
with vdpbf16ps only those whose K is even and N a multiple of 16, with aarch64's BFMMLA
those whose K is a multiple of 4 and N even; the others stay float32 and are counted.
"""

from __future__ import annotations

import logging

import numpy as np
import tvm
from tvm import relax, te, tirx
from tvm.ir import IRModule

from .amx_tiles import AMX_K, AMX_TILE
from .bf16_isa import bf16_kernel, needed_features, target_arch
from .bf16_matmul import FITS
from .relax_util import (INJECTIVE, OUT_ELEMWISE_FUSABLE, _mutate_relax_functions, _tensor_type, bound_call,
                         constant_array, mark_op_pattern, rewrite_matmul)

logger = logging.getLogger(__package__)

_QUIET_NAN = 0x7FC0


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns (uint16), round to nearest even; NaN stays NaN."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(_QUIET_NAN), rounded)


def bf16_bits_expr(value, *, dtype: str = "uint16"):
    """bf16_bits of one float32 TIR value: add 0x7FFF plus the lowest kept bit, keep the
    high half (as `dtype`). NaN is found by its bits (an integer compare, which vectorizes
    where a float isnan test in a loop with other stores did not)."""
    # bound once (a Let): the bits are read three times below, and a producer inlined into
    # this expression (pack_q's RoPE rotation) would otherwise be computed three times, so
    # the scheduler would keep it as a separate full-size intermediate instead
    bits = tirx.Var("bf16_rne_bits", "uint32")  # bf16_rounding.ROUNDING_VAR: it finds the rounding by it
    kept_lsb = tirx.bitwise_and(tirx.shift_right(bits, tirx.const(16, "uint32")), tirx.const(1, "uint32"))
    rounded = tirx.shift_right(bits + tirx.const(0x7FFF, "uint32") + kept_lsb, tirx.const(16, "uint32"))
    nan = tirx.bitwise_and(bits, tirx.const(0x7FFFFFFF, "uint32")) > tirx.const(0x7F800000, "uint32")
    return tirx.Let(bits, tirx.reinterpret("uint32", value),
                    tirx.Select(nan, tirx.const(_QUIET_NAN, dtype), rounded.astype(dtype)))


def _round_to_bf16_bits(x: te.Tensor, width=None) -> te.Tensor:
    """bf16_bits of x; with `width` > x's last dim, zero columns after it (a K padded to
    what the AMX kernel takes)."""
    k = x.shape[-1]
    if width is None or int(width) == int(k):
        return te.compute(x.shape, lambda *idx: bf16_bits_expr(x[idx]), name="bf16_bits")

    def element(*idx):
        inside = idx[-1] < k
        return tirx.if_then_else(inside, bf16_bits_expr(x[(*idx[:-1], tirx.min(idx[-1], k - 1))]),
                                 tirx.const(0, "uint16"))
    return te.compute((*x.shape[:-1], width), element, name="bf16_bits")


def _up(n: int, multiple: int) -> int:
    return (n + multiple - 1) // multiple * multiple


def _widen(x):
    return tirx.reinterpret("float32", tirx.shift_left(x.astype("uint32"), tirx.const(16, "uint32")))


def _bf16_matmul(a: te.Tensor, w: te.Tensor) -> te.Tensor:
    """float32 C[..., i, j] = sum_k bf16(A[..., i, k]) * bf16(W[k, j]) (what bf16_matmul schedules)."""
    k = te.reduce_axis((0, w.shape[0]), name="k")
    return te.compute((*a.shape[:-1], w.shape[1]),
                      lambda *idx: te.sum(_widen(a[(*idx[:-1], k)]) * _widen(w[k, idx[-1]]), axis=k),
                      name="bf16_matmul")


def _constant_weight(mutator, expr) -> np.ndarray | None:
    """A matmul's right operand as a float32 [K, N] array, when it is a constant (or the
    transpose of one: Gemm with transB)."""
    if isinstance(expr, relax.Var):
        transposed = bound_call(mutator, expr, "relax.permute_dims")
        if transposed is not None:
            inner = _constant_weight(mutator, transposed.args[0])
            axes = transposed.attrs.axes
            if inner is not None and inner.ndim == 2 and (axes is None or [int(a) for a in axes] == [1, 0]):
                return inner.T
            return None
        expr = mutator.lookup_binding(expr)
    value = constant_array(expr)
    return value if value is not None and value.dtype == np.float32 and value.ndim == 2 else None


@relax.expr_functor.mutator
class _Lowerer(relax.PyExprMutator):  # pylint: disable=abstract-method
    def __init__(self, mod: IRModule, fits, *, pad_to_amx: bool, failures=None):
        super().__init__(mod)
        self.failures = failures
        self.fits = fits
        self.pad_to_amx = pad_to_amx
        self.lowered = 0
        self.kept = 0
        self.patterns = {}  # {GlobalVar: OpPatternKind} of the kernels AnnotateTIROpPattern would misjudge

    def visit_call_(self, call):  # pylint: disable=arguments-renamed
        return rewrite_matmul(super().visit_call_(call), self._lower, logger, "matmul kept in float32", self.failures)

    def _lower(self, mm):
        weight = _constant_weight(self, mm.args[1])
        x = _tensor_type(mm.args[0])
        if weight is None or x is None or x[0] != "float32" or len(x[1]) < 2:
            return None  # activation x activation (attention), or not a linear layer
        k, n = weight.shape
        if not isinstance(x[1][-1], tvm.tirx.IntImm) or int(x[1][-1]) != k or not self.fits(k, n):
            self.kept += 1
            return None
        bb = self.builder_
        # AMX takes K and N in multiples of 32: pad them with zeros here (the weight at
        # compile time, the activation's rounding writes the zero columns), and crop N after
        k_pad, n_pad = (_up(k, AMX_K), _up(n, AMX_TILE)) if self.pad_to_amx else (k, n)
        bits_call = bb.call_te(_round_to_bf16_bits, mm.args[0], k_pad, primfunc_name_hint="bf16_bits")
        if k_pad != k:  # injective; AnnotateTIROpPattern would call its guarded read opaque
            self.patterns[bits_call.args[0]] = INJECTIVE
        a = bb.emit(bits_call)
        w16 = np.zeros((k_pad, n_pad), np.uint16)
        w16[:k, :n] = bf16_bits(weight)
        self.lowered += 1
        call = bb.call_te(_bf16_matmul, a, relax.const(w16), primfunc_name_hint="bf16_matmul")
        # a matmul whose epilogue FuseOps may fuse (kOutEWiseFusable, as TVM's own matmuls):
        # AnnotateTIROpPattern would call the widening reduction kCommReduce, and FuseOps
        # would then fuse the activation's rounding into it instead of the bias after it
        self.patterns[call.args[0]] = OUT_ELEMWISE_FUSABLE
        if n_pad == n:
            return call
        rank = len(x[1])
        return relax.op.strided_slice(bb.emit(call), axes=[rank - 1], begin=[0], end=[n])


def lower_bf16_linear(mod: IRModule, target, failures=None) -> tuple[IRModule, int, int]:
    """(the module with its constant-weight matmuls in bf16, how many, how many kept float32
    because the kernel does not take their shape); a lowering that raises is recorded in
    `failures` (failures.PipelineFailures), when given."""
    kernel = bf16_kernel(target)
    if kernel is None:
        raise ValueError(f"--precision bf16 needs a CPU with {needed_features(target_arch(target)) or 'a bf16 kernel'}; "
                         f"target {target} has none of them")
    # vdpbf16ps takes every shape AMX takes and more (bf16_matmul falls back to it); with
    # AMX every shape is padded to its tiles (2% more work at N = 688, against vdpbf16ps)
    amx = kernel == "amx-bf16"
    lowerer = _Lowerer(mod, FITS[kernel], pad_to_amx=amx, failures=failures)
    lowered = _mutate_relax_functions(lowerer, mod)
    if not lowerer.lowered:
        return mod, 0, lowerer.kept
    return relax.transform.DeadCodeElimination()(mark_op_pattern(lowered, lowerer.patterns)), lowerer.lowered, lowerer.kept


@tvm.transform.module_pass(opt_level=0, name="LowerBF16Linear")
class LowerBF16Linear:  # pylint: disable=too-few-public-methods
    """lower_bf16_linear for the target in scope (an llvm target with a bf16 kernel, bf16_isa)."""

    def __init__(self, failures=None):
        self.failures = failures

    def transform_module(self, mod: IRModule, _ctx) -> IRModule:
        return lower_bf16_linear(mod, tvm.target.Target.current(allow_none=False), self.failures)[0]
