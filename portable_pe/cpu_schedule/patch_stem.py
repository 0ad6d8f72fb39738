"""A vision encoder's patch stem (a conv whose stride is its kernel) as a matmul.

A ViT's stem is ``conv2d(x, W)`` with kernel = stride = the patch size and no padding:
every output pixel reads its own patch, once. TOPI's conv2d schedule with symbolic image
sizes ran it as 37% of vit_rope_2d's time at 224 x 224 (26 ms of 72, 2 threads), where
the same multiply-adds as a matmul take the register-blocked, prepacked kernel the
encoder's linears use. This pass, before legalization, writes

    x[:, :, :Hp*p, :Wp*p]  -> reshape [B, C, Hp, p, Wp, p] -> permute [B, Hp, Wp, C, p, p]
      -> reshape [B, Hp*Wp, C*p*p] -> matmul with W as [C*p*p, O] -> [B, Hp, Wp, O] -> [B, O, Hp, Wp]

(Hp = H // p: the slice drops the rows a conv drops, so the result is the conv's for any
H and W). Only a conv2d with a constant weight, NCHW/OIHW layouts, no padding, no
dilation and one group is rewritten; every other conv is left to TOPI.
"""

from __future__ import annotations

import logging

import numpy as np
import tvm
from tvm import relax
from tvm.ir import IRModule

from .relax_util import _mutate_relax_functions, _tensor_type
from .tir_util import _const_int

logger = logging.getLogger(__package__)


def _ints(values) -> list[int] | None:
    out = [_const_int(v) for v in values]
    return None if any(v is None for v in out) else out


def _as_matmul(call, builder):
    """The rewritten expression for a patch-stem conv2d call, or None. `builder` emits the
    patch rows, whose count H // p * (W // p) gets a variable of its own (as the import
    names compound dims, onnx_ops/dim_vars.py: over the expression, the matmul's
    accumulator tile stays in memory)."""
    attrs = call.attrs
    if (str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout)) != ("NCHW", "OIHW", "NCHW") \
            or int(attrs.groups) != 1 or not isinstance(call.args[1], tvm.ir.GenericConst):
        return None
    weight = call.args[1].value.numpy()  # TVM 0.27: a Relax constant's tensor is its `value`
    out_ch, in_ch, kh, kw = weight.shape
    pads = _ints(attrs.padding)
    if _ints(attrs.strides) != [kh, kw] or _ints(attrs.dilation) != [1, 1] or pads is None or any(pads):
        return None
    x, out = _tensor_type(call.args[0]), _tensor_type(call)
    if x is None or out is None or x[0] != "float32":
        return None
    batch, channels, _, _ = x[1]
    _, _, hp, wp = out[1]
    data = relax.op.strided_slice(call.args[0], axes=[2, 3], begin=[0, 0], end=[hp * kh, wp * kw], assume_inbound=True)
    patches = relax.op.reshape(data, [batch, channels, hp, kh, wp, kw])
    patches = relax.op.permute_dims(patches, [0, 2, 4, 1, 3, 5])
    rows = relax.op.reshape(patches, [batch, hp * wp, in_ch * kh * kw])
    if not isinstance(hp * wp, (int, tvm.tirx.IntImm, tvm.tirx.Var)):
        rows = builder.match_cast(builder.emit(rows), relax.TensorType(
            [batch, tvm.tirx.Var("patches", "int64"), in_ch * kh * kw], x[0]))
    flat = np.ascontiguousarray(weight.reshape(out_ch, in_ch * kh * kw).T)
    product = relax.op.matmul(rows, relax.const(flat, str(weight.dtype)))
    grid = relax.op.reshape(product, [batch, hp, wp, out_ch])
    return relax.op.permute_dims(grid, [0, 3, 1, 2])


@relax.expr_functor.mutator
class _PatchStem(relax.PyExprMutator):
    def visit_call_(self, call):  # pylint: disable=arguments-renamed
        call = super().visit_call_(call)
        if getattr(call.op, "name", None) != "relax.nn.conv2d":
            return call
        try:
            rewritten = _as_matmul(call, self.builder_)
        except Exception as err:  # pylint: disable=broad-except  # TOPI's conv stays correct
            logger.debug("cpu_schedule: patch stem kept as conv2d: %s", err)
            return call
        return call if rewritten is None else rewritten


@tvm.transform.module_pass(opt_level=0, name="PatchStemAsMatmul")
def PatchStemAsMatmul(mod: IRModule, _ctx) -> IRModule:  # pylint: disable=invalid-name
    return _mutate_relax_functions(_PatchStem(mod), mod, skip_failures="the patch stem rewrite")
