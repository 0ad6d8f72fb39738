"""Constant weights stored in the layout the matmul micro-kernel reads (packed panels).

    MarkConstantWeights   kernel arguments that are constants at every call site
                          -> PrimFunc attr "layout_free_buffers"
    (matmul rule)         such a [K, N] weight is read through a packing block
                          (_pack_constant_weight, annotated as a layout-rewrite preproc)
    SplitWeightPacking    the packing block becomes its own kernel, called on the constant;
                          FoldConstant then runs it once, at compile time

TVM has the last two steps (relax.transform.SplitLayoutRewritePreproc, for MetaSchedule's
RewriteLayout) and a pass for the first, AttachAttrLayoutFreeBuffers. That pass renews
every PrimFunc it touches and renames it; on the cumsum DispatchSortScan emits for a
dynamic Range, the renewed function lost its symbolic-length parameter ("variables (T_1,)
are used, but are not passed in as API arguments"). MarkConstantWeights only adds the
attribute.
"""

from __future__ import annotations

import tvm
from tvm import relax, tirx
from tvm.ir import IRModule

from .matmul import _LAYOUT_REWRITE_PREPROC
from .tir_util import _blocks_under


def _constant_args_per_kernel(mod: IRModule) -> dict:
    """For each PrimFunc called with call_tir: the argument positions that are constants
    at every call site."""
    call_tir = tvm.ir.Op.get("relax.call_tir")
    found: dict = {}

    def visit(expr):
        if isinstance(expr, relax.Call) and expr.op.same_as(call_tir):
            args = expr.args[1].fields if isinstance(expr.args[1], relax.Tuple) else [expr.args[1]]
            # TVM 0.27: Relax constants are tvm.ir.GenericConst (ir.Constant for PrimExprs)
            constant = {i for i, a in enumerate(args) if isinstance(a, tvm.ir.GenericConst)}
            gv = expr.args[0]
            found[gv] = found[gv] & constant if gv in found else constant

    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return found


@tvm.transform.module_pass(opt_level=0, name="MarkConstantWeights")
def MarkConstantWeights(mod: IRModule, _ctx) -> IRModule:  # pylint: disable=invalid-name
    """Set "layout_free_buffers" on every PrimFunc that takes constant arguments."""
    for gv, positions in _constant_args_per_kernel(mod).items():
        func = mod[gv]
        if positions and isinstance(func, tirx.PrimFunc):
            mod[gv] = func.with_attr("layout_free_buffers", sorted(positions))
    return mod


@tvm.transform.module_pass(opt_level=0, name="SplitWeightPacking")
def SplitWeightPacking(mod: IRModule, _ctx) -> IRModule:  # pylint: disable=invalid-name
    """relax.transform.SplitLayoutRewritePreproc over the kernels that pack a weight.

    The TVM pass walks every PrimFunc of the module and stops at any whose root holds no
    block (that cumsum again), so it is shown the Relax functions and the packing kernels
    only; the other PrimFuncs, which it would leave as they are, are added back after."""
    packing = {gv for gv, f in mod.functions_items()
               if isinstance(f, tirx.PrimFunc) and f.attrs is not None and f.attrs.get("layout_free_buffers")
               and any(_LAYOUT_REWRITE_PREPROC in block.annotations for block in _blocks_under(f.body))}
    if not packing:
        return mod
    view = IRModule({gv: f for gv, f in mod.functions_items() if not isinstance(f, tirx.PrimFunc) or gv in packing},
                    attrs=mod.attrs, global_infos=mod.global_infos)
    out = relax.transform.SplitLayoutRewritePreproc()(view)
    for gv, func in mod.functions_items():
        if isinstance(func, tirx.PrimFunc) and gv not in packing:
            out[gv] = func
    return out
