"""The CLI as a user runs it: in a subprocess, checking exit codes and what it prints."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from conftest import TINY_SPEC, assert_parity


def cli(*args, cwd=None, check_rc=None):
    proc = subprocess.run([sys.executable, "-m", "portable_pe", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, timeout=600, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if check_rc is not None:
        assert proc.returncode == check_rc, f"rc {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "tiny"
    proc = cli("compile", TINY_SPEC, "--target", "llvm", "--out", out, "--keep-intermediates",
               "--lengths", "1,7,130", check_rc=0)
    return out, proc


def test_compile_prints_stages_and_a_passing_report(compiled):
    out, proc = compiled
    for stage in ("[load]", "[export]", "[simplify]", "[import]", "[build]", "[bundle]"):
        assert stage in proc.stdout
    assert "| tvm | 130 | hidden | 1x130x64 |" in proc.stdout and "**PASS**" in proc.stdout
    inter = out.parent / "tiny.intermediates"
    assert {p.name for p in inter.iterdir()} >= {"01-exported.onnx", "02-simplified.onnx", "04-relax.py"}


def test_parity_inspect_run(compiled, tmp_path):
    out, _ = compiled
    proc = cli("parity", out, "--lengths", "3,333", "--json", tmp_path / "r.json", check_rc=0)
    assert "| tvm | 333 |" in proc.stdout and '"ok": true' in (tmp_path / "r.json").read_text()
    proc = cli("inspect", out, check_rc=0)
    assert "input  x: float32[batch, seq, 64]" in proc.stdout and "[verified]" in proc.stdout
    x = np.random.default_rng(0).standard_normal((2, 11, 64)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x, positions=np.arange(11))
    cli("run", out, "--inputs", tmp_path / "in.npz", "--out", tmp_path / "out.npz", check_rc=0)
    with np.load(tmp_path / "out.npz") as result:
        hidden = result["hidden"]
    import torch
    from portable_pe.spec.graphs import load_graph
    with torch.no_grad():
        expected = load_graph(TINY_SPEC).build()(torch.from_numpy(x), torch.arange(11)).numpy()
    assert_parity({"hidden": expected}, {"hidden": hidden}, tolerance="float32_abs", name="portable-pe run", length=11)


def test_run_with_wrong_inputs_names_them(compiled, tmp_path):
    out, _ = compiled
    np.savez(tmp_path / "bad.npz", x=np.zeros((1, 4, 64), np.float32), pos=np.arange(4))
    proc = cli("run", out, "--inputs", tmp_path / "bad.npz", "--out", tmp_path / "o.npz", check_rc=2)
    assert "missing ['positions'], unexpected ['pos']" in proc.stderr
    assert not (tmp_path / "o.npz").exists()


def test_tampered_bundle_is_refused(compiled, tmp_path):
    import shutil
    out, _ = compiled
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    (copy / "model.onnx").write_bytes((copy / "model.onnx").read_bytes()[:-10])
    proc = cli("parity", copy, check_rc=2)
    assert "model.onnx does not match its checksum" in proc.stderr


def test_list_and_help():
    proc = cli("list", check_rc=0)
    assert "rope (default)" in proc.stdout and "t5_bias" in proc.stdout and "llvm" in proc.stdout
    proc = cli("compile", "--help", check_rc=0)
    assert "{" + ",".join(sorted(__import__("portable_pe.backends.targets").backends.targets.TARGETS)) + "}" in proc.stdout


def test_a_reader_that_goes_away_ends_the_command_quietly():
    """`portable-pe list | head -1`: the reader closes the pipe before the command writes;
    the command exits 141 (as if killed by SIGPIPE) and prints no error."""
    proc = subprocess.Popen([sys.executable, "-m", "portable_pe", "list"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # long before the interpreter has started and written anything
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 141 and err == "", (proc.returncode, err)


def write_graph(path: Path, op: str, **attrs) -> Path:
    node = helper.make_node(op, ["x"], ["y"], name=f"my_{op.lower()}", **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.mark.parametrize("args,message", [
    (("compile", "nosuchgraph"), "unknown graph 'nosuchgraph'; shipped graphs: alibi, hybrid"),
    (("compile", "missing.onnx"), "ONNX file missing.onnx does not exist"),
    (("compile", "missing.toml"), "graph spec missing.toml does not exist"),
    (("compile", "rope", "--target", "tpu"), "invalid choice: 'tpu' (choose from"),
    (("parity", "nowhere"), "nowhere is not a bundle folder"),
    (("compile", "rope", "--lengths", "1,x"), "expected comma-separated integers"),
])
def test_bad_names_are_clear_errors(args, message, tmp_path):
    proc = cli(*args, cwd=tmp_path, check_rc=2)
    assert message in proc.stderr
    assert not (tmp_path / "dist").exists()


@pytest.mark.parametrize("text,message", [
    ("name = 'x'\n[model\n", "not valid TOML"),
    ("name = 'x'\n[encoding]\nname = 'rope'\n", "missing required key `model`"),
    ("name = 'x'\n[model]\nd_model = 64\nn_heads = 5\n[encoding]\nname = 'rope'\n", "model.d_model = 64 must be divisible by model.n_heads = 5"),
    ("name = 'x'\n[model]\nd_model = 64\nwidth = 3\n[encoding]\nname = 'rope'\n", "unknown key `model.width`; valid keys: d_model, n_heads"),
    ("name = 'x'\n[model]\nd_model = 64\n[encoding]\nname = 'fourier'\n", "encoding.name = 'fourier': expected one of sinusoidal"),
])
def test_malformed_specs_name_the_file_and_key(text, message, tmp_path):
    spec = tmp_path / "bad.toml"
    spec.write_text(text)
    proc = cli("compile", spec, cwd=tmp_path, check_rc=2)
    assert message in proc.stderr and "bad.toml" in proc.stderr
    assert not (tmp_path / "dist").exists()


def test_unparsable_onnx_and_unsupported_op(tmp_path):
    (tmp_path / "garbage.onnx").write_bytes(b"\x00not a protobuf" * 10)
    proc = cli("compile", "garbage.onnx", cwd=tmp_path, check_rc=2)
    assert "garbage.onnx is not a valid ONNX model" in proc.stderr
    write_graph(tmp_path / "celu.onnx", "Celu")
    proc = cli("compile", "celu.onnx", cwd=tmp_path, check_rc=2)
    assert "Celu (node my_celu, ai.onnx opset 17: no converter" in proc.stderr
    assert not (tmp_path / "dist").exists()


def test_planned_target_says_so(tmp_path, monkeypatch):
    """A registered target that is not built yet refuses with its reason, before any work."""
    from portable_pe.backends import targets
    from portable_pe.compile.pipeline import compile_graph
    spec = tmp_path / "tpu.toml"
    spec.write_text('name = "tpu"\nbackend = "llvm"\ndevice = "cpu"\nplanned = "arrives with issue #99"\n[tvm]\nkind = "llvm"\n')
    monkeypatch.setitem(targets.TARGETS, "tpu", spec)
    with pytest.raises(targets.TargetUnavailable, match="target 'tpu' is not available yet: arrives with issue #99"):
        compile_graph(str(TINY_SPEC), target="tpu", out=tmp_path / "b", log=lambda m: None)
    assert not (tmp_path / "b").exists()


def test_foreign_static_onnx_with_shape_override(tmp_path):
    """A plain nn.TransformerEncoder exported elsewhere (TorchScript exporter, static shape)."""
    import torch
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True, norm_first=True)
    model = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    path = tmp_path / "encoder.onnx"
    torch.onnx.export(model, (torch.randn(1, 24, 64),), str(path), dynamo=False, opset_version=17,
                      input_names=["input"], output_names=["output"])
    proc = cli("compile", path, "--out", tmp_path / "b", check_rc=0)
    assert "(reference: onnxruntime)" in proc.stdout and "| tvm | 24 | output | 1x24x64 |" in proc.stdout
    proc = cli("compile", path, "--shape", "input=1x24x32", "--out", tmp_path / "c", check_rc=2)
    assert "input" in proc.stderr
