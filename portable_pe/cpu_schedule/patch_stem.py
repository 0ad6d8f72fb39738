"""A vision encoder's patch stem (a conv whose stride is its kernel) as a matmul.

A ViT's stem is ``conv2d(x, W)`` with kernel = stride = the patch size and no padding:
every output pixel reads its own patch, once. TOPI's conv2d schedule with symbolic image
sizes ran it as 37% of vit_rope_2d's time at 224 x 224 (26 ms of 72, 2 threads), where
the same multiply-adds as a matmul take the register-blocked, prepacked kernel the
encoder's linears use. This pass, before legalization, writes

    x[:, :, :Hp*p, :Wp*p]  -> reshape [B, C, Hp, p, Wp, p] -> permute [B, Hp, Wp, C, p, p]
      -> reshape [B, Hp*Wp, C*p*p] -> matmul with W as [C*p*p, O] -> [B, Hp, Wp, O] -> [B, O, Hp, Wp]

(Hp = H // p: the slice drops the rows a conv drops, so the result is the conv's for any
H and W). A video's conv3d over (t, p, p) tubelets is the same with a third axis: TOPI's
conv3d ran video_none's stem in 82 ms of its 106 at 4 x 224 x 224 (2 threads), where
onnxruntime ran the whole graph in 17.6. Only a conv with a constant weight, NC(D)HW /
OI(D)HW layouts, no padding, no dilation and one group is rewritten; every other conv is
left to TOPI.
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


#: the layouts rewritten, by op: (data, kernel) layouts, spatial axes last
_LAYOUTS = {"relax.nn.conv2d": ("NCHW", "OIHW"), "relax.nn.conv3d": ("NCDHW", "OIDHW")}


def _as_matmul(call, builder):
    """The rewritten expression for a patch-stem conv2d or conv3d call, or None. `builder`
    emits the patch rows, whose count (H // p * (W // p), times F // t for a video's
    tubelets) gets a variable of its own (as the import names compound dims,
    onnx_ops/dim_vars.py: over the expression, the matmul's accumulator tile stays in
    memory)."""
    attrs = call.attrs
    data_layout, kernel_layout = _LAYOUTS[call.op.name]
    if (str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout)) != (data_layout, kernel_layout,
                                                                                     data_layout) \
            or int(attrs.groups) != 1 or not isinstance(call.args[1], tvm.ir.GenericConst):
        return None
    weight = call.args[1].value.numpy()  # TVM 0.27: a Relax constant's tensor is its `value`
    out_ch, in_ch, *kernel = weight.shape
    spatial = len(kernel)
    pads = _ints(attrs.padding)
    if _ints(attrs.strides) != kernel or _ints(attrs.dilation) != [1] * spatial or pads is None or any(pads):
        return None
    x, out = _tensor_type(call.args[0]), _tensor_type(call)
    if x is None or out is None or x[0] != "float32":
        return None
    batch, channels = x[1][:2]
    grid = list(out[1][2:])
    axes = list(range(2, 2 + spatial))
    data = relax.op.strided_slice(call.args[0], axes=axes, begin=[0] * spatial,
                                  end=[g * k for g, k in zip(grid, kernel)], assume_inbound=True)
    # [B, C, G0, K0, G1, K1, ...] -> [B, G0, G1, ..., C, K0, K1, ...]
    patches = relax.op.reshape(data, [batch, channels, *[d for g, k in zip(grid, kernel) for d in (g, k)]])
    patches = relax.op.permute_dims(patches, [0, *range(2, 2 + 2 * spatial, 2), 1, *range(3, 3 + 2 * spatial, 2)])
    count = grid[0]
    for g in grid[1:]:
        count = count * g
    patch_size = in_ch * int(np.prod(kernel))
    rows = relax.op.reshape(patches, [batch, count, patch_size])
    if not isinstance(count, (int, tvm.tirx.IntImm, tvm.tirx.Var)):
        rows = builder.match_cast(builder.emit(rows), relax.TensorType(
            [batch, tvm.tirx.Var("patches", "int64"), patch_size], x[0]))
    flat = np.ascontiguousarray(weight.reshape(out_ch, patch_size).T)
    product = relax.op.matmul(rows, relax.const(flat, str(weight.dtype)))
    grid_out = relax.op.reshape(product, [batch, *grid, out_ch])
    return relax.op.permute_dims(grid_out, [0, 1 + spatial, *range(1, 1 + spatial)])


@relax.expr_functor.mutator
class _PatchStem(relax.PyExprMutator):
    def visit_call_(self, call):  # pylint: disable=arguments-renamed
        call = super().visit_call_(call)
        if getattr(call.op, "name", None) not in _LAYOUTS:
            return call
        try:
            rewritten = _as_matmul(call, self.builder_)
        except Exception as err:  # pylint: disable=broad-except  # TOPI's conv stays correct
            logger.debug("cpu_schedule: patch stem kept as a conv: %s", err)
            return call
        return call if rewritten is None else rewritten


@tvm.transform.module_pass(opt_level=0, name="PatchStemAsMatmul")
def PatchStemAsMatmul(mod: IRModule, _ctx) -> IRModule:  # pylint: disable=invalid-name
    return _mutate_relax_functions(_PatchStem(mod), mod, skip_failures="the patch stem rewrite")
