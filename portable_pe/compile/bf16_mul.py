"""bfloat16 Mul as a float32 Mul between Casts: onnxruntime's CPU provider has no bf16 Mul
kernel ("Could not find an implementation for Mul(14)"), and exporters write one where a
model multiplies in bf16 (Falcon's ALiBi: ``slopes.bfloat16() * positions``).

The rewrite is exact: the product of two bf16 values (8-bit significands) needs at most
16 significant bits, so the float32 product is exact and the one Cast back to bf16 rounds
it as a bf16 multiply rounds the exact product. (Add/Sub would not be: their float32
result can already be rounded, then rounded again.)
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper


def _elem_types(model: onnx.ModelProto) -> dict[str, int]:
    inferred = onnx.shape_inference.infer_shapes(model)
    g = inferred.graph
    types = {vi.name: vi.type.tensor_type.elem_type for vi in [*g.input, *g.output, *g.value_info]}
    types.update({t.name: t.data_type for t in g.initializer})
    return types


def widen_bf16_mul(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """(model with every bf16 Mul of its main graph computed in float32, how many)."""
    types = _elem_types(model)

    def bf16_mul(node) -> bool:
        return node.op_type == "Mul" and node.domain in ("", "ai.onnx") and types.get(node.output[0]) == TensorProto.BFLOAT16

    count = sum(map(bf16_mul, model.graph.node))
    if not count:
        return model, 0
    model = onnx.ModelProto.FromString(model.SerializeToString())
    nodes = []
    for node in model.graph.node:
        if not bf16_mul(node):
            nodes.append(node)
            continue
        base = node.name or node.output[0]
        wide = [f"{base}/f32_in{k}" for k in range(2)]
        for k, (src, dst) in enumerate(zip(node.input, wide)):
            nodes.append(helper.make_node("Cast", [src], [dst], name=f"{base}/cast_in{k}", to=TensorProto.FLOAT))
        nodes.append(helper.make_node("Mul", wide, [f"{base}/f32_out"], name=f"{base}/f32"))
        nodes.append(helper.make_node("Cast", [f"{base}/f32_out"], list(node.output), name=base,
                                      to=TensorProto.BFLOAT16))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model, count
