"""The on-disk export cache: hits give the same model, any input change misses, and
a damaged or unwritable cache never fails an export."""

from __future__ import annotations

from dataclasses import replace

import pytest

from portable_pe.compile import export
from portable_pe.spec.graphs import load_graph

from conftest import TINY_SPEC


@pytest.fixture(scope="module")
def spec():
    return load_graph(TINY_SPEC)


def test_second_export_comes_from_the_cache_unchanged(spec, tmp_path, monkeypatch):
    monkeypatch.setenv(export.CACHE_ENV, str(tmp_path))
    first, hit_first = export.export_onnx_cached(spec)
    second, hit_second = export.export_onnx_cached(spec)
    assert (hit_first, hit_second) == (False, True)
    assert second.SerializeToString() == first.SerializeToString()
    assert list((tmp_path / "onnx").iterdir()) == [export.cache_entry(spec)]


def test_the_key_covers_the_spec_the_opset_and_the_exporter(spec):
    keys = {export.export_key(spec), export.export_key(replace(spec, seed=spec.seed + 1)),
            export.export_key(replace(spec, max_length=512)), export.export_key(spec, opset=19),
            export.export_key(spec, exporter="dynamo")}
    assert len(keys) == 5


def test_a_damaged_entry_is_exported_again(spec, tmp_path, monkeypatch):
    monkeypatch.setenv(export.CACHE_ENV, str(tmp_path))
    entry = export.cache_entry(spec)
    entry.parent.mkdir(parents=True)
    entry.write_bytes(b"not an onnx model")
    model, hit = export.export_onnx_cached(spec)
    assert not hit and len(model.graph.node) > 0
    assert export.export_onnx_cached(spec)[1]  # replaced by a good entry


def test_an_empty_variable_turns_the_cache_off(spec, tmp_path, monkeypatch):
    monkeypatch.setenv(export.CACHE_ENV, "")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert export.cache_dir() is None
    assert [export.export_onnx_cached(spec)[1] for _ in range(2)] == [False, False]
    assert not any(tmp_path.iterdir())


def test_an_unwritable_cache_still_exports(spec, tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache folder should be")
    monkeypatch.setenv(export.CACHE_ENV, str(blocker))
    model, hit = export.export_onnx_cached(spec)
    assert not hit and len(model.graph.node) > 0
