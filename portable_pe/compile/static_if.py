"""If nodes whose condition the graph's static facts decide, replaced by the branch taken.

TorchScript exports some shape-generic code as ONNX ``If`` nodes (DINOv3's RoPE: ``repeat``
over a tensor whose rank the tracer did not keep, ``if Size(Shape(x)) - 2 > 0``). The
condition depends only on ranks, which are known once shapes are inferred, but onnxsim
neither folds ``Size(Shape(x))`` for an x with a symbolic dim nor inlines an If, and its
constant folding then fails on the graph; TVM's importer cannot follow the If either
("Expected a 1-D tensor, but got ndim=2" at the Slice that uses its result).

``inline_static_ifs`` evaluates the small shape arithmetic reachable from constants and
from static ranks (``Shape`` of a tensor with static dims, ``Size`` of a tensor with a
static shape), and where an If's condition becomes a constant it puts the taken branch's
nodes in the If's place. Everything else is left to onnxsim.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

#: the ops evaluated here: shape arithmetic, on a handful of elements
_ARITHMETIC = {"Add", "Sub", "Mul", "Div", "Neg", "Abs", "Less", "Greater", "Equal", "LessOrEqual",
               "GreaterOrEqual", "Not", "And", "Or", "Cast", "Unsqueeze", "Squeeze", "Concat", "Gather",
               "Reshape", "Identity", "Min", "Max", "Slice"}
_SMALL = 64  # elements: a shape or a condition, never a weight


def inline_static_ifs(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """(the model with every statically decided If replaced by its branch, how many were)."""
    if not any(node.op_type == "If" for node in model.graph.node):
        return model, 0
    model = onnx.ModelProto.FromString(model.SerializeToString())  # the caller's model is untouched
    inlined = 0
    while True:
        values = _static_values(onnx.shape_inference.infer_shapes(model))
        done = _inline_decided(model.graph, values)
        if not done:
            return model, inlined
        inlined += done


def _static_shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    graph = model.graph
    shapes = {}
    for info in list(graph.value_info) + list(graph.input) + list(graph.output):
        tensor = info.type.tensor_type
        if tensor.HasField("shape"):
            dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim)
            shapes[info.name] = dims
    for init in graph.initializer:
        shapes[init.name] = tuple(init.dims)
    return shapes


def _static_values(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """name -> value for the small tensors known before anything runs."""
    from onnx.reference import ReferenceEvaluator
    graph = model.graph
    shapes = _static_shapes(model)
    values = {init.name: numpy_helper.to_array(init) for init in graph.initializer
              if int(np.prod(init.dims)) <= _SMALL}
    for node in graph.node:
        out = node.output[0] if node.output else None
        if node.op_type == "Constant":
            value = numpy_helper.to_array(next(a.t for a in node.attribute if a.name == "value")) \
                if any(a.name == "value" for a in node.attribute) else None
            if value is not None and value.size <= _SMALL:
                values[out] = value
        elif node.op_type == "Shape" and not node.attribute and node.input[0] in shapes \
                and -1 not in shapes[node.input[0]]:
            values[out] = np.array(shapes[node.input[0]], dtype=np.int64)
        elif node.op_type == "Shape" and not node.attribute and node.input[0] in shapes:
            shapes[out] = (len(shapes[node.input[0]]),)  # its length is the rank, known
        elif node.op_type == "Size" and node.input[0] in shapes and -1 not in shapes[node.input[0]]:
            values[out] = np.array(int(np.prod(shapes[node.input[0]])), dtype=np.int64)
        elif node.op_type in _ARITHMETIC and node.input and all(i in values for i in node.input if i):
            single = helper.make_model(helper.make_graph(
                [node], "one", [], [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None)
                                    for o in node.output],
                initializer=[numpy_helper.from_array(values[i], i) for i in node.input if i]),
                opset_imports=model.opset_import)
            try:
                results = ReferenceEvaluator(single).run(None, {})
            except Exception:  # pylint: disable=broad-except  # not foldable here: onnxsim's turn
                continue
            for name, value in zip(node.output, results):
                if value.size <= _SMALL:
                    values[name] = np.asarray(value)
    return values


def _inline_decided(graph: onnx.GraphProto, values: dict[str, np.ndarray]) -> int:
    taken = {}
    for index, node in enumerate(graph.node):
        if node.op_type == "If" and node.input[0] in values:
            name = "then_branch" if bool(np.asarray(values[node.input[0]]).reshape(-1)[0]) else "else_branch"
            taken[index] = next(a.g for a in node.attribute if a.name == name)
    if not taken:
        return 0
    outer = {name for node in graph.node for name in node.output} | {i.name for i in graph.input} \
        | {i.name for i in graph.initializer}
    nodes = []
    for index, node in enumerate(graph.node):
        if index not in taken:
            nodes.append(node)
            continue
        nodes.extend(_branch_nodes(node, taken[index], outer, graph))
    del graph.node[:]
    graph.node.extend(nodes)
    return len(taken)


def _branch_nodes(node: onnx.NodeProto, branch: onnx.GraphProto, outer: set[str],
                  graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The branch's nodes for the main graph: names it makes that the outer graph also uses
    get the If's name as a prefix, and its outputs become the If's outputs."""
    made = {name for n in branch.node for name in n.output} | {i.name for i in branch.initializer}
    rename = {name: f"{node.name}/{name}" for name in made if name in outer}
    nodes = []
    for init in branch.initializer:
        copy = onnx.TensorProto()
        copy.CopyFrom(init)
        copy.name = rename.get(init.name, init.name)
        graph.initializer.append(copy)
    for inner in branch.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(inner)
        copy.input[:] = [rename.get(i, i) for i in inner.input]
        copy.output[:] = [rename.get(o, o) for o in inner.output]
        nodes.append(copy)
    for result, out in zip(branch.output, node.output):
        nodes.append(helper.make_node("Identity", [rename.get(result.name, result.name)], [out],
                                      name=f"{node.name}/taken_{out}"))
    return nodes
