"""--pe-tables int8: per-row int8 tables, the memory they save and the error they add."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import assert_parity
from portable_pe.spec.graphs import GRAPHS, load_graph
from portable_pe.quant.tables import dequantize_rows, measure, quantize_onnx_tables, quantize_rows


def test_per_row_error_is_at_most_half_a_step():
    table = np.random.default_rng(0).standard_normal((37, 24)).astype(np.float32) * np.arange(1, 38)[:, None]
    q, scale = quantize_rows(table)
    assert q.dtype == np.int8 and scale.shape == (37,)
    step = np.abs(table).max(axis=1) / 127  # each row's own step: rows of very different ranges
    assert np.all(np.abs(dequantize_rows(q, scale) - table) <= step[:, None] / 2 + 1e-6)


@pytest.mark.parametrize("graph", GRAPHS)
def test_measure_reports_memory_and_error_per_table(graph):
    rows = measure(load_graph(graph), 128)
    assert rows, f"{graph}: no position table measured"
    for r in rows:
        n_rows, n_cols = r["shape"]
        assert r["bytes_fp32"] == 4 * n_rows * n_cols and r["bytes_int8"] == n_rows * n_cols + 4 * n_rows
        assert r["saved"] == pytest.approx(1 - (n_cols + 4) / (4 * n_cols))
        assert 0 < r["max_rel_err"] <= 0.5 / 127 + 1e-6, r  # half a step of the largest row: exact bound


@pytest.mark.parametrize("graph,stored", [("learned", 1), ("t5_bias", 1), ("rope", 0)])
def test_onnx_tables_quantized_only_where_stored(graph, stored):
    import onnxsim
    from portable_pe.compile.export import export_onnx
    from portable_pe.compile.simplify import ort_session
    spec = load_graph(graph)
    model, _ = onnxsim.simplify(export_onnx(spec), check_n=0)
    out, report = quantize_onnx_tables(model)
    assert len(report) == stored
    x = np.random.default_rng(0).standard_normal((1, 20, spec.model.d_model)).astype(np.float32)
    feeds = {"x": x, "positions": np.arange(20, dtype=np.int64)}
    a, b = ort_session(model).run(None, feeds)[0], ort_session(out).run(None, feeds)[0]
    if stored:  # int8 tables change the output a little (the int8_tables row), not a lot
        (row,) = assert_parity(a, b, tolerance="int8_tables", name=f"{graph} with int8 tables (onnxruntime)", length=20)
        assert row.max_abs > 0
    else:
        np.testing.assert_array_equal(a, b)


def test_llvm_bundle_with_int8_tables(tmp_path):
    """--pe-tables int8 end to end on llvm: the stored table becomes int8 rows plus scales,
    the bundle records the int8-table tolerance, and parity vs the fp32 reference holds."""
    import onnx
    from onnx import numpy_helper
    from conftest import DATA
    from portable_pe.compile.pipeline import compile_graph
    from portable_pe.run.parity import TOLERANCES, check_bundle
    bundle = compile_graph(str(DATA / "tiny_learned.toml"), out=tmp_path / "b", pe_tables="int8", log=lambda m: None)
    assert bundle.manifest["tolerance"]["float32"] == TOLERANCES["int8_tables"]
    (table,) = bundle.manifest["pe_tables"]["tables"]
    model = onnx.load(str(bundle.file("model.onnx")))
    int8 = [i for i in model.graph.initializer if numpy_helper.to_array(i).dtype.name == "int8"]
    assert any(numpy_helper.to_array(i).shape == (64, 64) for i in int8), [i.name for i in int8]
    report = check_bundle(bundle, lengths=(5, 64))
    assert report.ok, report.to_markdown()  # not much error: the int8_tables row, 1% of max|ref|
    assert 0 < report.worst("tvm")  # but int8 rows do add some
