"""Every shipped graph through the whole pipeline: export, simplify, import, build, parity.

Parametrized from the registries: a new graph or encoding gets these tests by existing.
"""

from __future__ import annotations

import onnx
import pytest

from conftest import assert_parity, tolerance_row
from portable_pe.spec.encodings import ENCODINGS
from portable_pe.compile.export import get_metadata
from portable_pe.spec.graphs import BASELINES, GRAPHS, load_graph
from portable_pe.run.parity import DEFAULT_LENGTHS, check_bundle, dim_roles
from portable_pe.compile.simplify import op_counts

# Position-table ops expected once per graph after simplify: the table is computed once and
# shared by every layer, never per layer.
TABLE_OPS = {
    "sinusoidal": {"Sin": 1, "Cos": 1},
    "learned": {"Gather": 1},
    # the bias per relative distance is a constant; only the clamp and the gather run
    "t5_bias": {"Log": 0, "Clip": 1, "Gather": 1},
    "rope": {"Sin": 1, "Cos": 1},
    "alibi": {"Abs": 1},
    "hybrid": {"Sin": 1, "Cos": 1, "Log": 0, "Clip": 1},
    "none": {},
    # grid encodings (graphs/vision/): their tables once per graph; learned_2d's positions
    # matter only through the grid's shape, so no CumSum of them is left after simplify
    "rope_2d": {"Sin": 1, "Cos": 1, "CumSum": 2},
    "rope_mixed": {"Sin": 1, "Cos": 1, "CumSum": 2},
    "mrope": {"Sin": 1, "Cos": 1, "CumSum": 3},
    "sincos_2d": {"Sin": 2, "Cos": 2, "CumSum": 2},
    "learned_2d": {"Resize": 1, "CumSum": 0},
    "rel_bias_2d": {"Clip": 2, "CumSum": 2},
    # a bias per window's positions, in a plain and a shifted form: two of each
    "window_rel_bias_2d": {"Clip": 4, "CumSum": 2},
}


def test_every_encoding_has_a_shipped_graph_and_structure_expectations():
    from portable_pe.spec.graphs import VISION_GRAPHS
    shipped = {load_graph(name).encoding for name in [*GRAPHS, *BASELINES, *VISION_GRAPHS]}
    assert set(ENCODINGS) <= shipped, f"encodings without a shipped graph: {set(ENCODINGS) - shipped}"
    assert set(ENCODINGS) == set(TABLE_OPS), "every encoding needs a TABLE_OPS entry in this test"


def test_default_graph_is_rope():
    from portable_pe.spec.graphs import DEFAULT_GRAPH
    assert load_graph(DEFAULT_GRAPH).encoding == "rope"


@pytest.fixture(params=sorted(GRAPHS))
def shipped(request, bundle_factory):
    return load_graph(request.param), bundle_factory(request.param)


def test_export_is_dynamic_and_carries_metadata(shipped):
    spec, bundle = shipped
    model = onnx.load(str(bundle.file("model.onnx")))
    dims = {vi.name: [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim] for vi in model.graph.input}
    assert dims == {"x": ["batch", "seq", spec.model.d_model], "positions": ["seq"]}
    meta = get_metadata(model)
    assert meta["graph"] == spec.name and meta["encoding"] == spec.encoding


def test_simplified_structure(shipped):
    spec, bundle = shipped
    model = onnx.load(str(bundle.file("model.onnx")))
    ops = op_counts(model)
    layers = spec.model.n_layers
    assert "Gemm" not in ops  # 3-D linears stay MatMul (see simplify._SKIPPED_OPTIMIZERS)
    assert ops["LayerNormalization"] == 2 * layers + 1
    assert ops["Softmax"] == layers
    assert ops["MatMul"] == 6 * layers  # fused qkv, q@k, p@v, out proj, MLP up, MLP down
    for op, count in TABLE_OPS[spec.encoding].items():
        assert ops.get(op, 0) == count, f"{op}: {ops.get(op, 0)} != {count} ({ops})"
    simplify = bundle.manifest["simplify"]
    assert simplify["nodes_after"] == len(model.graph.node) <= simplify["nodes_before"]
    # the simplified graph computes what the export did, rerun here at a length neither saw
    # (the manifest's own max_abs_diff is the simplify stage's word for it)
    from portable_pe.compile.export import export_onnx
    from portable_pe.compile.simplify import ort_session
    from portable_pe.run.parity import make_inputs
    inputs = make_inputs(bundle.manifest["inputs"], length=11, seed=5, dim_roles=dim_roles(bundle.manifest))
    assert_parity(ort_session(export_onnx(spec)).run(None, inputs)[0], ort_session(model).run(None, inputs)[0],
                  tolerance="float32_abs", name="simplified vs exported (onnxruntime)", length=11)
    assert simplify["max_abs_diff"] <= tolerance_row("float32_abs")["atol"]


def test_parity_at_unseen_lengths(shipped):
    """Reference PyTorch eager vs onnxruntime and TVM, at lengths the export never saw."""
    spec, bundle = shipped
    assert spec.example_length not in DEFAULT_LENGTHS
    report = check_bundle(bundle, lengths=DEFAULT_LENGTHS)
    assert {(r.candidate, r.length) for r in report.rows} == {
        (c, n) for c in ("onnxruntime", "tvm") for n in DEFAULT_LENGTHS}
    assert report.ok, report.to_markdown()


def test_parity_with_batch_and_position_offset(bundle_factory):
    """Batch > 1, and positions starting at 1000 (a window into a long document)."""
    import numpy as np
    import torch
    from portable_pe.run.local import run_local
    spec, bundle = load_graph("rope"), bundle_factory("rope")
    x = np.random.default_rng(3).standard_normal((3, 50, spec.model.d_model)).astype(np.float32)
    positions = np.arange(1000, 1050, dtype=np.int64)
    got = run_local(bundle, {"x": x, "positions": positions})["hidden"]
    with torch.no_grad():
        expected = spec.build()(torch.from_numpy(x), torch.from_numpy(positions)).numpy()
    assert_parity({"hidden": expected}, {"hidden": got}, tolerance="float32_abs", name="tvm B=3 from 1000", length=50)
