"""--target npu: profiles, position folding, rewrites, int8 quantization, node checks.

Fast tests run on tiny (2-layer, d=64) encoders of every encoding; the shipped 4-layer
graphs compile end to end for one (graph, profile) pair by default and for all of them
under -m slow. Expected values come from PyTorch or numpy, never from the code under test.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from portable_pe.spec.encodings import ENCODINGS, alibi_slopes
from portable_pe.spec.graphs import GRAPHS, GraphSpec, load_graph
from portable_pe.npu.fold import RUNTIME_POSITION_OPS, fold_positions
from portable_pe.npu.profiles import PROFILES, check_model, coverage, format_blockers, load_profile
from portable_pe.npu.quantize import quantize_int8
from portable_pe.npu.rewrite import rewrite_for_profile
from portable_pe.compile.simplify import ort_session
from portable_pe.run.parity import TOLERANCES

from conftest import assert_parity

N = 16
TINY_OPTIONS = {"sinusoidal": {}, "learned": {"max_len": 64}, "t5_bias": {"num_buckets": 8, "max_distance": 32},
                "rope": {}, "rope_interleaved": {"rotary_dim": 8, "interleaved": True}, "alibi": {},
                "hybrid": {"layers": ["rope", "t5_bias"], "t5_bias": {"num_buckets": 8, "max_distance": 32}}}


def tiny_spec(name: str) -> GraphSpec:
    encoding = "rope" if name == "rope_interleaved" else name
    return GraphSpec.from_dict({"name": f"tiny_{name}", "seed": 3,
                                "model": {"d_model": 64, "n_heads": 4, "n_layers": 2, "d_ff": 128},
                                "encoding": {"name": encoding, **TINY_OPTIONS[name]}, "export": {"max_length": 64}})


@pytest.fixture(scope="module")
def simplified():
    """(spec, simplified ONNX) per tiny graph, exported once per module."""
    import onnxsim
    from portable_pe.compile.export import export_onnx
    from portable_pe.compile.simplify import _SKIPPED_OPTIMIZERS  # the pipeline's own onnxsim options
    cache = {}

    def get(name):
        if name not in cache:
            spec = tiny_spec(name)
            model, ok = onnxsim.simplify(export_onnx(spec), check_n=0, skipped_optimizers=list(_SKIPPED_OPTIMIZERS))
            assert ok
            cache[name] = (spec, model)
        return cache[name]
    return get


def torch_out(spec, x):
    with torch.no_grad():
        return spec.build()(torch.from_numpy(x), torch.arange(x.shape[1])).numpy()


def test_every_encoding_has_a_tiny_graph():
    # the no-position baseline has no positions input to fold; the grid encodings' vision
    # graphs the npu target does not build yet (test_vision.py checks that it says so)
    sequence = {name for name, cls in ENCODINGS.items() if cls.axes == 1 or name == "hybrid"}
    assert sequence <= set(TINY_OPTIONS), "add the new encoding to TINY_OPTIONS"


@pytest.mark.parametrize("name", PROFILES)
def test_profile_loads_and_cites_a_vendor_list(name):
    profile = load_profile(name)
    assert profile.source.startswith("https://"), "a profile cites the public op list it is written from"
    assert profile.max_rank in (4, 5) and "MatMul" in profile.ops and "QuantizeLinear" in profile.ops
    # position tables are folded to constants before any NPU sees them; Log stays allowed where
    # the vendor's own list has it (Vela's LOG on Ethos-U), T5's bucket Log is folded anyway
    assert not {"Sin", "Cos", "Range"} & set(profile.ops), "run-time position ops must stay off NPUs"


def test_unknown_profile_names_the_valid_ones():
    with pytest.raises(ValueError, match="generic_int8"):
        load_profile("no_such_npu")


@pytest.mark.parametrize("name", TINY_OPTIONS)
def test_fold_makes_positions_constant_and_keeps_values(simplified, name):
    spec, model = simplified(name)
    folded, report = fold_positions(model, seq_len=N)
    assert report["folded_inputs"] == ["positions"]
    assert [i.name for i in folded.graph.input] == ["x"]
    assert [d.dim_value for d in folded.graph.input[0].type.tensor_type.shape.dim] == [1, N, 64]
    left = [n.op_type for n in folded.graph.node if n.op_type in RUNTIME_POSITION_OPS]
    assert left == [], f"run-time position ops survived folding: {left}"
    x = np.random.default_rng(0).standard_normal((1, N, 64)).astype(np.float32)
    assert_parity(torch_out(spec, x), ort_session(folded).run(None, {"x": x})[0], tolerance="float32_abs",
                  name=f"folded {name} (onnxruntime)", length=N)


@pytest.mark.parametrize("name", ["t5_bias", "alibi"])
def test_relative_biases_fold_to_HNN_constants(simplified, name):
    spec, model = simplified(name)
    folded, _ = fold_positions(model, seq_len=N)
    if name == "alibi":  # independent of the encoding code: -slope_h * |i - j|
        dist = np.abs(np.arange(N)[None, :] - np.arange(N)[:, None])
        expected = -np.asarray(alibi_slopes(4))[:, None, None] * dist
    else:
        with torch.no_grad():
            expected = spec.build().pe.bias(torch.arange(N)).numpy()
    tables = [numpy_helper.to_array(i) for i in folded.graph.initializer]
    # finding the one constant that is the table (float32 rounding of it), not a parity check
    hits = [t for t in tables if t.shape[-3:] == (4, N, N) and np.allclose(t.reshape(4, N, N), expected, atol=1e-6)]
    assert hits, f"no (H, N, N) = (4, {N}, {N}) constant equal to the {name} bias"


def _single_op_model(node, inputs, outputs, inits=()):
    graph = helper.make_graph([node], "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def _vi(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


#: a strict NPU (RKNN-Toolkit2 1.4's published list): no LayerNorm, Gelu or Erf, Softmax on
#: axis 1 only, Tanh but no Sigmoid/Abs; the rewrite rules must serve it
STRICT = {"LayerNormalization = {}\n": "", "Softmax = { max_dim = 8192 }": "Softmax = { attr_axis = [1] }",
          "Sigmoid = {}\n": "", "Abs = {}\n": "", 'name = "rknpu2"': 'name = "strict"', 'vendor = "rknn"\n': ""}


def strict_profile(tmp_path, changes=STRICT):
    text = PROFILES["rknpu2"].read_text()
    for old, new in changes.items():
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / "strict.toml"
    path.write_text(text)
    return load_profile(path)


def test_rewrites_for_a_strict_npu_remove_refused_ops_and_keep_values(tmp_path):
    rng = np.random.default_rng(0)
    gamma, beta = rng.standard_normal(8).astype(np.float32), rng.standard_normal(8).astype(np.float32)
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["ln"], epsilon=1e-5, axis=-1),
             helper.make_node("Reshape", ["ln", "shape"], ["r"]),
             helper.make_node("Softmax", ["r"], ["sm"], axis=-1),
             helper.make_node("Gelu", ["sm"], ["y"])]
    graph = helper.make_graph(nodes, "g", [_vi("x", [1, 4, 8])], [_vi("y", [1, 2, 4, 4])], [
        numpy_helper.from_array(gamma, "g"), numpy_helper.from_array(beta, "b"),
        numpy_helper.from_array(np.array([1, 2, 4, 4], np.int64), "shape")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    profile = strict_profile(tmp_path)
    assert {v.op for v in check_model(model, profile) if not v.allowed} == {"LayerNormalization", "Softmax", "Gelu"}
    out, report = rewrite_for_profile(model, profile)
    assert report["rewritten"] == {"LayerNormalization": 1, "Softmax": 1, "Gelu": 1}
    assert all(v.allowed for v in check_model(out, profile)), format_blockers(check_model(out, profile), profile, graph="the rewritten graph")
    x = rng.standard_normal((1, 4, 8)).astype(np.float32)
    ln = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * gamma + beta
    r = ln.reshape(1, 2, 4, 4)
    sm = np.exp(r - r.max(-1, keepdims=True))
    sm /= sm.sum(-1, keepdims=True)
    gelu = 0.5 * sm * (1 + np.vectorize(math.erf)(sm / math.sqrt(2)))
    # tanh-form Gelu differs from the erf form by < 1e-3; everything else is exact. A bound of
    # the approximation the rewrite makes, not a parity tolerance: it stays a literal
    np.testing.assert_allclose(ort_session(out).run(None, {"x": x})[0], gelu, atol=1e-3)


def test_rank5_interleaved_rope_becomes_rank4(simplified):
    spec, model = simplified("rope_interleaved")
    folded, _ = fold_positions(model, seq_len=N)
    profile = load_profile("generic_int8")
    assert any("rank 5" in " ".join(v.why) for v in check_model(folded, profile))
    out, report = rewrite_for_profile(folded, profile)
    assert report["rank_reduced_tensors"] > 0
    assert all(v.allowed for v in check_model(out, profile))
    x = np.random.default_rng(1).standard_normal((1, N, 64)).astype(np.float32)
    assert_parity(torch_out(spec, x), ort_session(out).run(None, {"x": x})[0], tolerance="float32_abs",
                  name="rank-4 rewrite (onnxruntime)", length=N)


def test_check_reports_each_refused_node_and_why(tmp_path):
    nodes = [helper.make_node("Sin", ["x"], ["s"], name="the_sin"),
             helper.make_node("Softmax", ["s"], ["y"], name="the_softmax", axis=2)]
    model = _single_op_model(nodes[0], [_vi("x", [1, 2, 3, 4])], [_vi("y", [1, 2, 3, 4])])
    model.graph.node.append(nodes[1])
    profile = strict_profile(tmp_path)
    verdicts = check_model(model, profile)
    why = {v.node: " ".join(v.why) for v in verdicts if not v.allowed}
    assert set(why) == {"the_sin", "the_softmax"}
    assert "Sin is not in profile strict" in why["the_sin"] and "axis=2" in why["the_softmax"]
    text = format_blockers(verdicts, profile, graph="the test graph")
    assert "the_sin [Sin]" in text and "the_softmax [Softmax]" in text and "node(s) of the test graph" in text


def test_coverage_counts_matmul_macs():
    w = numpy_helper.from_array(np.ones((8, 16), np.float32), "w")
    model = _single_op_model(helper.make_node("MatMul", ["x", "w"], ["y"]), [_vi("x", [1, 4, 8])],
                             [_vi("y", [1, 4, 16])], [w])
    cov = coverage(check_model(model, load_profile("generic_int8")))
    assert cov["macs_total"] == 4 * 16 * 8 and cov["mac_coverage"] == 1.0


def test_quantize_is_qdq_per_channel_int8_and_close(simplified):
    spec, model = simplified("rope")
    folded, _ = fold_positions(model, seq_len=N)
    profile = load_profile("generic_int8")
    q = quantize_int8(folded, profile)
    ops = {n.op_type for n in q.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    inits = {i.name: numpy_helper.to_array(i) for i in q.graph.initializer}
    matmul_weights = {n.input[1] for n in q.graph.node if n.op_type == "MatMul"}
    weight_dq = [n for n in q.graph.node if n.op_type == "DequantizeLinear" and n.output[0] in matmul_weights
                 and n.input[0] in inits]
    # per layer: q|k|v (the exporter concatenates them into one MatMul, then Split), proj, up, down
    assert len(weight_dq) == 4 * spec.model.n_layers
    assert all(inits[n.input[0]].dtype == np.int8 and inits[n.input[1]].size == inits[n.input[0]].shape[1]
               for n in weight_dq), "MatMul weights must be int8 with one scale per output channel"
    assert all(v.allowed for v in check_model(q, profile, quantized=True))
    x = np.random.default_rng(0).standard_normal((1, N, 64)).astype(np.float32)
    assert_parity(torch_out(spec, x), ort_session(q).run(None, {"x": x})[0], tolerance="int8_cosine",
                  name="int8 QDQ (onnxruntime)", length=N)


def test_profile_without_any_gelu_form_fails_with_the_node_list(tmp_path, simplified):
    text = load_profile("rknpu2")
    src = (PROFILES["rknpu2"]).read_text().replace("Tanh = {}\n", "").replace("Sigmoid = {}\n", "")
    src = src.replace('name = "rknpu2"', 'name = "no_tanh"')
    path = tmp_path / "no_tanh.toml"
    path.write_text(src)
    profile = load_profile(path)
    spec, model = simplified("rope")
    folded, _ = fold_positions(model, seq_len=N)
    out, _ = rewrite_for_profile(folded, profile)
    bad = [v for v in check_model(out, profile) if not v.allowed]
    assert [v.op for v in bad] == ["Gelu"] * spec.model.n_layers and text.name == "rknpu2"
    assert "Gelu is not in profile no_tanh" in format_blockers(bad, profile, graph="the test graph")


def _check_npu_bundle(bundle, spec, n):
    manifest, npu = bundle.manifest, bundle.manifest["npu"]
    assert [i["dims"] for i in manifest["inputs"]] == [[1, n, spec.model.d_model]]
    # with a vendor build, "coverage" is the vendor's placement and the profile's is kept beside it
    vendor = manifest.get("vendor") or {}
    if vendor.get("name") == "ethos-u" and vendor.get("built"):
        # Vela judges the int8 TFLite graph, not the host ONNX graph (README, "Which graph the
        # profile judges"): the ONNX check is a prediction there (rope_interleaved's Gathers are
        # refused in ONNX and have no TFLite counterpart); the TFLite pre-check must agree with Vela
        assert vendor["agreement"]["agree"] and not vendor["agreement"]["profile_refused"], vendor["agreement"]
    else:
        assert npu["disallowed_after_rewrite"] == 0
        assert npu.get("profile_coverage", npu["coverage"])["mac_coverage"] == 1.0
    assert npu["coverage"]["nodes_host"] == 0
    model = onnx.load(str(bundle.file("model.onnx")))
    assert "QuantizeLinear" in {n.op_type for n in model.graph.node}
    x = np.random.default_rng(5).standard_normal((1, n, spec.model.d_model)).astype(np.float32)
    ref = torch_out(spec, x)
    from portable_pe.run.local import run_local
    assert manifest["tolerance"]["float32"] == TOLERANCES["int8"]
    assert_parity({"hidden": ref}, {"hidden": ort_session(model).run(None, {"x": x})[0]}, tolerance="int8",
                  name="int8 model.onnx (onnxruntime)", length=n)
    assert_parity({"hidden": ref}, run_local(bundle, {"x": x}), tolerance="int8", name="tvm", length=n)
    # what compile measured and recorded, against the same row
    for engine in ("tvm_int8", "onnxruntime_int8"):
        assert npu["accuracy"][engine]["cosine"] >= TOLERANCES["int8"]["min_cosine"], (engine, npu["accuracy"])


def test_compile_tiny_graph_for_npu(bundle_factory):
    from tests.conftest import TINY_SPEC
    bundle = bundle_factory(TINY_SPEC, "npu", profile="rknpu2", seq_len=32)
    _check_npu_bundle(bundle, load_graph(TINY_SPEC), 32)


#: one shipped graph (51 s) runs with the integration tests (scripts/test.sh), the tiny graph's
#: compile above in the default run; the rest are slow
SHIPPED = [pytest.param(g, p, marks=[pytest.mark.integration] if (g, p) == ("rope", "generic_int8") else [pytest.mark.slow])
           for g in GRAPHS for p in PROFILES]


@pytest.mark.parametrize("graph,profile", SHIPPED)
def test_compile_shipped_graph_for_npu(bundle_factory, graph, profile):
    bundle = bundle_factory(graph, "npu", profile=profile, seq_len=64)
    _check_npu_bundle(bundle, load_graph(graph), 64)


def _erf_gelu(x):
    return 0.5 * x * (1 + np.vectorize(math.erf)(x.astype(np.float64) / math.sqrt(2)))


@pytest.mark.parametrize("op", ["Gelu", "Erf"])
def test_npu_forms_of_gelu_and_erf_are_near_exact(op):
    """rknpu2 runs neither Erf nor Gelu: the rewrites use Abs/Mul/Add/Sigmoid|Tanh, and
    their error over a wide range stays at the fitted bound (1.4e-4 Gelu, 1.7e-4 erf)."""
    x = np.linspace(-40, 40, 200001).astype(np.float32)
    model = _single_op_model(helper.make_node(op, ["x"], ["y"]), [_vi("x", [x.size])], [_vi("y", [x.size])])
    profile = load_profile("rknpu2")
    out, report = rewrite_for_profile(model, profile)
    assert report["rewritten"] == {op: 1} and all(v.allowed for v in check_model(out, profile))
    assert {n.op_type for n in out.graph.node} <= {"Abs", "Mul", "Add", "Sigmoid", "Tanh"}
    got = ort_session(out).run(None, {"x": x})[0].astype(np.float64)
    want = _erf_gelu(x) if op == "Gelu" else np.vectorize(math.erf)(x.astype(np.float64))
    error = np.abs(got - want).max()
    assert error < (1.5e-4 if op == "Gelu" else 1.8e-4), error
    assert error > 1e-5  # an approximation, and the tests say so: not exact


def test_step2_slices_become_step1_and_stay_exact():
    """HF RoFormer's x[..., ::2] / x[..., 1::2] (RKNN runs a lone step-2 Slice on the CPU)."""
    shape = [1, 4, 8, 16]
    inits = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
             (("s0", [0]), ("s1", [1]), ("e", [2**62]), ("ax", [-1]), ("st", [2]))]
    nodes = [helper.make_node("Slice", ["x", "s0", "e", "ax", "st"], ["even"]),
             helper.make_node("Slice", ["x", "s1", "e", "ax", "st"], ["odd"]),
             helper.make_node("Sub", ["even", "odd"], ["y"])]
    graph = helper.make_graph(nodes, "g", [_vi("x", shape)], [_vi("y", [1, 4, 8, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    profile = load_profile("rknpu2")
    assert sum(not v.allowed for v in check_model(model, profile)) == 2
    out, report = rewrite_for_profile(model, profile)
    assert report["rewritten"] == {"Slice": 2} and all(v.allowed for v in check_model(out, profile))
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    np.testing.assert_array_equal(ort_session(out).run(None, {"x": x})[0], x[..., ::2] - x[..., 1::2])


def test_fold_turns_constant_nodes_into_initializers():
    nodes = [helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.float32(2.0), "c")),
             helper.make_node("Mul", ["x", "c"], ["y"])]
    graph = helper.make_graph(nodes, "g", [_vi("x", [1, "T", 4])], [_vi("y", [1, "T", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    folded, _ = fold_positions(model, seq_len=N)
    assert "Constant" not in {n.op_type for n in folded.graph.node}
    x = np.ones((1, N, 4), np.float32)
    np.testing.assert_array_equal(ort_session(folded).run(None, {"x": x})[0], 2 * x)
