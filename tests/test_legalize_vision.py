"""legalize and the import on the shape patterns foreign vision exports hold, each graph
built by hand and run by onnxruntime before and after (and by TVM where it imports):

* an image side known to be a multiple of the patch decides the padding to whole windows
  (Swin's ``(w - (H // p) % w) % w``): the Pad is gone with ``multiples``, kept without;
* a Split by symbolic sizes (prefix tokens and h * w patches) becomes Slices TVM imports;
* an If on a tensor's rank (a TorchScript broadcast) is inlined as the branch taken;
* torch.export's dim names (``8*h``) become identifiers TVM can bind.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as oh
from onnx import numpy_helper as nh

pytest.importorskip("onnxruntime")
pytest.importorskip("tvm")

from conftest import assert_parity  # noqa: E402
from portable_pe.compile.frontend import name_dim_expressions  # noqa: E402
from portable_pe.compile.simplify import ort_session  # noqa: E402
from portable_pe.legalize import legalize  # noqa: E402


def _c(name, value):
    return nh.from_array(np.array(value, np.int64), name)


def _model(nodes, inputs, outputs, inits=()):
    graph = oh.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return onnx.helper.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


def _ort(model, feeds):
    return ort_session(model).run(None, feeds)


def _tvm(model, feeds):
    import tvm
    from tvm import relax
    from portable_pe.onnx_ops import import_onnx
    mod = import_onnx(model)
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(v) for v in feeds.values()])
    return [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]


def _window_pad_model():
    """x [1, 2, H, 4] padded on H to whole windows of 2 after a patch of 4: (2 - (H//4) % 2) % 2 * 4."""
    nodes = [
        oh.make_node("Shape", ["x"], ["shape"]),
        oh.make_node("Gather", ["shape", "two"], ["h"], axis=0),
        oh.make_node("Div", ["h", "four"], ["hp"]),
        oh.make_node("Mod", ["hp", "window"], ["r"]),
        oh.make_node("Sub", ["window", "r"], ["gap"]),
        oh.make_node("Mod", ["gap", "window"], ["pad_p"]),
        oh.make_node("Mul", ["pad_p", "four"], ["pad"]),
        oh.make_node("Unsqueeze", ["pad", "zero_axis"], ["pad1"]),
        oh.make_node("Concat", ["zeros6", "pad1", "zero1"], ["pads"], axis=0),
        oh.make_node("Pad", ["x", "pads"], ["y"]),
    ]
    inits = [_c("two", 2), _c("four", 4), _c("window", 2), _c("zero_axis", [0]), _c("zeros6", [0] * 6), _c("zero1", [0])]
    return _model(nodes, [oh.make_tensor_value_info("x", TP.FLOAT, [1, 2, "H", 4])],
                  [oh.make_tensor_value_info("y", TP.FLOAT, None)], inits)


def _pads(model):
    """The Pad's pads as a list where they are a constant, else None (also where there is no Pad)."""
    pad = next((n for n in model.graph.node if n.op_type == "Pad"), None)
    if pad is None:
        return None
    inits = {i.name: nh.to_array(i).tolist() for i in model.graph.initializer}
    return inits.get(pad.input[1])


def test_a_multiple_decides_the_window_padding():
    model = _window_pad_model()
    with_multiple = legalize(model, multiples={"H": 16})
    without = legalize(model)
    # (2 - 4q % 2) % 2 = 0: padding by nothing, so no Pad is left for TVM
    assert not [n for n in with_multiple.graph.node if n.op_type == "Pad"]
    assert _pads(without) is None  # undecided: still computed from H
    for h in (16, 32, 48):
        feeds = {"x": np.random.default_rng(h).standard_normal((1, 2, h, 4)).astype(np.float32)}
        assert_parity(_ort(model, feeds)[0], _ort(with_multiple, feeds)[0], name=f"H={h}")
        assert_parity(_ort(model, feeds)[0], _tvm(with_multiple, feeds)[0], name=f"tvm H={h}")
    odd = {"x": np.zeros((1, 2, 20, 4), np.float32)}  # not a multiple of 16: the original pads
    assert _ort(model, odd)[0].shape[2] == 24


def test_a_split_by_symbolic_sizes_imports_as_slices():
    """tokens [1, N, 4] split into the CLS token and the N - 1 patches."""
    nodes = [
        oh.make_node("Shape", ["x"], ["shape"]),
        oh.make_node("Gather", ["shape", "one"], ["n"], axis=0),
        oh.make_node("Sub", ["n", "one"], ["patches"]),
        oh.make_node("Unsqueeze", ["patches", "zero_axis"], ["patches1"]),
        oh.make_node("Concat", ["one1", "patches1"], ["sizes"], axis=0),
        oh.make_node("Split", ["x", "sizes"], ["cls", "grid"], axis=1),
        oh.make_node("Add", ["grid", "cls"], ["y"]),
    ]
    model = _model(nodes, [oh.make_tensor_value_info("x", TP.FLOAT, [1, "N", 4])],
                   [oh.make_tensor_value_info("y", TP.FLOAT, None)],
                   [_c("one", 1), _c("one1", [1]), _c("zero_axis", [0])])
    done = legalize(model)
    assert "Split" not in {n.op_type for n in done.graph.node}
    for n in (2, 9):
        feeds = {"x": np.random.default_rng(n).standard_normal((1, n, 4)).astype(np.float32)}
        want = _ort(model, feeds)[0]
        assert want.shape == (1, n - 1, 4)
        assert_parity(want, _tvm(done, feeds)[0], name=f"N={n}")


def test_an_if_on_a_rank_is_inlined():
    then_graph = oh.make_graph([oh.make_node("Mul", ["x", "two_f"], ["t"])], "then", [],
                               [oh.make_tensor_value_info("t", TP.FLOAT, None)])
    else_graph = oh.make_graph([oh.make_node("Identity", ["x"], ["e"])], "else", [],
                               [oh.make_tensor_value_info("e", TP.FLOAT, None)])
    nodes = [
        oh.make_node("Shape", ["x"], ["shape"]),
        oh.make_node("Size", ["shape"], ["rank"]),
        oh.make_node("Greater", ["rank", "two"], ["cond"]),
        oh.make_node("If", ["cond"], ["y"], then_branch=then_graph, else_branch=else_graph),
    ]
    model = _model(nodes, [oh.make_tensor_value_info("x", TP.FLOAT, [1, "N", 4])],
                   [oh.make_tensor_value_info("y", TP.FLOAT, None)],
                   [_c("two", 2), nh.from_array(np.array(2.0, np.float32), "two_f")])
    done = legalize(model)
    assert "If" not in {n.op_type for n in done.graph.node}
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 5, 4)).astype(np.float32)}
    assert_parity(_ort(model, feeds)[0], _ort(done, feeds)[0], name="inlined")
    assert_parity(feeds["x"] * 2, _tvm(done, feeds)[0], name="tvm")  # rank 3 > 2: the then branch


def test_dim_expressions_become_identifiers():
    model = _model([oh.make_node("Identity", ["x"], ["y"])],
                   [oh.make_tensor_value_info("x", TP.FLOAT, [1, 3, "8*h", "8*w"])],
                   [oh.make_tensor_value_info("y", TP.FLOAT, [1, 3, "8*h", "8*w"])])
    assert name_dim_expressions(model) == {"8*h": "h_x8", "8*w": "w_x8"}
    assert [d.dim_param for d in model.graph.output[0].type.tensor_type.shape.dim[2:]] == ["h_x8", "w_x8"]
    assert name_dim_expressions(model) == {}  # identifiers already
