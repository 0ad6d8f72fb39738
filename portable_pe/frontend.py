"""Import: ONNX -> Relax, refusing ops TVM cannot import with the op, node and opset named."""

from __future__ import annotations

import onnx


class UnsupportedOpError(ValueError):
    """The graph holds ops the Relax ONNX importer has no converter for."""


def blocking_nodes(model: onnx.ModelProto) -> list[dict]:
    from tvm.relax.frontend.onnx import onnx_frontend
    known = onnx_frontend._get_convert_map()
    opsets = {o.domain or "ai.onnx": o.version for o in model.opset_import}
    return [{"node": node.name or f"#{i}", "op": node.op_type, "domain": node.domain or "ai.onnx",
             "opset": opsets.get(node.domain or "ai.onnx")}
            for i, node in enumerate(model.graph.node) if node.op_type not in known]


def import_onnx(model: onnx.ModelProto, *, shape_dict: dict | None = None):
    from tvm.relax.frontend import onnx as relax_onnx
    blocked = blocking_nodes(model)
    if blocked:
        listing = "; ".join(f"{b['op']} (node {b['node']}, {b['domain']} opset {b['opset']})" for b in blocked[:10])
        raise UnsupportedOpError(f"TVM's ONNX importer cannot take {len(blocked)} node(s): {listing}")
    return relax_onnx.from_onnx(model, shape_dict=shape_dict, keep_params_in_input=False)
