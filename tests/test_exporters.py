"""Both torch -> ONNX exporters give the encoder PyTorch computes, at lengths and batch
sizes the export never saw; the default falls back to dynamo when it cannot export."""

from __future__ import annotations

import logging

import pytest
import torch

from portable_pe.compile import export
from portable_pe.spec.graphs import load_graph
from portable_pe.compile.simplify import ort_session

from conftest import TINY_SPEC, assert_parity


@pytest.fixture(scope="module")
def spec():
    return load_graph(TINY_SPEC)


def _torch_and_onnx(spec, model, batch, length, seed):
    x, positions = export.example_inputs(spec, batch=batch, length=length, seed=seed)
    positions = positions + 11  # not the 0..T-1 the export traced with
    with torch.no_grad():
        expected = spec.build()(x, positions).numpy()
    got = ort_session(model).run(None, {"x": x.numpy(), "positions": positions.numpy()})[0]
    return expected, got


@pytest.mark.parametrize("exporter", export.EXPORTERS)
def test_export_matches_torch_at_unseen_shapes(spec, exporter):
    model = export.export_onnx(spec, exporter=exporter)
    assert spec.example_length not in (5, 37)
    for batch, length, seed in ((1, 5, 1), (3, 37, 2)):
        expected, got = _torch_and_onnx(spec, model, batch, length, seed)
        assert expected.shape == (batch, length, spec.model.d_model)
        assert_parity(expected, got, tolerance="float32_abs_1e-5", name=f"{exporter} B={batch}", length=length)
    dims = {vi.name: [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim] for vi in model.graph.input}
    assert dims == {"x": ["batch", "seq", spec.model.d_model], "positions": ["seq"]}
    # tensors are initializers, as the table folding for the NPU and int8 tables expect
    assert not [n.name for n in model.graph.node if n.op_type == "Constant"]


def test_a_failing_torchscript_export_falls_back_to_dynamo(spec, monkeypatch, caplog):
    def broken(*_args):
        raise RuntimeError("the TorchScript exporter was removed")
    monkeypatch.setattr(export, "_export_torchscript", broken)
    with caplog.at_level(logging.WARNING, logger="portable_pe.compile.export"):
        model = export.export_onnx(spec)
    assert "using the dynamo exporter" in caplog.text and "was removed" in caplog.text
    expected, got = _torch_and_onnx(spec, model, 2, 9, 3)
    assert_parity(expected, got, tolerance="float32_abs_1e-5", name="dynamo (fallback) B=2", length=9)


def test_an_unknown_exporter_is_refused(spec):
    with pytest.raises(ValueError, match="unknown exporter 'jit'.*torchscript, dynamo"):
        export.export_onnx(spec, exporter="jit")


def test_the_cli_offers_the_exporters_with_the_default_first():
    from portable_pe.cli.parser import EXPORTER_CHOICES
    assert set(EXPORTER_CHOICES) == set(export.EXPORTERS) and EXPORTER_CHOICES[0] == export.DEFAULT_EXPORTER
