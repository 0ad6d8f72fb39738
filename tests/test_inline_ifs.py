"""legalize.inline_decided_ifs (the simplify stage's, before onnxsim): an If whose condition
the ranks decide is replaced by its branch, and the graph computes what onnxruntime computes
on the original; an If that a size decides is kept."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from portable_pe.compile.simplify import ort_session
from portable_pe.legalize import inline_decided_ifs


def _branch(name: str, value: np.ndarray, out: str) -> onnx.GraphProto:
    const = helper.make_node("Constant", [], [f"{name}_c"], value=numpy_helper.from_array(value))
    return helper.make_graph([const, helper.make_node("Identity", [f"{name}_c"], [out])], name, [],
                             [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)])


def _model(condition: str) -> onnx.ModelProto:
    """y = x + (1 if condition else -1), x [T, 4] with T dynamic. "rank": Size(Shape(x)) - 2 > 0
    (false for any T: the rank is 2, as DINOv3's TorchScript RoPE asks); "length": T > 3."""
    nodes = [helper.make_node("Shape", ["x"], ["shape"])]
    if condition == "rank":
        nodes += [helper.make_node("Size", ["shape"], ["rank"]),
                  helper.make_node("Sub", ["rank", "two"], ["extra"]),
                  helper.make_node("Greater", ["extra", "zero"], ["cond"])]
    else:
        nodes += [helper.make_node("Gather", ["shape", "zero"], ["length"], axis=0),
                  helper.make_node("Greater", ["length", "three"], ["cond"])]
    nodes += [helper.make_node("If", ["cond"], ["offset"],
                               then_branch=_branch("then", np.ones(4, np.float32), "a"),
                               else_branch=_branch("else", -np.ones(4, np.float32), "b")),
              helper.make_node("Add", ["x", "offset"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["T", 4])],
        initializer=[numpy_helper.from_array(np.array(v, np.int64), n)
                     for n, v in (("two", 2), ("zero", 0), ("three", 3))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_an_if_decided_by_the_rank_becomes_its_branch():
    model = _model("rank")
    inlined, count = inline_decided_ifs(model)
    assert count == 1 and not [n for n in inlined.graph.node if n.op_type == "If"]
    assert [n.op_type for n in model.graph.node].count("If") == 1  # the caller's model is untouched
    onnx.checker.check_model(inlined)
    before, after = ort_session(model), ort_session(inlined)
    for length in (1, 5):
        x = np.arange(length * 4, dtype=np.float32).reshape(length, 4)
        want = before.run(None, {"x": x})[0]
        np.testing.assert_array_equal(after.run(None, {"x": x})[0], want)
        np.testing.assert_array_equal(want, x - 1)  # the else branch: rank 2 is not above 2


def test_an_if_decided_by_a_size_is_kept():
    model = _model("length")
    inlined, count = inline_decided_ifs(model)
    assert count == 0 and [n.op_type for n in inlined.graph.node].count("If") == 1
