"""Bad inputs through the CLI, by category (paths, files, specs, numbers, manifests,
signals, concurrency): each is refused with one line that names the problem, the exit
status says what kind of failure it was, and every file that existed before is
byte-identical after. (scripts/bad_input_probe.py runs a wider set in subprocesses.)"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import DATA, TINY_SPEC
from portable_pe import interrupts
from portable_pe.cli.main import main

ROOT = Path(__file__).resolve().parent.parent


def tree(root: Path) -> dict[str, str]:
    """relative path -> sha256 (or 'dir') of everything under root."""
    out = {}
    for path in sorted(root.rglob("*")):
        out[str(path.relative_to(root))] = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return out


@pytest.fixture
def ws(tmp_path, tiny_bundle, monkeypatch):
    """A user's folder: notes.txt, mydir/, a good bundle, good inputs; the cwd is ws/work."""
    (tmp_path / "work").mkdir()
    (tmp_path / "home").mkdir()
    (tmp_path / "notes.txt").write_text("my notes\n")
    (tmp_path / "work" / "notes.txt").write_text("notes here\n")
    (tmp_path / "mydir" / "sub").mkdir(parents=True)
    (tmp_path / "mydir" / "sub" / "b.txt").write_text("b\n")
    shutil.copytree(tiny_bundle.path, tmp_path / "bundle")
    np.savez(tmp_path / "in.npz", x=np.zeros((1, 5, 64), np.float32), positions=np.arange(5))
    monkeypatch.chdir(tmp_path / "work")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(interrupts, "install", lambda: None)  # keep pytest's own signal handlers
    return tmp_path


def cli(capsys, *argv) -> tuple[int, str, str]:
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as exit_:  # argparse's usage errors
        rc = exit_.code
    out, err = capsys.readouterr()
    return rc, out, err


def refused(ws: Path, capsys, argv, words, *, rc: int = 2) -> str:
    """Run argv; assert exit `rc`, an error naming every word, nothing changed; stdout + stderr."""
    before = tree(ws)
    code, out, err = cli(capsys, *argv)
    assert code == rc, err
    assert "Traceback" not in err
    for word in words:
        assert word.format(ws=ws) in err, err
    assert tree(ws) == before, "a file that existed before changed, vanished or was added"
    return out + err


# ----------------------------------------------------------------------------- paths
COMPILE = ["compile", TINY_SPEC, "--lengths", "7"]


@pytest.mark.parametrize("argv,words", [
    (COMPILE + ["--out", "."], ["--out .", "working directory"]),
    (COMPILE + ["--out", ""], ["--out is empty"]),
    (COMPILE + ["--out", "", "--force"], ["--out is empty"]),
    (COMPILE + ["--out", "..", "--force"], ["contains the working directory"]),
    (COMPILE + ["--out", "{ws}"], ["contains the working directory"]),
    (COMPILE + ["--out", "{ws}/home"], ["your home folder"]),
    (COMPILE + ["--out", "notes.txt"], ["notes.txt is a file, not a bundle folder", "--force"]),
    (COMPILE + ["--out", "../mydir"], ["mydir is a folder that is not a portable-pe bundle", "--force"]),
    (COMPILE + ["--out", "{ws}/bundle/inner"], ["is inside the bundle"]),
    (COMPILE + ["--out", "notes.txt/x"], ["notes.txt is a file, not a folder"]),
    (COMPILE + ["--out", "/sys/pe-bundle"], ["cannot write in /sys"]),
    (COMPILE + ["--out", "new", "--json", "notes.txt"], ["--json notes.txt exists and is not a .json file"]),
    (["run", "{ws}/bundle", "--inputs", "{ws}/in.npz", "--out", "{ws}/bundle/reference.npz"], ["is inside the bundle"]),
    (["run", "{ws}/bundle", "--inputs", "{ws}/in.npz", "--out", "notes.txt"], ["--out notes.txt exists and is not a .npz"]),
    (["run", "{ws}/bundle", "--inputs", "{ws}/in.npz", "--out", "{ws}/in.npz"], ["is also an input"]),
    (["parity", "{ws}/bundle", "--json", "../mydir"], ["--json ../mydir is a folder"]),
    # a device is never read to see whether it holds JSON: /dev/zero never ends
    (["parity", "{ws}/bundle", "--json", "/dev/zero"], ["--json /dev/zero is not a regular file"]),
    (["bench", TINY_SPEC, "--out", "notes.txt/x"], ["notes.txt is a file, not a folder"]),
])
def test_output_paths_that_would_lose_data_are_refused(ws, capsys, argv, words):
    refused(ws, capsys, [a.format(ws=ws) if isinstance(a, str) else a for a in argv], words)


def test_keep_intermediates_keeps_the_old_dumps_when_the_spec_fails(ws, capsys):
    (ws / "b.intermediates").mkdir()
    (ws / "b.intermediates" / "01-exported.onnx").write_bytes(b"last run's dump")
    (ws / "bad.toml").write_text('name = "b"\n[model]\nd_model = 64\nn_heads = 0\n[encoding]\nname = "rope"\n')
    refused(ws, capsys, ["compile", "../bad.toml", "--out", "../b", "--keep-intermediates"],
            ["bad.toml: model.n_heads = 0: expected an integer in 1..1024"])
    (ws / "b.intermediates" / "01-exported.onnx").unlink()
    (ws / "b.intermediates" / "notes.txt").write_text("mine")
    refused(ws, capsys, ["compile", TINY_SPEC, "--out", "../b", "--keep-intermediates"],
            ["b.intermediates, which is not a folder of stage dumps"])


def test_run_writes_exactly_the_path_it_prints(ws, capsys):
    code, out, err = cli(capsys, "run", ws / "bundle", "--inputs", ws / "in.npz", "--out", "result.txt")
    assert code == 0, err
    assert "wrote result.txt" in out and not Path("result.txt.npz").exists()
    with np.load("result.txt") as result:
        assert result["hidden"].shape == (1, 5, 64)


# ----------------------------------------------------------------------------- files
def test_an_empty_onnx_is_refused_alike_by_inspect_and_compile(ws, capsys):
    (ws / "empty.onnx").write_bytes(b"")
    messages = {cmd: refused(ws, capsys, [cmd, "../empty.onnx"], ["empty.onnx is not a valid ONNX model"])
                for cmd in ("inspect", "compile")}
    assert messages["inspect"].split("error: ")[-1] == messages["compile"].split("error: ")[-1]


@pytest.mark.parametrize("argv,words", [
    (["compile", "../dir.onnx"], ["ONNX file ../dir.onnx is a folder; expected a file"]),
    (["inspect", "../dir.onnx"], ["ONNX file ../dir.onnx is a folder; expected a file"]),
    (["compile", "../mydir"], ["../mydir is a folder; expected a shipped graph name"]),
    (["compile", "../dir.toml"], ["graph spec ../dir.toml is a folder; expected a file"]),
    (["inspect", "notes.txt"], ["notes.txt is a file; expected a bundle folder"]),
    (["run", "{ws}/bundle", "--inputs", "../empty.npz", "--out", "o.npz"], ["--inputs ../empty.npz is not an .npz file (empty)"]),
    (["run", "{ws}/bundle", "--inputs", "notes.txt", "--out", "o.npz"], ["--inputs notes.txt is not an .npz file"]),
    (["run", "{ws}/bundle", "--inputs", "../x.npy", "--out", "o.npz"], ["--inputs ../x.npy is not an .npz file"]),
    (["run", "{ws}/bundle", "--inputs", "../mydir", "--out", "o.npz"], ["../mydir is a folder"]),
])
def test_files_that_are_not_what_was_asked_for(ws, capsys, argv, words):
    (ws / "dir.onnx").mkdir()
    (ws / "dir.toml").mkdir()
    (ws / "empty.npz").write_bytes(b"")
    np.save(ws / "x.npy", np.zeros(3))
    refused(ws, capsys, [a.format(ws=ws) if isinstance(a, str) else a for a in argv], words)



def _onnx(path: Path, *, inputs=(("x", "FLOAT"),), outputs=(("y", "FLOAT"),), op="Relu", **attrs) -> None:
    """A one-node graph: `op` from the first input (a Constant when there is none) to the outputs."""
    import onnx
    from onnx import TensorProto, helper
    nodes = [] if inputs else [helper.make_node("Constant", [], ["x"], value=helper.make_tensor(
        "v", TensorProto.FLOAT, [1, 4], [1.0, 2.0, 3.0, 4.0]))]
    nodes.append(helper.make_node(op, [inputs[0][0] if inputs else "x"], [outputs[0][0]], name="n", **attrs))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, getattr(TensorProto, t), [1, 4]) for n, t in inputs],
                              [helper.make_tensor_value_info(n, getattr(TensorProto, t), [1, 4]) for n, t in outputs])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


@pytest.mark.parametrize("cmd", ["inspect", "compile"])
@pytest.mark.parametrize("graph,words", [
    ({"inputs": ()}, ["noinputs.onnx has no inputs; portable-pe compiles only graphs with at least one input"]),
    ({"inputs": (("s", "STRING"),), "outputs": (("t", "STRING"),), "op": "Identity"},
     ["noinputs.onnx: input 's' is a string tensor", "numeric tensors"]),
    ({"outputs": (("s", "STRING"),), "op": "Cast", "to": 8}, ["noinputs.onnx: output 's' is a string tensor"]),  # to: TensorProto.STRING
    ({"inputs": (("c", "COMPLEX64"),), "outputs": (("d", "COMPLEX64"),), "op": "Identity"},
     ["input 'c' is a complex64 tensor"]),
])
def test_an_onnx_without_inputs_or_with_non_numeric_ones_is_refused_at_load(ws, capsys, cmd, graph, words):
    """inspect said "every node has a converter" (exit 0) for both; compile ran every stage
    and blamed the manifest (no inputs) or failed in simplify ("unsupported operand
    type(s) for -: 'str' and 'str')."""
    _onnx(ws / "noinputs.onnx", **graph)
    output = refused(ws, capsys, [cmd, "../noinputs.onnx"], words)
    assert "[export]" not in output and "converter" not in output  # refused when the file is loaded


def test_shape_may_pin_only_the_dims_the_graph_leaves_symbolic(ws, capsys):
    """--shape x=1x2 on x: [N, 8] overrode the 8, and the compile reported PASS."""
    import onnx
    from onnx import TensorProto, helper
    from portable_pe.compile.frontend import fix_input_shapes
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), ws / "n8.onnx")
    output = refused(ws, capsys, ["compile", "../n8.onnx", "--shape", "x=1x2", "--out", "n8"],
                     ["--shape x=1x2: axis 1 of input 'x' is fixed to 8 by the graph; --shape pins symbolic dims only",
                      "--shape x=1x8"])
    assert "[build]" not in output
    model = onnx.load(str(ws / "n8.onnx"))
    fix_input_shapes(model, {"x": [3, 8]})  # the graph's own 8 is fine
    assert [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim] == [3, 8]

# ----------------------------------------------------------------------------- specs
MODEL = "[model]\nd_model = 64\nn_heads = 4\nn_layers = 2\nd_ff = 128\n"


@pytest.mark.parametrize("text,words", [
    ('name = "b"\n[model]\nd_model = 64\nn_heads = 0\n[encoding]\nname = "rope"\n', ["model.n_heads = 0: expected an integer in 1..1024"]),
    ('name = "b"\n[model]\nd_model = 64\nn_heads = [4]\n[encoding]\nname = "rope"\n', ["model.n_heads = [4]: expected an integer"]),
    ('name = "b"\nencoding = ["rope"]\n' + MODEL, ["encoding = ['rope']: expected an encoding name or an [encoding] table"]),
    ('name = "b"\n' + MODEL + '[encoding]\nname = "hybrid"\nlayers = 3\n', ["encoding.layers = 3: expected a list of encoding names"]),
    ('name = "b"\n' + MODEL + '[encoding]\nname = "rope"\nrotary_dim = 64\n', ["encoding.rotary_dim = 64: expected an even integer in 2..16"]),
    ('name = "b"\n' + MODEL + '[encoding]\nname = "rope"\n[export]\nmax_length = -5\n', ["export.max_length = -5: expected an integer in 1..1048576"]),
    ('name = "../b"\n' + MODEL + '[encoding]\nname = "rope"\n', ["name = '../b': expected a name of ASCII letters"]),
    ('name = "zé"\n' + MODEL + '[encoding]\nname = "rope"\n', ["name = 'zé': expected a name of ASCII letters, digits"]),
    ('name = "b"\n' + MODEL.replace("n_heads = 4", "n_heads = 4\nnorm_eps = nan") + '[encoding]\nname = "rope"\n',
     ["model.norm_eps = nan: expected a number > 0"]),
])
def test_spec_errors_name_file_field_value_and_what_is_allowed(ws, capsys, text, words):
    (ws / "bad.toml").write_text(text)
    refused(ws, capsys, ["compile", "../bad.toml", "--out", "b"], ["../bad.toml: ", *words])


def test_the_spec_schema_knows_every_encoding_option():
    """spec_schema's option table and defaults are the encodings' constructor parameters and
    the dataclasses' defaults, and the notes
    `list` prints cover the registry (both kept apart from torch for a fast CLI)."""
    from portable_pe.spec.encoding_notes import ENCODING_NOTES
    from portable_pe.spec.encodings import _DIMENSION_ARGS, ENCODINGS
    from dataclasses import fields
    from portable_pe.spec.graphs import GraphSpec
    from portable_pe.spec.model import EncoderConfig
    from portable_pe.spec.schema import DEFAULTS, ENCODING_OPTIONS
    assert list(ENCODING_NOTES) == list(ENCODINGS) == list(ENCODING_OPTIONS)
    for name, cls in ENCODINGS.items():
        params = [n for n, p in inspect.signature(cls.__init__).parameters.items()
                  if n not in ("self", *_DIMENSION_ARGS) and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        expected = [] if name == "hybrid" else params  # hybrid: layers + per-layer tables, checked apart
        assert list(ENCODING_OPTIONS[name]) == expected, name
        assert DEFAULTS["encoding"][name] == {k: p.default for k, p in inspect.signature(cls.__init__).parameters.items()
                                              if p.default is not inspect.Parameter.empty}, name
    assert DEFAULTS["model"] == {f.name: f.default for f in fields(EncoderConfig)}
    assert DEFAULTS["export"] == {f.name: f.default for f in fields(GraphSpec) if f.name in DEFAULTS["export"]}


# ----------------------------------------------------------------------------- numbers
@pytest.mark.parametrize("argv,words", [
    (["parity", "{ws}/bundle", "--batch", "0"], ["argument --batch: expected an integer in 1..1048576, got 0"]),
    (["parity", "{ws}/bundle", "--batch", "1000"], ["--batch 1000: this bundle accepts batch sizes 1..64"]),
    (["parity", "{ws}/bundle", "--lengths", "5000"], ["--lengths 5000: this bundle accepts lengths in 1..1024"]),
    (["parity", "{ws}/bundle", "--sizes", "32x32"], ["--sizes: this bundle has no image dims to size: a sequence graph"]),
    (COMPILE + ["--target", "npu", "--seq-len", "0"], ["argument --seq-len: expected an integer in 1..1048576, got 0"]),
    (["bench", TINY_SPEC, "--threads", "0"], ["argument --threads: expected an integer in 1..1024, got 0"]),
    (["bench", TINY_SPEC, "--batch", "1000", "--out", "bench"], ["--batch 1000: graph 'tiny_rope' accepts batch sizes 1..64"]),
    (["deploy", "{ws}/bundle", "--rpc", "127.0.0.1:9", "--timeout", "nan"], ["argument --timeout: expected seconds"]),
    (["deploy", "{ws}/bundle", "--rpc", "::1:9090"], ["--rpc '::1:9090': an IPv6 address must be bracketed: write [HOST]:PORT"]),
    (["deploy", "{ws}/bundle", "--rpc", "[foo]:9090"], ["--rpc '[foo]:9090': [foo] is not an IPv6 address"]),
])
def test_numbers_out_of_range_name_the_option(ws, capsys, argv, words):
    refused(ws, capsys, [a.format(ws=ws) if isinstance(a, str) else a for a in argv], words)




TINY_VIT = DATA / "vision" / "tiny_vit_rope_2d.toml"  # 8-pixel patches, max size 256x256
NPU_VIT = ["compile", TINY_VIT, "--target", "npu", "--vendor-build", "skip", "--out", "n"]
NPU_SWIN = ["compile", DATA / "vision" / "tiny_swin_rel_bias_2d.toml", "--target", "npu", "--vendor-build", "skip",
            "--out", "n"]


@pytest.mark.parametrize("argv,words", [
    (NPU_VIT + ["--image-size", "30x32"], ["--image-size 30x32: the height 30 is not a multiple of the patch size 8, "
                                           "as graph 'tiny_vit_rope_2d' needs; expected HxW, e.g. 24"]),
    (NPU_SWIN + ["--image-size", "32x32"], ["--image-size 32x32: the height 32 is not a multiple of 24 (whole windows: "
                                            "3 patches of 8 pixels), as graph 'tiny_swin_rel_bias_2d' needs"]),
    (NPU_VIT + ["--image-size", "32x512"], ["--image-size 32x512: the width 512 exceeds graph 'tiny_vit_rope_2d''s "
                                            "max size 256x256 (export.max_size); expected at most 256"]),
    (NPU_VIT + ["--image-size", "8x32x32"], ["--image-size 8x32x32: graph 'tiny_vit_rope_2d' takes HxW (height, width); expected 2 sizes"]),
    (NPU_VIT + ["--image-size", "32"], ["argument --image-size: expected an image size in pixels like 224x224"]),
    (NPU_VIT + ["--image-size", "0x32"], ["argument --image-size: expected an image size in pixels like 224x224"]),
    (NPU_VIT + ["--seq-len", "64"], ["--seq-len: graph 'tiny_vit_rope_2d' is a vision graph", "--image-size 24x32"]),
    (["compile", TINY_VIT, "--image-size", "32x32", "--out", "n"], ["takes no option image_size (--image-size)"]),
    (["compile", TINY_SPEC, "--target", "npu", "--image-size", "32x32", "--out", "n"],
     ["--image-size is the static size of portable-pe's own vision graphs", "give --seq-len N"]),
])
def test_a_vision_graphs_npu_image_size_is_whole_patches_within_its_max(ws, capsys, argv, words):
    refused(ws, capsys, argv, words)


def test_a_bracketed_ipv6_address_is_a_host_not_a_name(ws, capsys):
    """deploy --rpc [::1]:1 looked up the host name '[::1]' ("Name or service not known")."""
    from portable_pe.run.deploy import parse_address
    assert parse_address("[::1]:9090", what="--rpc") == ("::1", 9090)
    assert parse_address("[fe80::1%eth0]:9090", what="--rpc") == ("fe80::1%eth0", 9090)
    assert parse_address("board.local:9090", what="--rpc") == ("board.local", 9090)
    output = refused(ws, capsys, ["deploy", ws / "bundle", "--rpc", "[::1]:1", "--timeout", "5"], ["[::1]:1"])
    assert "Name or service not known" not in output

def test_compile_lengths_beyond_the_graphs_bounds_are_refused_not_an_empty_fail(ws, capsys):
    """They compiled, printed an empty parity table marked FAIL and exited 1, nothing on stderr."""
    output = refused(ws, capsys, ["compile", TINY_SPEC, "--lengths", "7,1000000", "--out", "b"],
                     ["--lengths 1000000: graph 'tiny_rope' accepts lengths 1..1024"])
    assert "[load]" not in output  # before any work
    # an .onnx file's bounds are known only once it is compiled: exit 2 then, the bundle kept and said so
    import onnx
    from onnx import TensorProto, helper
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 8])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), ws / "dyn.onnx")
    code, out, err = cli(capsys, "compile", "../dyn.onnx", "--lengths", "1000000", "--out", "dyn")
    assert code == 2, err
    assert "--lengths 1000000: this bundle accepts lengths in 1..4096" in err and "Traceback" not in err
    assert f"the bundle was written to {Path('dyn').resolve()} but not checked" in err
    assert len(err.strip().splitlines()) == 1 and "| tvm |" not in out
    assert (Path("dyn") / "manifest.json").is_file()

# ----------------------------------------------------------------------------- manifests
def _edit(fn):
    def apply(manifest_path: Path):
        manifest = json.loads(manifest_path.read_text())
        result = fn(manifest)
        manifest_path.write_text(json.dumps(manifest if result is None else result))
    return apply


def _tamper(manifest_path: Path):
    so = manifest_path.parent / "model.so"
    data = bytearray(so.read_bytes())
    data[100] ^= 0xFF
    so.write_bytes(bytes(data))


@pytest.mark.parametrize("change,command,words", [
    (_edit(lambda m: [m]), "inspect", ["the manifest must be a JSON object, got a list"]),
    (_edit(lambda m: m.pop("inputs") and None), "parity", ["required key `inputs` is missing"]),
    (_edit(lambda m: m.pop("files") and None), "inspect", ["it has no checksum list (`files`)"]),
    (_edit(lambda m: m["files"].pop("model.so") and None), "inspect", ["the checksum list `files` lacks model.so"]),
    (_edit(lambda m: m["inputs"][0].update(dims=3)), "inspect", ["`inputs[0].dims` must be a list, got an integer 3"]),
    (lambda p: (_edit(lambda m: m.pop("files") and None)(p), _tamper(p)), "run", ["no checksum list"]),
    (lambda p: (p.parent / "extra.txt").write_text("x"), "inspect", ["extra.txt, which manifest.json's checksum list does not cover"]),
])
def test_a_manifest_off_the_schema_is_refused_before_anything_runs(ws, capsys, change, command, words):
    change(ws / "bundle" / "manifest.json")
    argv = {"inspect": ["inspect", ws / "bundle"], "parity": ["parity", ws / "bundle", "--lengths", "3"],
            "run": ["run", ws / "bundle", "--inputs", ws / "in.npz", "--out", "o.npz"]}[command]
    refused(ws, capsys, argv, ["manifest.json", *words])



def _truncate_so(bundle: Path, keep: int) -> None:
    """model.so cut to `keep` bytes (negative: that many off its end), its checksum updated to match."""
    so = bundle / "model.so"
    data = so.read_bytes()
    so.write_bytes(data[:keep])
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["files"]["model.so"] = hashlib.sha256(so.read_bytes()).hexdigest()
    (bundle / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("keep,why", [
    (100_000, "ends at byte"),         # segments past the end: TVM's load_module died by SIGBUS (exit 135)
    (-100, "section header table"),    # only the section headers cut
    (40, "ELF header is cut short"),
])
@pytest.mark.parametrize("command", ["run", "parity", "deploy"])
def test_a_truncated_model_so_with_a_matching_checksum_is_refused_before_loading(ws, capsys, keep, why, command):
    _truncate_so(ws / "bundle", keep)
    argv = {"run": ["run", ws / "bundle", "--inputs", ws / "in.npz", "--out", "o.npz"],
            "parity": ["parity", ws / "bundle", "--lengths", "3"],
            "deploy": ["deploy", ws / "bundle", "--rpc", "127.0.0.1:9", "--timeout", "5"]}[command]
    refused(ws, capsys, argv, ["model.so is truncated or not a shared library", why])


def test_a_model_so_that_is_no_elf_file_is_refused(ws, capsys):
    from portable_pe.bundle.shared_library import check_shared_library
    check_shared_library(ws / "bundle" / "model.so")  # the good one passes
    with pytest.raises(ValueError, match="notes.txt is truncated or not a shared library: no ELF header"):
        check_shared_library(ws / "notes.txt")

# ----------------------------------------------------------------------------- parity verdicts
def test_compile_for_a_board_says_unverified_not_pass(ws, capsys, monkeypatch, bundle_factory):
    """An arm bundle built here: onnxruntime runs, the compiled model.so does not."""
    arm = bundle_factory(TINY_SPEC, "arm")
    import portable_pe.compile.pipeline as compile_module
    monkeypatch.setattr(compile_module, "compile_graph", lambda *a, **k: arm)
    code, out, err = cli(capsys, *COMPILE, "--target", "arm", "--out", "a", "--json", "r.json")
    assert code == 0, err
    assert "**UNVERIFIED** (the compiled model did not run here" in out and "**PASS**" not in out
    assert "| onnxruntime |" in out and "| tvm |" not in out
    assert json.loads(Path("r.json").read_text())["verdict"] == "UNVERIFIED"


# ----------------------------------------------------------------------------- signals, concurrency
#: a child that writes a bundle over DEST with a hook that stops it half way (the files are
#: copied, their checksums not yet taken) until the parent acts: it signals the child, or
#: starts a second writer of the same bundle
SLOW_WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from portable_pe import interrupts
    from portable_pe.bundle import artifact
    from portable_pe.bundle.artifact import load_bundle
    from portable_pe.cli.errors import run_command
    dest, ready = Path(sys.argv[1]), Path(sys.argv[2])
    real = artifact.sha256_file
    def slow(path):
        ready.write_text("writing")
        time.sleep(float(sys.argv[3]))
        return real(path)
    interrupts.install()
    old = load_bundle(dest)
    files = {name: old.file(name).read_bytes() for name in old.manifest["files"]}
    manifest = {k: v for k, v in old.manifest.items() if k not in ("files", "format_version")}
    artifact.sha256_file = slow
    sys.exit(run_command("compile", lambda args: artifact.write_bundle(dest, files, manifest) and 0, None))
""")


def _slow_writer(ws: Path, hold_s: float) -> subprocess.Popen:
    ready = ws / "ready"
    child = subprocess.Popen([sys.executable, "-c", SLOW_WRITER, str(ws / "bundle"), str(ready), str(hold_s)],
                             env={**os.environ, "PYTHONPATH": str(ROOT)}, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not ready.exists():
        assert child.poll() is None and time.monotonic() < deadline, child.stderr.read() if child.poll() is not None else "timeout"
        time.sleep(0.05)
    ready.unlink()
    return child


def test_a_second_writer_of_a_bundle_fails_at_once_and_sigterm_cleans_up(ws, capsys):
    bundle_before = tree(ws / "bundle")
    writer = _slow_writer(ws, hold_s=60)
    try:
        output = refused(ws, capsys, [*COMPILE, "--out", ws / "bundle"],
                         ["is being written by another portable-pe process", f"(pid {writer.pid})"])
        assert "[load]" not in output  # refused before any compile work
        writer.send_signal(signal.SIGTERM)
        _, child_err = writer.communicate(timeout=60)
    finally:
        writer.kill()
    assert writer.returncode == 143, child_err
    assert "interrupted (SIGTERM)" in child_err and "Traceback" not in child_err
    assert tree(ws / "bundle") == bundle_before, "the bundle being replaced must stay as it was"
    assert not [p.name for p in ws.iterdir() if ".partial-" in p.name or ".old-" in p.name]


def test_a_killed_writers_leftovers_are_recovered_by_the_next_write(tmp_path, tiny_bundle):
    from portable_pe.bundle.artifact import load_bundle, write_bundle
    shutil.copytree(tiny_bundle.path, tmp_path / ".b.old-999999")  # killed between its two renames
    (tmp_path / ".b.partial-999999").mkdir()
    files = {name: tiny_bundle.file(name) for name in tiny_bundle.manifest["files"]}
    manifest = {k: v for k, v in tiny_bundle.manifest.items() if k not in ("files", "format_version")}
    write_bundle(tmp_path / "b", files, manifest)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]
    assert load_bundle(tmp_path / "b").name == tiny_bundle.name



def _full_write_bytes(self, data):
    """Path.write_bytes on a disk that fills half way: ENOSPC from write(), naming no file (as the OS does)."""
    import errno
    with open(self, "wb") as f:
        f.write(data[: len(data) // 2])
    raise OSError(errno.ENOSPC, "No space left on device")


def _full_copyfile(src, dst, **_):
    """shutil.copyfile on a full disk: its sendfile error names the source first, the destination second."""
    import errno
    Path(dst).write_bytes(Path(src).read_bytes()[:100])
    raise OSError(errno.ENOSPC, "No space left on device", str(src), None, str(dst))


@pytest.mark.parametrize("content", ["bytes", "copy"])
def test_a_full_disk_names_the_bundle_file_and_leaves_the_old_bundle(ws, content, monkeypatch):
    from portable_pe.bundle.artifact import load_bundle, write_bundle
    from portable_pe.cli.errors import describe
    old = load_bundle(ws / "bundle")
    files = {name: old.file(name).read_bytes() if content == "bytes" else ws / "mydir" / "sub" / "b.txt"
             for name in old.manifest["files"]}
    manifest = {k: v for k, v in old.manifest.items() if k not in ("files", "format_version")}
    before = tree(ws)
    if content == "bytes":
        monkeypatch.setattr(Path, "write_bytes", _full_write_bytes)
    else:
        monkeypatch.setattr(shutil, "copyfile", _full_copyfile)
    with pytest.raises(OSError) as failed:
        write_bundle(ws / "bundle", files, manifest)
    code, message = describe(failed.value)
    assert code == 2 and message == f"No space left on device: {ws / 'bundle' / next(iter(files))}", message
    assert tree(ws) == before, "a partial bundle was left, or the old one changed"


def test_a_full_disk_names_the_output_file_and_leaves_no_partial_file(ws, capsys, monkeypatch):
    import errno
    real = os.fdopen

    class Full:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, data):
            self.f.write(data[:10])
            self.f.flush()
            raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "fdopen", lambda fd, *a, **k: Full(real(fd, *a, **k)))
    refused(ws, capsys, ["run", ws / "bundle", "--inputs", ws / "in.npz", "--out", "o.npz"],
            [f"run: error: No space left on device: {ws / 'work' / 'o.npz'}"])


def test_a_full_disk_names_the_stage_dump_and_keeps_the_last_dumps(ws, monkeypatch):
    from portable_pe.compile.intermediates import Intermediates
    (ws / "b.intermediates").mkdir()
    (ws / "b.intermediates" / "01-exported.onnx").write_bytes(b"last run's dump")
    before = tree(ws)
    inter = Intermediates(ws / "b")
    monkeypatch.setattr(Path, "write_bytes", _full_write_bytes)
    with pytest.raises(OSError, match="No space left on device") as failed:
        inter.dump("01-exported.onnx", b"x" * 1000)
    assert failed.value.filename == str(ws / "b.intermediates" / "01-exported.onnx")
    assert inter.publish() is None  # nothing was dumped: the last dumps stay
    assert tree(ws) == before

def test_ctrl_c_during_the_tvm_build_is_an_interrupt_not_a_failed_stage(tmp_path):
    """TVM turns the KeyboardInterrupt raised inside its C++ build into a bare RuntimeError;
    the compile must still exit 130, say so, and leave nothing behind."""
    proc = subprocess.Popen([sys.executable, "-m", "portable_pe", "compile", str(TINY_SPEC), "--out", "b"], cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if line.startswith("[build]"):
            time.sleep(0.5)
            proc.send_signal(signal.SIGINT)
            break
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    assert "portable-pe compile: interrupted (SIGINT)" in err and "stage failed" not in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_after_the_command_finished_does_not_fail_it(tmp_path, tiny_bundle):
    """Once `run` has written its output, the interpreter's teardown (TVM, torch) still
    takes a moment; a Ctrl-C then used to end the process with 130 and no message."""
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "in.npz", x=rng.standard_normal((1, 7, 64)).astype(np.float32), positions=np.arange(7))
    proc = subprocess.Popen([sys.executable, "-m", "portable_pe", "run", str(tiny_bundle.path), "--inputs",
                             str(tmp_path / "in.npz"), "--out", str(tmp_path / "o.npz")], cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if line.startswith("wrote "):
            proc.send_signal(signal.SIGINT)
            break
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and err == "", (proc.returncode, err)
    with np.load(tmp_path / "o.npz") as out:
        assert out["hidden"].shape == (1, 7, 64)


# ----------------------------------------------------------------------------- the CLI itself
def test_list_and_help_import_no_torch_and_help_is_whole():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for args in (["list"], ["--help"], ["compile", "--help"]):
        proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "portable_pe", *args], capture_output=True,
                              text=True, env=env, timeout=120)
        assert proc.returncode == 0, proc.stderr
        imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
        assert not {"torch", "tvm", "onnx", "numpy"} & imported, args
    help_text = subprocess.run([sys.executable, "-m", "portable_pe", "--help"], capture_output=True, text=True,
                               env=env, timeout=120).stdout
    description = help_text.split("\n\n")[1]
    assert description.rstrip().endswith("checked against PyTorch."), description


def test_a_bug_is_one_line_and_debug_shows_the_traceback(capsys, monkeypatch):
    import portable_pe.cli.main as cli_module
    monkeypatch.setattr(interrupts, "install", lambda: None)

    def broken(args):
        return {}["oops"]
    monkeypatch.setitem(cli_module.COMMANDS, "list", broken)
    code, _, err = cli(capsys, "list")
    assert code == 3 and "portable-pe list: internal error: KeyError: 'oops'" in err and "--debug" in err
    assert "Traceback" not in err
    with pytest.raises(KeyError):
        main(["list", "--debug"])


def test_a_bundles_vendor_subfolder_is_replaceable_but_a_users_file_in_it_is_not(tmp_path):
    import json as _json
    from portable_pe.bundle.paths import is_bundle_folder
    bundle = tmp_path / "b"
    (bundle / "rknn").mkdir(parents=True)
    (bundle / "rknn" / "model.rknn").write_bytes(b"x")
    (bundle / "manifest.json").write_text(_json.dumps({"format_version": 1, "files": {"rknn/model.rknn": "0"}}))
    assert is_bundle_folder(bundle)
    (bundle / "rknn" / "notes.txt").write_text("mine")
    assert not is_bundle_folder(bundle)


def test_a_signal_that_lands_inside_an_import_exits_as_the_signal(monkeypatch, capsys):
    """SIGTERM during a C extension's import surfaces as 'ImportError: initialization failed';
    the CLI reports the signal (143), not an internal error (3)."""
    import signal as _signal
    from portable_pe import interrupts
    from portable_pe.cli.errors import run_command
    monkeypatch.setattr(interrupts, "_received", [_signal.SIGTERM])

    def importing(_args):
        raise ImportError("initialization failed")
    assert run_command("parity", importing, None) == 143
    assert "interrupted (SIGTERM)" in capsys.readouterr().err


@pytest.mark.parametrize("argv,words", [
    (["guide", "--npu-sizes", "112x112"], ["--npu-sizes is for the vision section: add --vision"]),
    (["guide", "--vision", "--targets", "npu-rknn", "--out", "g"],
     ["--targets npu-rknn: expected a comma-separated subset of llvm, npu-ethos-u"]),
])
def test_guide_vision_options_name_what_they_need(ws, capsys, argv, words):
    refused(ws, capsys, argv, words)
