"""Bundles are written atomically and refused when tampered, truncated or mismatched."""

from __future__ import annotations

import json
import shutil

import pytest

from portable_pe.bundle.artifact import FORMAT_VERSION, BundleError, load_bundle, write_bundle


@pytest.fixture
def bundle_copy(tiny_bundle, tmp_path):
    dest = tmp_path / "copy"
    shutil.copytree(tiny_bundle.path, dest)
    return dest


def test_fresh_bundle_verifies(tiny_bundle):
    bundle = load_bundle(tiny_bundle.path)
    assert set(bundle.manifest["files"]) == {"model.so", "model.onnx", "reference.npz", "run_on_board.py"}
    assert bundle.manifest["format_version"] == FORMAT_VERSION
    assert bundle.manifest["versions"]["tvm"].startswith("0.27")
    assert bundle.manifest["target"]["tvm"]["kind"] == "llvm"


@pytest.mark.parametrize("victim", ["model.so", "model.onnx", "reference.npz"])
def test_tampered_file_is_refused_by_name(bundle_copy, victim):
    with open(bundle_copy / victim, "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(BundleError, match=f"{victim} does not match its checksum"):
        load_bundle(bundle_copy)


def test_truncated_file_is_refused(bundle_copy):
    so = bundle_copy / "model.so"
    so.write_bytes(so.read_bytes()[:1000])
    with pytest.raises(BundleError, match="model.so does not match"):
        load_bundle(bundle_copy)


def test_missing_file_and_manifest(bundle_copy, tmp_path):
    (bundle_copy / "reference.npz").unlink()
    with pytest.raises(BundleError, match="reference.npz is missing"):
        load_bundle(bundle_copy)
    (bundle_copy / "manifest.json").unlink()
    with pytest.raises(BundleError, match="has no manifest.json"):
        load_bundle(bundle_copy)
    with pytest.raises(BundleError, match="is not a bundle folder"):
        load_bundle(tmp_path / "nowhere")


def test_other_format_version_is_refused(bundle_copy):
    manifest = json.loads((bundle_copy / "manifest.json").read_text())
    manifest["format_version"] = FORMAT_VERSION + 1
    (bundle_copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match=f"format_version is {FORMAT_VERSION + 1}; expected {FORMAT_VERSION}"):
        load_bundle(bundle_copy)


class Boom(Exception):
    pass



def test_failed_write_keeps_the_previous_bundle(tiny_bundle, tmp_path, monkeypatch):
    files = {name: tiny_bundle.file(name) for name in tiny_bundle.manifest["files"]}
    manifest = {k: v for k, v in tiny_bundle.manifest.items() if k not in ("files", "format_version")}
    dest = tmp_path / "b"
    write_bundle(dest, files, manifest)
    import portable_pe.bundle.artifact as artifact
    real = artifact.sha256_file

    def failing(path):
        raise Boom("disk full")
    monkeypatch.setattr(artifact, "sha256_file", failing)
    with pytest.raises(Boom):
        write_bundle(dest, {**files, "model.onnx": b"bad"}, manifest)
    monkeypatch.setattr(artifact, "sha256_file", real)
    assert (dest / "model.onnx").read_bytes() == tiny_bundle.file("model.onnx").read_bytes()
    assert load_bundle(dest).manifest["graph"]["name"] == tiny_bundle.name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"], "no partial folder left behind"


def test_failed_compile_leaves_no_bundle(tmp_path):
    from portable_pe.compile.pipeline import compile_graph
    spec = tmp_path / "broken.toml"
    spec.write_text('name = "broken"\n[model]\nd_model = 64\nn_heads = 4\nn_layers = 1\nd_ff = 64\n'
                    '[encoding]\nname = "rope"\nrotary_dim = 65\n')
    with pytest.raises(ValueError, match="rotary_dim"):
        compile_graph(str(spec), out=tmp_path / "out", log=lambda m: None)
    assert not (tmp_path / "out").exists()
