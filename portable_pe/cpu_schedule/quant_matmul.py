"""Quantized matmuls of a QDQ graph as integer matmuls (Relax, before legalization).

A QDQ graph (ONNX QuantizeLinear/DequantizeLinear pairs, as onnxruntime's quantizer and
NPU toolchains write them) says *where* values are int8, but computes in float:

    y = matmul(dequantize(q, s_a, z_a), dequantize(W, s_w[N], 0))       # q int8/uint8, W int8

Legalized as written, that is a float matmul on dequantized copies. Here it becomes

    acc = int_matmul(a, Wk)                    # int32 accumulation, kernel operand types
    y   = float(acc - comp[N]) * (s_a * s_w[N])

where ``a`` is q in the operand type of the target's dot product (``int8_isas``: the
first that keeps this weight exact; on AVX2 the 7-bit kernel when |W| <= 64) and
``comp`` the zero-point correction: for uint8 kernels (x86 VNNI) a = q + 128 when q is
int8, and comp = z * colsum(W); for int16 kernels the zero point is subtracted while
widening (a = q - z, exact in int16), so comp = 0. Both are exact in integers, so the
result equals the QDQ graph's up to float rounding of the final scale. The float ops after
``acc`` (and the bias, activation, residual and next quantize that follow in the graph)
fuse into the matmul kernel's epilogue (FuseOps), and the conversion of ``q`` fuses into
the kernel that quantizes it.

Only matmuls whose weight is a constant int8 tensor, quantized per output channel (or
per tensor) with zero points 0, and whose activation is quantized per tensor, are
rewritten; everything else (attention's activation x activation matmuls) keeps its
float semantics.
"""

from __future__ import annotations

import logging

import numpy as np
import tvm
from tvm import relax, te
from tvm.ir import IRModule

from .int8_isa import int8_isas
from .relax_util import _mutate_relax_functions, _tensor_type, bound_call, constant_array, rewrite_matmul

logger = logging.getLogger(__package__)


def _int_matmul(a: te.Tensor, w: te.Tensor) -> te.Tensor:
    """int32 C[..., i, j] = sum_k A[..., i, k] * W[k, j] (what int8_matmul schedules)."""
    k = te.reduce_axis((0, w.shape[0]), name="k")
    return te.compute((*a.shape[:-1], w.shape[1]),
                      lambda *idx: te.sum(a[(*idx[:-1], k)].astype("int32") * w[k, idx[-1]].astype("int32"), axis=k),
                      name="int_matmul")


@relax.expr_functor.mutator
class _Lowerer(relax.PyExprMutator):  # pylint: disable=abstract-method
    def __init__(self, mod: IRModule, isas, failures=None):
        super().__init__(mod)
        self.failures = failures
        self.isas = isas
        self.lowered = 0

    def _bound(self, expr, op_name: str):
        """The call ``expr`` is bound to, when it is a call of ``op_name``."""
        return bound_call(self, expr, op_name)

    def visit_call_(self, call):  # pylint: disable=arguments-renamed
        return rewrite_matmul(super().visit_call_(call), self._lower, logger, "quantized matmul kept in float",
                              self.failures)

    def _lower(self, mm):
        act, wgt = self._bound(mm.args[0], "relax.dequantize"), self._bound(mm.args[1], "relax.dequantize")
        if act is None or wgt is None or str(act.attrs.out_dtype) != "float32":
            return None
        q, s_a, z_a = act.args
        w, s_w, z_w = (constant_array(x) for x in wgt.args)
        s_a, z_a = constant_array(s_a), constant_array(z_a)
        q_info = _tensor_type(q)
        if s_a is None or z_a is None or s_a.size != 1 or z_a.size != 1 or q_info is None:
            return None
        if str(q_info[0]) not in ("int8", "uint8") or w is None or w.dtype != np.int8 or w.ndim != 2:
            return None
        k_dim, n_dim = w.shape
        if s_w is None or z_w is None or np.any(z_w != 0) or s_w.size not in (1, n_dim):
            return None
        if s_w.size == n_dim and n_dim != 1 and int(wgt.attrs.axis) not in (1, -1):
            return None  # scales along K cannot be factored out of the sum
        if len(q_info[1]) < 2 or not isinstance(q_info[1][-1], tvm.tirx.IntImm) or int(q_info[1][-1]) != k_dim:
            return None
        isa = next((i for i in self.isas if i.takes(w)), None)
        if isa is None:
            return None
        a, z = self._kernel_operand(q, str(q_info[0]), int(z_a.reshape(())), isa.a_dtype)
        bb = self.builder_
        acc = bb.emit(bb.call_te(_int_matmul, a, relax.const(w.astype(isa.w_dtype)),
                                 primfunc_name_hint="int8_matmul"))
        scale = (np.float64(s_a.reshape(())) * s_w.astype(np.float64).reshape(-1)).astype(np.float32)
        if z:
            comp = (z * w.astype(np.int64).sum(axis=0)).astype(np.int32)
            acc = bb.emit(relax.op.subtract(acc, relax.const(comp)))
        self.lowered += 1
        return relax.op.multiply(relax.op.astype(acc, "float32"), relax.const(scale))

    def _kernel_operand(self, q, q_dtype: str, zero_point: int, target: str):
        """q converted to the kernel's activation type `target`, and the zero point left in it."""
        emit = self.builder_.emit
        if target == q_dtype:
            return q, zero_point
        wide = emit(relax.op.astype(q, "int16"))
        if target == "int16":  # widened with the zero point taken out: exact, no correction
            return (emit(relax.op.subtract(wide, relax.const(zero_point, "int16"))) if zero_point else wide), 0
        # int8 <-> uint8: a shift by 128, done in int16 so it cannot wrap
        shift = 128 if target == "uint8" else -128
        shifted = emit(relax.op.add(wide, relax.const(shift, "int16")))
        return emit(relax.op.astype(shifted, target)), zero_point + shift


@tvm.transform.module_pass(opt_level=0, name="LowerQuantizedMatmul")
class LowerQuantizedMatmul:  # pylint: disable=too-few-public-methods
    """Rewrite dequantize -> matmul (constant int8 weight) into an integer matmul for the
    CPU target in scope; a module without such patterns is returned as it is. A lowering
    that raises is recorded in ``failures`` (failures.PipelineFailures), when given."""

    def __init__(self, failures=None):
        self.failures = failures

    def transform_module(self, mod: IRModule, _ctx) -> IRModule:
        target = tvm.target.Target.current(allow_none=True)
        if target is None or target.kind.name != "llvm":
            return mod
        lowerer = _Lowerer(mod, int8_isas(target), self.failures)
        lowered = _mutate_relax_functions(lowerer, mod)
        if not lowerer.lowered:
            return mod
        return relax.transform.DeadCodeElimination()(lowered)
