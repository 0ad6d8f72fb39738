"""Constant weights stored in the layout the matmul micro-kernel reads (packed panels).

    MarkConstantWeights   kernel arguments that are constants at every call site
                          -> PrimFunc attr "layout_free_buffers"
    (matmul rule)         such a [K, N] weight is read through a packing block
                          (_pack_constant_weight, annotated as a layout-rewrite preproc)
    SplitWeightPacking    the packing block becomes its own kernel, called on the constant
    FoldWeightPacking     each such call replaced by the packed constant, computed in numpy

TVM has the last two steps (relax.transform.SplitLayoutRewritePreproc, for MetaSchedule's
RewriteLayout) and a pass for the first, AttachAttrLayoutFreeBuffers. That pass renews
every PrimFunc it touches and renames it; on the cumsum DispatchSortScan emits for a
dynamic Range, the renewed function lost its symbolic-length parameter ("variables (T_1,)
are used, but are not passed in as API arguments"). MarkConstantWeights only adds the
attribute.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, tirx
from tvm.ir import IRModule

from .matmul import _LAYOUT_REWRITE_PREPROC
from .relax_util import _mutate_relax_functions
from .tir_util import _blocks_under, _const_int, _is_load, _is_store, _load_buffer, _node


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


# --------------------------------------------------------------------------------------
# Folding the packing calls without compiling them
# --------------------------------------------------------------------------------------
# relax.transform.FoldConstant folds a call_tir on constants by building the PrimFunc
# with LLVM and running it: about 40 ms per packing kernel, 1.2 s of the rope encoder's
# 3.7 s build (32 packed weights with the tuned entry). A packing kernel only moves
# elements, out[index_map(v)] = w[v], so numpy does it from the index map.
_INDEX_OPS = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply,
              "FloorDiv": np.floor_divide, "FloorMod": np.mod}


def _eval_index(expr, env: dict):
    """An affine/floordiv/floormod index expression over numpy index grids."""
    value = _const_int(expr)
    if value is not None:
        return value
    kind = _node(expr)
    if kind in ("Var", "PrimVar", "SizeVar") and expr in env:
        return env[expr]
    if kind in _INDEX_OPS:
        return _INDEX_OPS[kind](_eval_index(expr.a, env), _eval_index(expr.b, env))
    if kind == "Cast":
        return _eval_index(expr.value, env)
    raise ValueError(f"index expression {kind} not folded")


def _pack_with_numpy(func: tirx.PrimFunc, weight: np.ndarray) -> np.ndarray | None:
    """The output of a single-block copy kernel ``out[f(v)] = w[v]`` on ``weight``, or
    None when ``func`` is not such a kernel (FoldConstant then folds it as before)."""
    if len(func.params) != 2:
        return None
    src, dst = func.params
    blocks = list(_blocks_under(func.body))
    blocks = [b for b in blocks if b.name_hint != "root"]
    if len(blocks) != 1:
        return None
    block = blocks[0]
    store = block.body
    if not _is_store(store) or not store.buffer.same_as(dst) or not _is_load(store.value):
        return None
    load = store.value
    iters = [iv.var for iv in block.iter_vars]
    extents = [_const_int(iv.dom.extent) for iv in block.iter_vars]
    shape = [_const_int(d) for d in src.shape]
    if (not _load_buffer(load).same_as(src) or len(load.indices) != len(iters) or None in extents
            or extents != shape or list(weight.shape) != shape
            or not all(i.same_as(v) for i, v in zip(load.indices, iters))):
        return None
    grids = np.indices(shape, dtype=np.int64)
    env = {v: grids[n] for n, v in enumerate(iters)}
    try:
        index = tuple(np.broadcast_to(_eval_index(i, env), shape) for i in store.indices)
    except ValueError:
        return None
    out_shape = [_const_int(d) for d in dst.shape]
    if None in out_shape or int(np.prod(out_shape)) != weight.size:
        return None
    out = np.zeros(out_shape, dtype=weight.dtype)
    out[index] = weight
    written = np.zeros(out_shape, dtype=bool)
    written[index] = True
    return out if written.all() else None  # every element written once: a permutation


@tvm.transform.module_pass(opt_level=0, name="FoldWeightPacking")
def FoldWeightPacking(mod: IRModule, _ctx) -> IRModule:  # pylint: disable=invalid-name
    """Replace each call of a packing kernel on a constant by the packed constant."""
    call_tir = tvm.ir.Op.get("relax.call_tir")
    packed_cache: dict = {}

    @relax.expr_functor.mutator
    class _Folder(relax.PyExprMutator):  # pylint: disable=abstract-method
        def visit_call_(self, call):  # pylint: disable=arguments-renamed
            call = super().visit_call_(call)
            if not call.op.same_as(call_tir):
                return call
            args = call.args[1].fields if isinstance(call.args[1], relax.Tuple) else [call.args[1]]
            func = mod[call.args[0]] if call.args[0] in mod.get_global_vars() else None
            if len(args) != 1 or not isinstance(args[0], tvm.ir.GenericConst) or not isinstance(func, tirx.PrimFunc):
                return call
            key = (call.args[0], args[0])
            if key not in packed_cache:
                packed_cache[key] = _pack_with_numpy(func, args[0].value.numpy())
            packed = packed_cache[key]
            return call if packed is None else relax.const(packed)

    return relax.transform.DeadCodeElimination()(_mutate_relax_functions(_Folder(mod), mod))
