"""Compound dims through legalize: T + 1, T - 1, 2T, past + T, ceil(T / k) * k.

Each graph is built by hand from the patterns transformers' exports hold (the mask's
``T + 1`` prepend-and-diff, GQA's repeat of K/V heads, a cache's ``past + T`` positions,
a causal mask with its offset, padding to a multiple), with every shape computed inside
the graph from ``Shape``. After legalize + import the Relax signature must say each
output dim as an expression of the input dims (no fresh variable), and TVM must agree
with onnxruntime at three lengths.
"""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
import sympy
from onnx import TensorProto as TP
from onnx import helper as oh
from onnx import numpy_helper as nh

ort = pytest.importorskip("onnxruntime")
tvm = pytest.importorskip("tvm")
from tvm import relax  # noqa: E402

from conftest import assert_parity  # noqa: E402
from portable_pe.legalize import legalize  # noqa: E402
from portable_pe.onnx_ops import import_onnx  # noqa: E402

LENGTHS = (1, 6, 23)
PAST = (0, 3, 9)
HD = 4


def _c(name, value, dtype=np.int64):
    return nh.from_array(np.array(value, dtype), name)


def _shape_of(src, axis, out):
    """Gather(Shape(src), axis): the dim as a scalar, the way exporters write it."""
    return [oh.make_node("Shape", [src], [out + "_s"]),
            oh.make_node("Gather", [out + "_s", f"ax{axis}"], [out], axis=0)]


AXES = [_c(f"ax{i}", i) for i in range(4)]


def _model(nodes, inputs, outputs, inits=()):
    """outputs: {name: rank}; their dims are left for inference to find."""
    g = oh.make_graph(nodes, "g", inputs, [oh.make_tensor_value_info(o, TP.FLOAT, [None] * r) for o, r in outputs.items()],
                      initializer=list(inits) + AXES)
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", 18)], ir_version=10)


def t_plus_one():
    """Llama's mask code: prepend a column (T + 1), then slice 1:T+1 with the end computed
    as Reshape(T + 1, [1])."""
    x = oh.make_tensor_value_info("x", TP.FLOAT, [1, "T"])
    nodes = _shape_of("x", 1, "t") + [
        oh.make_node("Slice", ["x", "zero1", "one1", "one1"], ["first"]),
        oh.make_node("Sub", ["first", "onef"], ["prev"]),
        oh.make_node("Concat", ["prev", "x"], ["cat"], axis=1),                  # [1, T + 1]
        oh.make_node("Add", ["one", "t"], ["t1"]),
        oh.make_node("Reshape", ["t1", "one1"], ["t1v"]),                         # the failing node
        oh.make_node("Slice", ["cat", "one1", "t1v", "one1"], ["nxt"]),           # [1, T]
        oh.make_node("Slice", ["cat", "zero1", "t1v", "one1"], ["all"]),          # [1, T + 1]
        oh.make_node("Sub", ["nxt", "x"], ["diff"]),
        oh.make_node("Unsqueeze", ["t1", "zero1"], ["t1u"]),
        oh.make_node("Concat", ["t1u", "one1"], ["shp"], axis=0),
        oh.make_node("Reshape", ["all", "shp"], ["col"]),                         # [T + 1, 1]
    ]
    inits = [_c("one", 1), _c("one1", [1]), _c("zero1", [0]), _c("onef", 1.0, np.float32)]
    return _model(nodes, [x], {"diff": 2, "col": 2}, inits), {"diff": ("1", "T"), "col": ("T + 1", "1")}


def t_minus_one_and_twice():
    """x[:, 1:] reshaped to (T - 1, 1); x tiled twice and reshaped to (2, T) from 2T; the
    last token gathered at index T - 1."""
    x = oh.make_tensor_value_info("x", TP.FLOAT, [1, "T"])
    nodes = _shape_of("x", 1, "t") + [
        oh.make_node("Sub", ["t", "one"], ["tm1"]),
        oh.make_node("Mul", ["t", "two"], ["t2"]),
        oh.make_node("Slice", ["x", "one1", "big1", "one1"], ["tail"]),
        oh.make_node("Unsqueeze", ["tm1", "zero1"], ["tm1u"]),
        oh.make_node("Concat", ["tm1u", "one1"], ["tail_shape"], axis=0),
        oh.make_node("Reshape", ["tail", "tail_shape"], ["tail2"]),              # [T - 1, 1]
        oh.make_node("Tile", ["x", "reps"], ["tiled"]),                           # [1, 2T]
        oh.make_node("Unsqueeze", ["t2", "zero1"], ["t2u"]),
        oh.make_node("Concat", ["t2u"], ["flat"], axis=0),
        oh.make_node("Reshape", ["tiled", "flat"], ["tiled1"]),                   # [2T]
        oh.make_node("Gather", ["x", "tm1"], ["last"], axis=1),                   # [1]
        oh.make_node("Add", ["tiled1", "last"], ["twice"]),
    ]
    inits = [_c("one", 1), _c("two", 2), _c("one1", [1]), _c("zero1", [0]), _c("big1", [2**62]),
             _c("reps", [1, 2])]
    return _model(nodes, [x], {"tail2": 2, "twice": 1}, inits), {"tail2": ("T - 1", "1"), "twice": ("T*2",)}


def ceil_to_multiple():
    """Pad the sequence to ceil(T / 4) * 4 with pads computed as (4 - T % 4) % 4, then
    fold it into (ceil(T / 4), 4)."""
    x = oh.make_tensor_value_info("x", TP.FLOAT, [1, "T"])
    nodes = _shape_of("x", 1, "t") + [
        oh.make_node("Mod", ["t", "four"], ["r"]),
        oh.make_node("Sub", ["four", "r"], ["r2"]),
        oh.make_node("Mod", ["r2", "four"], ["pad"]),
        oh.make_node("Unsqueeze", ["pad", "zero1"], ["padu"]),
        oh.make_node("Concat", ["zeros3", "padu"], ["pads"], axis=0),
        oh.make_node("Pad", ["x", "pads"], ["padded"]),                             # [1, ceil(T/4)*4]
        oh.make_node("Add", ["t", "three"], ["t3"]),
        oh.make_node("Div", ["t3", "four"], ["blocks"]),
        oh.make_node("Unsqueeze", ["blocks", "zero1"], ["bu"]),
        oh.make_node("Concat", ["bu", "four1"], ["bshape"], axis=0),
        oh.make_node("Reshape", ["padded", "bshape"], ["folded"]),                   # [ceil(T/4), 4]
    ]
    inits = [_c("four", 4), _c("three", 3), _c("zero1", [0]), _c("four1", [4]), _c("zeros3", [0, 0, 0])]
    return _model(nodes, [x], {"folded": 2}, inits), {"folded": ("(T + 3) // 4", "4")}


def cache_positions_and_gqa():
    """A decoder step with a cache: positions past .. past + T - 1 (cache_position),
    keys past + T long (Concat), a causal mask over them offset by past (Range, Trilu,
    Where with float32's min), K/V heads repeated for GQA (Unsqueeze, Expand, Reshape)."""
    q = oh.make_tensor_value_info("q", TP.FLOAT, [1, 4, "T", HD])
    k = oh.make_tensor_value_info("k", TP.FLOAT, [1, 2, "T", HD])
    pk = oh.make_tensor_value_info("past_k", TP.FLOAT, [1, 2, "P", HD])
    nodes = _shape_of("q", 2, "t") + _shape_of("past_k", 2, "p") + [
        oh.make_node("Add", ["p", "t"], ["total"]),
        oh.make_node("Range", ["p", "total", "one"], ["cache_position"]),                  # [T]
        oh.make_node("Concat", ["past_k", "k"], ["keys"], axis=2),                          # [1, 2, P+T, 4]
        oh.make_node("Unsqueeze", ["keys", "two1"], ["k5"]),
        oh.make_node("Unsqueeze", ["total", "zero1"], ["total1"]),
        oh.make_node("Concat", ["kv_head_shape", "total1", "hd1"], ["rep_shape"], axis=0),
        oh.make_node("Expand", ["k5", "rep_shape"], ["k_rep"]),                             # [1, 2, 2, P+T, 4]
        oh.make_node("Concat", ["heads4", "total1", "hd1"], ["merged"], axis=0),
        oh.make_node("Reshape", ["k_rep", "merged"], ["k4"]),                               # [1, 4, P+T, 4]
        oh.make_node("Transpose", ["k4"], ["kt"], perm=[0, 1, 3, 2]),
        oh.make_node("MatMul", ["q", "kt"], ["scores"]),                                    # [1, 4, T, P+T]
        oh.make_node("Range", ["zero", "total", "one"], ["kv_index"]),                      # [P+T]
        oh.make_node("Unsqueeze", ["cache_position", "one1"], ["qpos"]),                    # [T, 1]
        oh.make_node("Greater", ["kv_index", "qpos"], ["future"]),                          # [T, P+T]
        oh.make_node("Where", ["future", "fmin", "fzero"], ["mask"]),
        oh.make_node("Unsqueeze", ["t", "zero1"], ["t1"]),
        oh.make_node("Concat", ["t1", "total1"], ["sq"], axis=0),
        oh.make_node("ConstantOfShape", ["sq"], ["ones"], value=nh.from_array(np.array([1.0], np.float32))),
        oh.make_node("Trilu", ["ones", "p"], ["lower"], upper=0),                           # triu offset past
        oh.make_node("Add", ["scores", "mask"], ["masked"]),
        oh.make_node("Softmax", ["masked"], ["probs"], axis=-1),
        oh.make_node("Mul", ["probs", "lower"], ["probs_checked"]),
        oh.make_node("Cast", ["cache_position"], ["posf"], to=TP.FLOAT),
        oh.make_node("Unsqueeze", ["posf", "one1"], ["posf1"]),
        oh.make_node("Add", ["probs_checked", "posf1"], ["out"]),
    ]
    inits = [_c("one", 1), _c("zero", 0), _c("one1", [1]), _c("two1", [2]), _c("zero1", [0]),
             _c("kv_head_shape", [1, 2, 2]), _c("heads4", [1, 4]), _c("hd1", [HD]),
             _c("fmin", np.finfo(np.float32).min, np.float32), _c("fzero", 0.0, np.float32)]
    return _model(nodes, [q, k, pk], {"out": 4}, inits), {"out": ("1", "4", "T", "P + T")}


CASES = {f.__name__: f for f in (t_plus_one, t_minus_one_and_twice, ceil_to_multiple, cache_positions_and_gqa)}


def _feeds(model, t, p):
    rng = np.random.default_rng(t * 10 + p)
    dims = {"T": t, "P": p}
    return {vi.name: rng.standard_normal([d.dim_value or dims[d.dim_param]
                                          for d in vi.type.tensor_type.shape.dim]).astype(np.float32)
            for vi in model.graph.input}


def _same(tvm_dim: str, expected: str) -> bool:
    """A TVM dim as printed ('T + T.int64(1)', 'T_1 // 4') equals a sympy expression."""
    text = re.sub(r"T\.int64\((-?\d+)\)", r"(\1)", tvm_dim)
    text = re.sub(r"T\.(Div|floordiv|truncdiv)\(", "Div(", text)  # non-negative here: all agree
    text = re.sub(r"\b([TP])_\d+\b", r"\1", text)  # TVM may suffix the dim params' names
    names = {n: sympy.Symbol(n, integer=True, positive=True) for n in ("T", "P")}
    names["Div"] = lambda a, b: sympy.floor(a / b)
    return sympy.simplify(sympy.sympify(text, locals=names) - sympy.sympify(expected, locals=names)) == 0


def _ret_dims(mod) -> list[str]:
    """The Relax main's output dims, after checking they use only the inputs' dims."""
    main = mod["main"]
    params = {v for p in main.params for v in relax.analysis.tir_vars_in_type(p.ty)}
    ret = main.ret_struct_info if hasattr(main, "ret_struct_info") else main.ty.ret
    ret_types = list(ret.fields) if hasattr(ret, "fields") else [ret]
    out = []
    for ty in ret_types:
        fresh = [v for v in relax.analysis.tir_vars_in_type(ty) if v not in params]
        assert not fresh, f"output dims use variables no input has: {fresh} in {ty}"
        out.append(tuple(str(d) for d in ty.shape.values))
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_compound_dims_are_followed(case):
    model, expected = CASES[case]()
    onnx.checker.check_model(model)
    leg = legalize(model)
    mod = import_onnx(leg)
    dims = _ret_dims(mod)
    names = {vi.name: vi for vi in model.graph.input}
    for out, got in zip(model.graph.output, dims):
        assert len(got) == len(expected[out.name]) and all(
            _same(g, e) for g, e in zip(got, expected[out.name])), (out.name, got, expected[out.name])
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for t, p in zip(LENGTHS, PAST if "P" in str(list(names)) or "past_k" in names else (0, 0, 0)):
        feeds = _feeds(model, t, p)
        want = sess.run(None, feeds)
        got = vm["main"](*[tvm.runtime.tensor(feeds[n]) for n in names])
        got = [got] if hasattr(got, "numpy") else list(got)
        outputs = [o.name for o in model.graph.output]
        # 1e-5 absolute: the old elementwise 1e-5 + 1e-5 |w| at its tightest (measured: 2e-6)
        assert_parity(dict(zip(outputs, want)), {n: g.numpy() for n, g in zip(outputs, got)},
                      tolerance="float32_abs_1e-5", name=f"tvm {case} P={p}", length=t)
        for w, legal in zip(want, ort.InferenceSession(leg.SerializeToString()).run(None, feeds)):
            # legalize rewrites shape arithmetic only: the values stay those of the same
            # onnxruntime kernels, up to 1e-6 (near-exactness, not a parity tolerance)
            np.testing.assert_allclose(legal, w, atol=1e-6, rtol=0)


def test_inspect_names_the_first_node_it_cannot_follow(tmp_path, capsys):
    """A length that depends on the data (NonZero) cannot be an expression of the input
    dims: inspect names that node and what it saw, before any compile."""
    from portable_pe.cli.main import main as cli
    x = oh.make_tensor_value_info("x", TP.FLOAT, [1, "T"])
    nodes = _shape_of("x", 1, "t") + [
        oh.make_node("Add", ["t", "one"], ["t1"]),
        oh.make_node("Unsqueeze", ["t1", "zero1"], ["t1u"]),
        oh.make_node("ConstantOfShape", ["t1u"], ["ramp"], value=nh.from_array(np.array([1.0], np.float32))),
        oh.make_node("Greater", ["x", "zerof"], ["positive"], name="is_positive"),
        oh.make_node("NonZero", ["positive"], ["where_positive"], name="find_positive"),
        oh.make_node("Shape", ["where_positive"], ["n"], start=1, end=2),
        oh.make_node("ConstantOfShape", ["n"], ["y"], value=nh.from_array(np.array([1.0], np.float32))),
        oh.make_node("ReduceSum", ["ramp"], ["total"], keepdims=0),
        oh.make_node("Add", ["y", "total"], ["out"]),
    ]
    inits = [_c("one", 1), _c("zero1", [0]), _c("zerof", 0.0, np.float32)]
    path = tmp_path / "nonzero.onnx"
    onnx.save(_model(nodes, [x], {"out": 1}, inits), str(path))
    assert cli(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert ("shapes: cannot follow node find_positive (NonZero): output dims of where_positive "
            "are not expressions of the input dims") in out, out
    assert "it saw positive: [1, T]" in out and "it gives where_positive: [2, ?]" in out, out
