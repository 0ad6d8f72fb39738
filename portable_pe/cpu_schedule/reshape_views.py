"""Reshapes over symbolic dims kept as views instead of legalized into copy kernels.

LegalizeOps turns every ``reshape`` into a TIR copy; RewriteDataflowReshape later turns
that copy back into a zero-copy view, but only where TVM's `has_reshape_pattern` can prove
the copy's index map is a reshape. Over compound symbolic dims it cannot: a vision graph's
flatten of the patch grid ``[B, C, F//2, H//16, W//16] -> [B, C, F//2*(H//16)*(W//16)]``
and the patch stem's split of ``W//16*16`` into ``(W//16, 16)`` stay copies whose every
element does a chain of divisions by symbolic dims. AnnotateTIROpPattern marks them opaque,
so FuseOps never fuses them either: at 4 x 224 x 224 the video graph spent 4.5 ms of its
30 (2 threads) in two such copies of its input and stem output.

This legalization keeps exactly those reshapes as ``relax.reshape`` (lowered by the VM to
a view of the same buffer; every Relax tensor is dense, so any reshape is a view) and
legalizes every other one as TVM does, so fusable reshapes still fuse.
"""

from __future__ import annotations

import tvm
from tvm import relax

from .relax_util import _tensor_type

#: tvm.relax OpPatternKind of a kernel FuseOps never fuses
_OPAQUE = 8


def _tvm_legalization(builder: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    return tvm.ir.Op.get("relax.reshape").get_attr("FLegalize")(builder, call)


def stays_a_copy(call: relax.Call) -> bool:
    """Whether TVM's legalization of this reshape call leaves a copy kernel that
    RewriteDataflowReshape cannot turn back into a view and FuseOps cannot fuse."""
    scratch = relax.BlockBuilder()  # TVM's own legalization, its PrimFunc kept apart
    legalized = _tvm_legalization(scratch, call)
    if not isinstance(legalized, relax.Call) or not isinstance(legalized.args[0], tvm.ir.GlobalVar):
        return False
    copy = scratch.get()[legalized.args[0]]
    if relax.analysis.has_reshape_pattern(copy):
        return False
    annotated = relax.transform.AnnotateTIROpPattern()(tvm.IRModule({"main": copy}))["main"]
    return int(annotated.attrs["op_pattern"]) == _OPAQUE


def legalize_reshape(builder: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """LegalizeOps' rule for ``relax.reshape``: the call unchanged (a view) where legalizing
    it would leave an opaque copy, else TVM's own legalization."""
    if _tensor_type(call.args[0]) is not None and _tensor_type(call) is not None and stays_a_copy(call):
        return call
    return _tvm_legalization(builder, call)


#: LegalizeOps' customize_legalize_map entry
LEGALIZE_MAP = {"relax.reshape": legalize_reshape}
