"""Whole-graph helpers: dead-code removal, shape inference, input-shape overrides."""

from __future__ import annotations

import copy

import onnx


def readers(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    """{tensor name: the nodes that read it, in graph order}."""
    found: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            found.setdefault(name, []).append(node)
    return found


def _dce(graph: onnx.GraphProto):
    needed = {o.name for o in graph.output}
    keep = []
    for node in reversed(graph.node):
        if any(o in needed for o in node.output) or _has_subgraph(node):
            keep.append(node)
            needed.update(i for i in node.input if i)
            for a in node.attribute:
                for sg in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                    needed.update(_subgraph_inputs(sg))
    keep.reverse()
    del graph.node[:]
    graph.node.extend(keep)
    inits = [i for i in graph.initializer if i.name in needed]
    del graph.initializer[:]
    graph.initializer.extend(inits)
    vis = [v for v in graph.value_info if v.name in needed]
    del graph.value_info[:]
    graph.value_info.extend(vis)


def _has_subgraph(node):
    return any(a.HasField("g") or len(a.graphs) for a in node.attribute)


def _subgraph_inputs(g):
    names = set()
    for n in g.node:
        names.update(i for i in n.input if i)
        for a in n.attribute:
            for sg in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                names |= _subgraph_inputs(sg)
    return names


def _infer(model: onnx.ModelProto) -> onnx.ModelProto:
    # Start from scratch on intermediate shapes: exporter-written value_info may
    # carry stale or unparseable dims; keep graph input/output declarations.
    m = copy.deepcopy(model)
    del m.graph.value_info[:]
    try:
        return onnx.shape_inference.infer_shapes(m, data_prop=True)
    except Exception:  # pylint: disable=broad-except
        try:
            return onnx.shape_inference.infer_shapes(m)
        except Exception:  # pylint: disable=broad-except
            return m


def _set_input_shapes(model: onnx.ModelProto, input_shapes: dict[str, list]):
    for vi in model.graph.input:
        if vi.name not in input_shapes:
            continue
        dims = vi.type.tensor_type.shape.dim
        new = input_shapes[vi.name]
        del dims[:]
        for d in new:
            dim = dims.add()
            if isinstance(d, str):
                dim.dim_param = d
            elif d is None or int(d) < 0:
                dim.dim_param = f"{vi.name}_dim{len(dims) - 1}"
            else:
                dim.dim_value = int(d)
