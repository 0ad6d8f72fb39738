"""Attention's head merge written as a concatenation of the heads (npu/head_merge.py), in the
graph RKNN is handed: onnxruntime gives the same output before and after, bit for bit (data
movement only), and only the chain it names is rewritten. RKNN's own verdict on the
rewritten form (transformers' Swin, fp16) is test_rknn_vision.py's."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from portable_pe.npu.head_merge import CONCAT_OF_HEADS, concat_head_merges
from portable_pe.npu.rknn import vendor_graph


def merge_graph(batch: list[int], heads: int, tokens: int, dim: int, out: int, *, opset: int = 17,
                extra_reader: bool = False, target: list[int] | None = None) -> onnx.ModelProto:
    """x [*batch, H, T, D] -> Transpose(.., H<->T) -> Reshape [*batch, T, H*D] -> MatMul W -> + b."""
    rank = len(batch) + 3
    lead = list(range(len(batch)))
    perm = lead + [rank - 2, rank - 3, rank - 1]
    target = target if target is not None else [*batch, tokens, heads * dim]
    rng = np.random.default_rng(0)
    w = rng.standard_normal((target[-1], out)).astype(np.float32)
    b = rng.standard_normal(out).astype(np.float32)
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=perm, name="merge_transpose"),
             helper.make_node("Reshape", ["t", "target"], ["r"], name="merge_reshape"),
             helper.make_node("MatMul", ["r", "w"], ["p"], name="o_proj"),
             helper.make_node("Add", ["p", "b"], ["y"], name="o_bias")]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [*target[:-1], out])]
    if extra_reader:  # someone else reads the transposed heads
        nodes.append(helper.make_node("Relu", ["t"], ["side"], name="side"))
        outputs.append(helper.make_tensor_value_info("side", TensorProto.FLOAT, [*batch, tokens, heads, dim]))
    graph = helper.make_graph(
        nodes, "merge", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [*batch, heads, tokens, dim])], outputs,
        initializer=[numpy_helper.from_array(np.array(target, np.int64), "target"),
                     numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def run(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})


@pytest.mark.parametrize("batch,heads,tokens,dim,out,opset", [
    ([1], 4, 12, 8, 32, 17),  # a text encoder's [1, H, T, D]
    ([196], 4, 4, 8, 32, 17),  # Swin's windows: 196 of 2 x 2 patches, the case RKNN got wrong
    ([1, 3], 2, 5, 16, 24, 17),  # two batch axes
    ([1], 4, 12, 8, 32, 11),  # ReduceSum's axes an attribute before opset 13
])
def test_the_merge_as_a_concatenation_gives_the_same_output(batch, heads, tokens, dim, out, opset):
    model = merge_graph(batch, heads, tokens, dim, out, opset=opset)
    x = np.random.default_rng(1).standard_normal((*batch, heads, tokens, dim)).astype(np.float32)
    want = run(model, x)[0]
    rewritten = onnx.ModelProto.FromString(model.SerializeToString())
    assert concat_head_merges(rewritten) == 1
    onnx.checker.check_model(rewritten, full_check=True)
    ops = [n.op_type for n in rewritten.graph.node]
    assert ops == ["Split"] + ["Reshape"] * heads + ["Concat", "MatMul", "Add"], ops  # no Transpose left
    assert rewritten.graph.node[heads + 1].name.endswith(CONCAT_OF_HEADS)
    assert "target" not in {i.name for i in rewritten.graph.initializer}  # the merge's own view target went
    got = run(rewritten, x)[0]
    assert got.shape == want.shape == (*batch, tokens, out)
    np.testing.assert_array_equal(got, want)


def test_a_merge_whose_heads_are_read_elsewhere_is_left_alone():
    model = merge_graph([1], 4, 6, 8, 16, extra_reader=True)
    before = model.SerializeToString()
    assert concat_head_merges(model) == 0
    assert model.SerializeToString() == before


def test_a_reshape_that_is_not_the_merge_is_left_alone():
    # [1, T, H, D] -> [1, T*H, D]: not the heads merged into the features
    model = merge_graph([1], 4, 6, 8, 16, target=[1, 24, 8])
    x = np.random.default_rng(3).standard_normal((1, 4, 6, 8)).astype(np.float32)
    assert run(model, x)[0].shape == (1, 24, 16)  # a valid graph
    assert concat_head_merges(model) == 0


def test_the_vendor_graph_concatenates_the_heads_and_leaves_the_host_graph_alone():
    model = merge_graph([1], 4, 12, 8, 32)
    before = model.SerializeToString()
    vendor = vendor_graph(model)
    assert model.SerializeToString() == before
    assert "Transpose" not in [n.op_type for n in vendor.graph.node]
    assert sum(n.name.endswith(CONCAT_OF_HEADS) for n in vendor.graph.node) == 1
    x = np.random.default_rng(2).standard_normal((1, 4, 12, 8)).astype(np.float32)
    np.testing.assert_array_equal(run(vendor, x)[0], run(model, x)[0])
