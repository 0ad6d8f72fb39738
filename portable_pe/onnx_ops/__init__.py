"""Extra ONNX converters for TVM 0.27's Relax ONNX frontend, and an importer that uses them.

TVM 0.27 looks converters up by ``op_type`` alone, in the dict returned by the module
function ``tvm.relax.frontend.onnx.onnx_frontend._get_convert_map`` (called afresh by
the unsupported-op check and by every node conversion).  ``import_onnx`` swaps that
function for one that adds our converters for the duration of one ``from_onnx`` call
and restores it afterwards (not thread-safe: do not import two models concurrently).

Because lookup ignores the domain, and TVM's "Attention" entry is the com.microsoft
contrib op, the standard-domain ``Attention``/``RotaryEmbedding`` nodes are renamed in a
private copy of the model (``PPE_Attention``, ``PPE_RotaryEmbedding``) before import;
com.microsoft nodes keep going to TVM's own converters. TVM's Clip and Gather are
replaced outright (same op_type, no renaming).

    rotary.py      RotaryEmbedding-23
    attention.py   Attention-23/24
    clip.py        Clip as Relax ops
    gather.py      Gather with constant indices, without run-time index arithmetic
    minmax.py      Max/Min of dim values (PrimValues) as one PrimValue
    div.py         a dim value over a positive constant as floordiv, as TVM's shape rules write it
    resize.py      Resize to symbolic sizes (a position table resized to the image's grid)
    reshape.py     Reshape of a dim value (a vision tower's patch count) as a shape value
    canonical.py   every shape in TVM's canonical form once the import is done
    common.py      small Relax helpers the converters share
"""

from __future__ import annotations

import contextlib
import copy
import warnings

import onnx
import tvm
from tvm.relax.frontend import onnx as relax_onnx
from tvm.relax.frontend.onnx import onnx_frontend as _fe

from .attention import Attention
from .canonical import canonical_shapes
from .clip import Clip
from .div import Div
from .gather import Gather
from .minmax import Max, Min
from .reshape import Reshape
from .resize import Resize
from .rotary import RotaryEmbedding

__all__ = ["custom_converters", "import_onnx", "unsupported_nodes", "UnsupportedOnnxOps"]

_STD_DOMAINS = ("", "ai.onnx")
_PREFIX = "PPE_"


class UnsupportedOnnxOps(tvm.error.OpNotImplemented):
    """Raised by import_onnx when some nodes have no converter."""

    def __init__(self, nodes: list[dict]):
        self.nodes = nodes
        lines = [
            f"  node {n['node']!r}: op {n['op']} (domain {n['domain'] or 'ai.onnx'!r}, "
            f"opset {n['opset']}): {n['reason']}"
            for n in nodes
        ]
        super().__init__("ONNX model has operators TVM cannot import:\n" + "\n".join(lines))


# --------------------------------------------------------------------------- #
# registry / import
# --------------------------------------------------------------------------- #
_OUR_OPS = {  # op_type -> (converter, lowest opset version, highest opset version)
    "RotaryEmbedding": (RotaryEmbedding, 23, 23),
    "Attention": (Attention, 23, 24),
}


# TVM converters replaced while importing (same op_type, so no renaming)
_REPLACED_OPS = {"Clip": Clip, "Div": Div, "Gather": Gather, "Max": Max, "Min": Min, "Reshape": Reshape, "Resize": Resize}


def custom_converters() -> dict[str, type]:
    """op_type -> OnnxOpConverter subclass for standard-domain ops TVM 0.27 lacks."""
    return {name: conv for name, (conv, _, _) in _OUR_OPS.items()}


def _since_version(op: str, domain: str, opset: int) -> int | None:
    try:
        return onnx.defs.get_schema(op, opset, domain).since_version
    except Exception:  # pylint: disable=broad-except
        return None


def _iter_nodes(graph: onnx.GraphProto):
    for node in graph.node:
        yield node
        for a in node.attribute:
            for sg in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                yield from _iter_nodes(sg)


def unsupported_nodes(model: onnx.ModelProto) -> list[dict]:
    """Nodes that import_onnx would reject; no conversion is attempted."""
    opsets = {o.domain: o.version for o in model.opset_import}
    std_opset = opsets.get("", opsets.get("ai.onnx", 1))
    tvm_map = _fe._get_convert_map()  # pylint: disable=protected-access
    local_funcs = {(f.domain, f.name) for f in model.functions}
    res = []
    for node in _iter_nodes(model.graph):
        dom = node.domain
        opset = std_opset if dom in _STD_DOMAINS else opsets.get(dom)
        reason = None
        if (dom, node.op_type) in local_funcs:
            reason = "model-local function (legalize() inlines these)"
        elif dom in _STD_DOMAINS:
            if node.op_type in _OUR_OPS:
                _, lo, hi = _OUR_OPS[node.op_type]
                ver = _since_version(node.op_type, "", opset) or opset
                if not lo <= ver <= hi:
                    reason = (
                        f"{node.op_type}-{ver} semantics not implemented "
                        f"(portable_pe handles versions {lo}..{hi})"
                    )
            elif node.op_type not in tvm_map and node.op_type not in ("If", "Constant"):
                reason = "no converter in TVM's Relax ONNX frontend"
        elif dom == "com.microsoft":
            if node.op_type not in tvm_map or node.op_type in ("RotaryEmbedding",):
                reason = "com.microsoft contrib op without a TVM converter"
        else:
            reason = f"custom domain {dom!r} has no converters"
        if reason:
            res.append(
                {
                    "node": node.name or (node.output[0] if node.output else ""),
                    "op": node.op_type,
                    "domain": dom,
                    "opset": opset,
                    "reason": reason,
                }
            )
    return res


@contextlib.contextmanager
def registered_converters(extra: dict[str, type]):
    """Context manager: TVM's ONNX frontend sees ``extra`` converters while inside."""
    orig = _fe._get_convert_map  # pylint: disable=protected-access

    def patched():
        table = orig()
        table.update(extra)
        return table

    _fe._get_convert_map = patched  # pylint: disable=protected-access
    try:
        yield
    finally:
        _fe._get_convert_map = orig  # pylint: disable=protected-access


def _rename_standard_ops(model: onnx.ModelProto) -> onnx.ModelProto:
    model = copy.deepcopy(model)
    for node in _iter_nodes(model.graph):
        if node.domain in _STD_DOMAINS and node.op_type in _OUR_OPS:
            node.op_type = _PREFIX + node.op_type
    return model


def import_onnx(model: onnx.ModelProto, *, shape_dict=None, **kwargs) -> tvm.IRModule:
    """``relax_onnx.from_onnx`` with portable_pe's converters registered.

    Raises UnsupportedOnnxOps (a tvm.error.OpNotImplemented) naming op, node,
    domain and opset of every node without a converter, before converting anything.
    """
    bad = unsupported_nodes(model)
    if bad:
        raise UnsupportedOnnxOps(bad)
    renamed = _rename_standard_ops(model)
    extra = {**_REPLACED_OPS, **{_PREFIX + name: conv for name, (conv, _, _) in _OUR_OPS.items()}}
    with registered_converters(extra), warnings.catch_warnings():
        # the checker inside from_onnx rejects the renamed ops; it only warns
        warnings.filterwarnings("ignore", message=".*No Op registered for PPE_.*")
        kwargs.setdefault("keep_params_in_input", False)
        return canonical_shapes(relax_onnx.from_onnx(renamed, shape_dict=shape_dict, **kwargs))
