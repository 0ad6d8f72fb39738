"""npu.merged_axes: a rank-6 window partition (transformers' Swin) becomes a rank-4 Transpose
that moves the same elements, checked by onnxruntime on the graph before and after."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from portable_pe.compile.simplify import ort_session
from portable_pe.npu.merged_axes import merge_transposed_axes


def _partition(perm, out_shape) -> onnx.ModelProto:
    """x (1, 8, 12, 3) cut into 2 x 3 windows: (1, 4, 2, 4, 3, 3), transposed by perm."""
    inits = [numpy_helper.from_array(np.array([1, 4, 2, 4, 3, 3], np.int64), "view"),
             numpy_helper.from_array(np.array(out_shape, np.int64), "flat")]
    nodes = [helper.make_node("Reshape", ["x", "view"], ["v"], name="view"),
             helper.make_node("Transpose", ["v"], ["t"], perm=perm, name="move"),
             helper.make_node("Reshape", ["t", "flat"], ["y"], name="flat")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 12, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_window_partition_runs_at_rank_four_and_moves_the_same_elements():
    model = _partition([0, 1, 3, 2, 4, 5], [-1, 6, 3])
    merged = onnx.ModelProto.FromString(model.SerializeToString())
    assert merge_transposed_axes(merged, max_rank=4) == 1
    perm = next(list(a.ints) for n in merged.graph.node if n.op_type == "Transpose" for a in n.attribute)
    assert perm == [0, 2, 1, 3]
    x = np.arange(8 * 12 * 3, dtype=np.float32).reshape(1, 8, 12, 3)
    want = ort_session(model).run(None, {"x": x})[0]
    np.testing.assert_array_equal(ort_session(merged).run(None, {"x": x})[0], want)
    # the windows, independently: window (i, j) holds rows 2i..2i+1 and columns 3j..3j+2
    np.testing.assert_array_equal(want[1 * 4 + 2], x[0, 2:4, 6:9].reshape(6, 3))


def test_a_permutation_with_more_runs_than_the_rank_is_left_alone():
    model = _partition([5, 4, 3, 2, 1, 0], [-1])
    assert merge_transposed_axes(model, max_rank=4) == 0
