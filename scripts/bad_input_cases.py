"""The bad inputs scripts/bad_input_probe.py tries, by category.

Each case runs in a fresh workspace WS (see bad_input_probe.make_workspace):

    WS/work/            the working directory (holds notes.txt)
    WS/notes.txt        a user's file          WS/mydir/{a.txt,sub/b.txt}   a user's folder
    WS/bundle/          a good bundle of tests/data/tiny_rope.toml (llvm)
    WS/in.npz           good inputs for it (x: 1x5x64, positions: 5)
    WS/tiny.toml        the tiny spec          WS/home/   $HOME
"""

from __future__ import annotations

import json
import math
import signal
import zipfile
from pathlib import Path

from bad_input_probe import Case

TINY = "{ws}/tiny.toml"
B = "{ws}/bundle"
CASES: list[Case] = []


def add(category, name, argv, words=(), **kw):
    CASES.append(Case(category, name, list(argv), tuple(words), **kw))


def write(rel: str, content):
    """A setup that writes WS/rel (bytes, text, or a callable of the path)."""
    def setup(ws: Path):
        path = ws / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if callable(content):
            content(path)
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return setup


def steps(*setups):
    def setup(ws):
        for s in setups:
            s(ws)
    return setup


# ----------------------------------------------------------------------------- paths
compile_tiny = ["compile", TINY, "--lengths", "7"]
for out, words in ((".", ("working directory",)), ("", ("empty",)), ("  ", ("empty",)),
                   ("..", ("..",)), ("/", ("/",)), ("{ws}", ("{ws}",)), ("{ws}/home", ("home",)),
                   ("notes.txt", ("notes.txt",)), ("../mydir", ("mydir",)), ("../mydir/sub", ("sub",)),
                   ("{ws}/bundle/inner", ("inside the bundle",)), ("notes.txt/x", ("notes.txt",)),
                   ("/sys/pe-bundle", ("/sys",)), ("/proc/pe-bundle", ("/proc",)), ("/dev/null", ("/dev/null",)),
                   ("{ws}/bundle/model.so", ("inside the bundle",))):
    add("paths", f"compile --out {out!r}", compile_tiny + ["--out", out], words)
for out in (".", "", ".."):
    add("paths", f"compile --out {out!r} --force", compile_tiny + ["--out", out, "--force"], ("--out",))
add("paths", "compile --out a folder with a foreign manifest.json",
    compile_tiny + ["--out", "../webext"], ("webext",),
    setup=write("webext/manifest.json", json.dumps({"manifest_version": 3, "name": "my extension"})))
add("paths", "compile --out a bundle-like folder with a subfolder", compile_tiny + ["--out", "../bundle2"],
    ("bundle2",), setup=lambda ws: (__import__("shutil").copytree(ws / "bundle", ws / "bundle2"),
                                    (ws / "bundle2" / "keep").mkdir(), (ws / "bundle2" / "keep" / "x").write_text("x")))
add("paths", "compile --out a symlink to a user folder", compile_tiny + ["--out", "../link"], ("link",),
    setup=lambda ws: (ws / "link").symlink_to(ws / "mydir"))
add("paths", "compile --keep-intermediates over a user folder", compile_tiny + ["--out", "../b", "--keep-intermediates"],
    ("b.intermediates",), setup=write("b.intermediates/todo.txt", "mine\n"))
add("paths", "compile --keep-intermediates, spec fails: old dumps kept",
    ["compile", "../bad.toml", "--out", "../b", "--keep-intermediates"], ("n_heads",),
    setup=steps(write("b.intermediates/01-exported.onnx", b"old dump"),
                write("bad.toml", 'name = "b"\n[model]\nd_model = 64\nn_heads = 0\n[encoding]\nname = "rope"\n')))
for where, words in (("{ws}/bundle/r.json", ("inside the bundle",)), ("notes.txt", ("notes.txt",)),
                     ("../mydir", ("mydir",)), ("/sys/r.json", ("/sys",)), ("", ("empty",))):
    add("paths", f"compile --json {where!r}", compile_tiny + ["--out", "new", "--json", where], words)
    add("paths", f"parity --json {where!r}", ["parity", B, "--json", where], words)
run = ["run", B, "--inputs", "{ws}/in.npz", "--out"]
for where, words in (("{ws}/bundle/reference.npz", ("inside the bundle",)), ("{ws}/bundle/new.npz", ("inside the bundle",)),
                     ("notes.txt", ("notes.txt",)), ("../mydir", ("mydir",)), ("{ws}/in.npz", ("input",)),
                     ("/sys/o.npz", ("/sys",)), ("notes.txt/o.npz", ("notes.txt",)), ("", ("empty",))):
    add("paths", f"run --out {where!r}", run + [where], words)
add("paths", "run --out result.txt writes exactly result.txt", run + ["result.txt"], rc=(0,), writes=("work/result.txt",),
    check=lambda ws, r, before: "" if (ws / "work" / "result.txt").is_file() and "wrote result.txt" in r.stdout
    and zipfile.is_zipfile(ws / "work" / "result.txt") else "result.txt was not written as printed")
add("paths", "run --out replaces its own earlier output", run + ["o.npz"], rc=(0,), writes=("work/o.npz",),
    setup=lambda ws: __import__("shutil").copy(ws / "in.npz", ws / "work" / "o.npz"))
for where, words in (("notes.txt/x", ("notes.txt",)), ("notes.txt", ("notes.txt",)), ("", ("empty",)),
                     ("/sys/bench", ("/sys",)), ("{ws}/bundle/x", ("inside the bundle",))):
    add("paths", f"bench --out {where!r}", ["bench", TINY, "--out", where, "--lengths", "8", "--batch", "1"], words)
add("paths", "deploy --json over a user file", ["deploy", B, "--rpc", "127.0.0.1:9", "--json", "notes.txt"], ("notes.txt",))
# a full disk: the write fails (here at the file size limit, EFBIG) with no filename; the error
# must name the file, and no half-written file (or .partial sibling) may stay
add("paths", "run --out on a full disk", run + ["o.npz"], ("o.npz",), file_size_limit=1000)
add("paths", "parity --json on a full disk", ["parity", B, "--lengths", "3", "--json", "r.json"], ("r.json",),
    file_size_limit=500)

# ----------------------------------------------------------------------------- files
EMPTY_ONNX, GARBAGE = b"", b"\x00not a protobuf" * 10
for cmd in ("compile", "inspect"):
    for name, content in (("empty.onnx", EMPTY_ONNX), ("garbage.onnx", GARBAGE),
                          ("truncated.onnx", lambda p: p.write_bytes((p.parent / "bundle" / "model.onnx").read_bytes()[:2000]))):
        add("files", f"{cmd} {name}", [cmd, f"../{name}"], (name,), setup=write(name, content))
    add("files", f"{cmd} a folder named x.onnx", [cmd, "../dir.onnx"], ("dir.onnx",),
        setup=lambda ws: (ws / "dir.onnx").mkdir())
    add("files", f"{cmd} missing.onnx", [cmd, "missing.onnx"], ("missing.onnx",))
add("files", "compile a folder named x.toml", ["compile", "../dir.toml"], ("dir.toml",), setup=lambda ws: (ws / "dir.toml").mkdir())
add("files", "compile a binary .toml", ["compile", "../bin.toml"], ("bin.toml",), setup=write("bin.toml", b"\xff\xfe\x00\x81" * 50))
add("files", "compile an empty .toml", ["compile", "../empty.toml"], ("empty.toml",), setup=write("empty.toml", ""))
add("files", "compile missing.toml", ["compile", "missing.toml"], ("missing.toml",))
add("files", "compile '' (empty graph)", ["compile", ""], ("graph",))
add("files", "compile a folder by name", ["compile", "../mydir"], ("mydir",))
add("files", "compile an unknown graph name", ["compile", "nosuchgraph"], ("nosuchgraph",))
add("files", "inspect ''", ["inspect", ""], ("empty",))
add("files", "inspect a plain file", ["inspect", "notes.txt"], ("notes.txt",))
add("files", "inspect a user folder", ["inspect", "../mydir"], ("mydir",))
add("files", "parity a missing bundle", ["parity", "nowhere"], ("nowhere",))
add("files", "inspect a model.onnx file inside a bundle", ["inspect", f"{B}/model.onnx"], rc=(0,))


def npz_with(**arrays):
    import numpy as np
    return lambda path: np.savez(path, **arrays)


def npz_object(path):
    import numpy as np
    np.savez(path, x=np.array([{"a": 1}], dtype=object), positions=np.arange(5))


def npy(path):
    import numpy as np
    np.save(path, np.zeros(3))


def zeros(shape, dtype="float32"):
    import numpy as np
    return np.zeros(shape, dtype)


def arange(n, dtype="int64"):
    import numpy as np
    return np.arange(n).astype(dtype)


inputs = {
    "empty.npz": (b"", ("empty.npz",)), "text.npz": (b"hello", ("text.npz",)),
    "x.npy": (npy, ("x.npy",)), "object.npz": (npz_object, ("object.npz",)),
    "truncated.npz": (lambda p: p.write_bytes((p.parent / "in.npz").read_bytes()[:300]), ("truncated.npz",)),
    "none.npz": (npz_with(), ("none.npz",)),
    "names.npz": (npz_with(x=zeros((1, 5, 64)), pos=arange(5)), ("positions", "pos")),
    "dtype.npz": (npz_with(x=zeros((1, 5, 64), "float64"), positions=arange(5)), ("float32", "'x'")),
    "rank.npz": (npz_with(x=zeros((5, 64)), positions=arange(5)), ("rank",)),
    "width.npz": (npz_with(x=zeros((1, 5, 32)), positions=arange(5)), ("64",)),
    "long.npz": (npz_with(x=zeros((1, 2000, 64)), positions=arange(2000)), ("2000",)),
    "batch.npz": (npz_with(x=zeros((100, 5, 64)), positions=arange(5)), ("100",)),
    "zero.npz": (npz_with(x=zeros((1, 0, 64)), positions=arange(0)), ("0",)),
    "mismatch.npz": (npz_with(x=zeros((1, 5, 64)), positions=arange(6)), ("seq",)),
    "posdtype.npz": (npz_with(x=zeros((1, 5, 64)), positions=arange(5, "int32")), ("int64",)),
}
for name, (content, words) in inputs.items():
    add("files", f"run --inputs {name}", ["run", B, "--inputs", f"../{name}", "--out", "o.npz"], words,
        setup=write(name, content))
add("files", "run --inputs a folder", ["run", B, "--inputs", "../mydir", "--out", "o.npz"], ("mydir",))
add("files", "run --inputs missing", ["run", B, "--inputs", "missing.npz", "--out", "o.npz"], ("missing.npz",))


def onnx_graph(path, *, op="Relu", inputs=(("x", [1, 4]),), outputs=True, out_shape=(1, 4)):
    import onnx
    from onnx import TensorProto, helper
    node = helper.make_node(op, ["x"], ["y"], name=f"my_{op.lower()}")
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out_shape))] if outputs else []
    onnx.save(helper.make_model(helper.make_graph([node], "g", ins, outs),
                                opset_imports=[helper.make_opsetid("", 17)]), path)


add("files", "compile an .onnx with an unsupported op", ["compile", "../celu.onnx", "--out", "c"], ("Celu",),
    setup=lambda ws: onnx_graph(ws / "celu.onnx", op="Celu"))
add("files", "inspect an .onnx with an unsupported op", ["inspect", "../celu.onnx"], ("Celu",), rc=(1,),
    setup=lambda ws: onnx_graph(ws / "celu.onnx", op="Celu"))


def onnx_typed(path, *, inputs=(("x", "FLOAT"),), outputs=(("y", "FLOAT"),), op="Relu", **attrs):
    """A one-node graph with these input and output element types (no inputs: fed by a Constant)."""
    import onnx
    from onnx import TensorProto, helper
    nodes = [] if inputs else [helper.make_node("Constant", [], ["x"], value=helper.make_tensor(
        "v", TensorProto.FLOAT, [1, 4], [1.0, 2.0, 3.0, 4.0]))]
    nodes.append(helper.make_node(op, [inputs[0][0] if inputs else "x"], [outputs[0][0]], **attrs))
    info = [[helper.make_tensor_value_info(n, getattr(TensorProto, t), [1, 4]) for n, t in values]
            for values in (inputs, outputs)]
    onnx.save(helper.make_model(helper.make_graph(nodes, "g", *info), opset_imports=[helper.make_opsetid("", 17)]), path)


for label, graph, words in (
        ("no inputs", {"inputs": ()}, ("odd.onnx has no inputs",)),
        ("a string input", {"inputs": (("s", "STRING"),), "outputs": (("t", "STRING"),), "op": "Identity"}, ("'s'",)),
        ("a string output", {"outputs": (("s", "STRING"),), "op": "Cast", "to": 8}, ("'s'",)),
        ("a complex input", {"inputs": (("c", "COMPLEX64"),), "outputs": (("d", "COMPLEX64"),), "op": "Identity"}, ("'c'",))):
    for cmd in ("compile", "inspect"):
        add("files", f"{cmd} an .onnx with {label}", [cmd, "../odd.onnx"], words,
            setup=lambda ws, graph=graph: onnx_typed(ws / "odd.onnx", **graph))
for shape, words in (("nosuch=1x4", ("nosuch",)), ("x=1x4x4", ("rank",)), ("x=0x4", ("--shape",)),
                     ("=1x4", ("--shape",)), ("x", ("--shape",)), ("x=1xa", ("--shape",)),
                     ("x=1x2", ("axis 1",))):  # x is [1, 4]: the 2 silently overrode the graph's 4
    add("files", f"compile relu.onnx --shape {shape}", ["compile", "../relu.onnx", "--shape", shape, "--out", "r"], words,
        setup=lambda ws: onnx_graph(ws / "relu.onnx"))
for relation, words in (("s53", ("--dim-relation", "expected DIM=DIM")), ("s=s+T", ("--dim-relation",)),
                         ("s=past*T", ("--dim-relation",)), ("nosuch=seq+batch", ("nosuch", "symbolic dims"))):
    add("files", f"compile dyn.onnx --dim-relation {relation}",
        ["compile", "../dyn.onnx", "--dim-relation", relation, "--out", "r"], words,
        setup=lambda ws: onnx_graph(ws / "dyn.onnx", inputs=(("x", ["batch", "seq", 4]),), out_shape=["batch", "seq", 4]))

# ----------------------------------------------------------------------------- specs
MODEL = {"d_model": 64, "n_heads": 4, "n_layers": 2, "d_ff": 128}


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return repr(v)


def toml_text(data: dict, prefix: str = "") -> str:
    plain = [f"{k} = {toml_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    tables = [f"\n[{prefix}{k}]\n" + toml_text(v, f"{prefix}{k}.") for k, v in data.items() if isinstance(v, dict)]
    return "\n".join(plain) + "\n" + "".join(tables)


def spec(words, *, top=None, model=None, encoding=None, export=None, drop=(), raw=None, name=None):
    data = {"name": "bad", "model": {**MODEL, **(model or {})}, "encoding": encoding or {"name": "rope"},
            **({"export": export} if export is not None else {}), **(top or {})}
    for key in drop:
        data.pop(key)
    text = raw if raw is not None else toml_text(data)
    add("specs", name or f"{words[0]}", ["compile", "../bad.toml", "--out", "b"], words, setup=write("bad.toml", text))


for field, value in (("n_heads", 0), ("n_heads", -4), ("n_heads", [4]), ("n_heads", "4"), ("d_model", 3.5),
                     ("d_model", True), ("d_model", -64), ("d_model", 10**9), ("n_layers", 0), ("d_ff", 0),
                     ("norm_eps", 0.0), ("norm_eps", math.nan), ("norm_eps", -1.0), ("width", 3)):
    spec((field,), model={field: value}, name=f"model.{field} = {value!r}")
spec(("n_heads",), model={"n_heads": 5}, name="d_model not divisible by n_heads")
for field, value in (("base", 0.0), ("base", "big"), ("base", math.inf), ("rotary_dim", 7), ("rotary_dim", 64),
                     ("interleaved", 1), ("bse", 1.0)):
    spec((field,), encoding={"name": "rope", field: value}, name=f"rope {field} = {value!r}")
for options, words in (({"num_buckets": 3}, ("num_buckets",)), ({"max_distance": 1}, ("max_distance",)),
                       ({"num_buckets": [32]}, ("num_buckets",))):
    spec(words, encoding={"name": "t5_bias", **options}, name=f"t5_bias {options}")
for value in (0, -1, 2.5):
    spec(("max_len",), encoding={"name": "learned", "max_len": value}, name=f"learned max_len = {value}")
spec(("max_len", "example_length"), encoding={"name": "learned", "max_len": 8}, name="learned table shorter than the example")
for layers, words in ((3, ("layers",)), (["rope"], ("layers",)), (["rope", "nope"], ("layers",)),
                      (["rope", "hybrid"], ("layers",)), ("rope", ("layers",))):
    spec(words, encoding={"name": "hybrid", "layers": layers}, name=f"hybrid layers = {layers!r}")
spec(("alibi",), encoding={"name": "hybrid", "layers": ["rope", "t5_bias"], "alibi": {}}, name="hybrid options for an unlisted layer")
spec(("num_buckets",), encoding={"name": "hybrid", "layers": ["rope", "t5_bias"], "t5_bias": {"num_buckets": 5}},
     name="hybrid sub-encoding option out of range")
for value, words in (("fourier", ("fourier",)), (["rope"], ("encoding",)), (5, ("encoding",))):
    spec(words, encoding={"name": value}, name=f"encoding.name = {value!r}")
spec(("encoding",), raw="encoding = 5\n" + toml_text({"name": "bad", "model": MODEL}), name="encoding = 5")
spec(("encoding",), raw='encoding = ["rope"]\n' + toml_text({"name": "bad", "model": MODEL}), name="encoding = ['rope']")
for field, value in (("max_length", -5), ("max_length", 0), ("max_length", 8), ("max_batch", 0), ("example_length", 0),
                     ("max_length", "long"), ("nope", 1)):
    spec((field,), export={field: value}, name=f"export.{field} = {value!r}")
for field, value in (("name", "../x"), ("name", ""), ("name", 5), ("name", "zé"), ("seed", -1), ("seed", 1.5), ("description", 5),
                     ("extra", 1)):
    spec((field,), top={field: value}, name=f"{field} = {value!r}")
for key in ("name", "model", "encoding"):
    spec((key,), drop=(key,), name=f"missing {key}")
spec(("model",), raw='name = "bad"\nmodel = 5\n[encoding]\nname = "rope"\n', name="model = 5")
spec(("export",), raw=toml_text({"name": "bad", "model": MODEL, "encoding": {"name": "rope"}}).replace(
    'name = "bad"', 'name = "bad"\nexport = 5'), name="export = 5")
spec(("TOML",), raw='name = "bad"\n[model\n', name="invalid TOML")
spec(("d_model",), model={"d_model": 63, "n_heads": 3}, encoding={"name": "sinusoidal"}, name="sinusoidal with an odd d_model")
spec(("head",), model={"d_model": 60, "n_heads": 4}, name="rope with an odd head dim")

# ----------------------------------------------------------------------------- numbers
for value in ("0", "-1", "x", "1.5", "", "99999999999"):
    add("numbers", f"parity --batch {value!r}", ["parity", B, "--batch", value], ("--batch",))
add("numbers", "parity --batch above the bundle's max", ["parity", B, "--batch", "1000"], ("--batch",))
for value in ("0", "-1", "a", ",", "1,x", "99999", "2000"):
    add("numbers", f"parity --lengths {value!r}", ["parity", B, "--lengths", value], ("--lengths",))
for value in ("0", "-1", "x"):
    add("numbers", f"compile --seq-len {value!r}", ["compile", TINY, "--target", "npu", "--seq-len", value, "--out", "n"],
        ("--seq-len",))
add("numbers", "compile --seq-len above the graph's max", ["compile", TINY, "--target", "npu", "--seq-len", "5000", "--out", "n"],
    ("--seq-len",))
TINY_VIT = (Path(__file__).resolve().parent.parent / "tests" / "data" / "vision" / "tiny_vit_rope_2d.toml").read_text()
npu_vit = ["compile", "{ws}/vit.toml", "--target", "npu", "--vendor-build", "skip", "--out", "n"]
for value, words in (("30x32", ("--image-size 30x32", "multiple", "patch 8")), ("32x512", ("--image-size", "max size")),
                     ("8x32x32", ("--image-size", "HxW")), ("32", ("--image-size",)), ("0x32", ("--image-size",)),
                     ("axb", ("--image-size",))):
    add("numbers", f"compile a vision graph for npu --image-size {value}", npu_vit + ["--image-size", value], words,
        setup=write("vit.toml", TINY_VIT))
add("numbers", "compile a vision graph for npu --seq-len 64", npu_vit + ["--seq-len", "64"], ("--seq-len", "--image-size"),
    setup=write("vit.toml", TINY_VIT))
add("numbers", "compile a sequence graph for npu --image-size 32x32",
    ["compile", TINY, "--target", "npu", "--image-size", "32x32", "--out", "n"], ("--image-size", "--seq-len"))
add("numbers", "compile --lengths 0", ["compile", TINY, "--lengths", "0"], ("--lengths",))
add("numbers", "compile --precision bf17", ["compile", TINY, "--precision", "bf17", "--out", "n"], ("--precision",))
add("numbers", "compile --precision bf16 for arm", ["compile", TINY, "--target", "arm", "--precision", "bf16", "--out", "n"],
    ("bf16",))
add("numbers", "bench --bf16-bundle that is no bundle", ["bench", TINY, "--bf16-bundle", "{ws}/nothing-here", "--out", "b"],
    ("nothing-here",))
for value in ("1000000", "7,5000"):  # were compiled first (1000000: an empty parity table marked FAIL, exit 1)
    add("numbers", f"compile --lengths {value} beyond the graph's max_length", ["compile", TINY, "--lengths", value, "--out", "n"],
        ("--lengths",))
add("numbers", "compile an .onnx with --lengths beyond its bounds (the bundle stays, said so)",
    ["compile", "../dyn.onnx", "--lengths", "1000000", "--out", "dyn"], ("--lengths 1000000", "written to"),
    writes=("work/dyn",), setup=lambda ws: onnx_graph(ws / "dyn.onnx", inputs=(("x", ["batch", "seq", 4]),),
                                                       out_shape=["batch", "seq", 4]),
    check=lambda ws, r, before: "" if (ws / "work" / "dyn" / "manifest.json").is_file() else "the bundle was not kept")
add("numbers", "compile --seq-len without --target npu", ["compile", TINY, "--seq-len", "64", "--out", "n"], ("seq_len",))
add("numbers", "compile --arch for llvm", ["compile", TINY, "--arch", "sm_80", "--out", "n"], ("arch",))
add("numbers", "compile --target cuda --arch sm_x", ["compile", TINY, "--target", "cuda", "--arch", "sm_x", "--out", "n"], ("sm_x",))
for option, value in (("--threads", "0"), ("--threads", "-2"), ("--threads", "100000"), ("--repeat", "0"),
                      ("--min-time", "-1"), ("--min-time", "nan"), ("--lengths", "0"), ("--batch", "0"),
                      ("--batch", "1000"), ("--lengths", "5000"), ("--engines", "tvm,foo")):
    add("numbers", f"bench {option} {value}", ["bench", TINY, option, value, "--out", "bench"], (option, value))
for option, value in (("--trials", "0"), ("--trials", "-5"), ("--lengths", "0"), ("--batch", "0")):
    add("numbers", f"tune {option} {value}", ["tune", TINY, option, value], (option,))
for option, value in (("--timeout", "0"), ("--timeout", "-1"), ("--timeout", "nan"), ("--rpc", "nohost"),
                      ("--rpc", "127.0.0.1:0"), ("--rpc", "127.0.0.1:99999"), ("--rpc", "127.0.0.1:x"),
                      ("--rpc", "::1:9090"), ("--rpc", "[foo]:9090"), ("--rpc", "[::1]")):
    extra = [] if option == "--rpc" else ["--rpc", "127.0.0.1:9"]
    add("numbers", f"deploy {option} {value}", ["deploy", B, option, value, *extra], (option,))
add("numbers", "deploy --tracker without --key", ["deploy", B, "--tracker", "127.0.0.1:9"], ("--key",))
add("numbers", "deploy to a closed port", ["deploy", B, "--rpc", "127.0.0.1:9", "--timeout", "5"], ("127.0.0.1:9",))
add("numbers", "deploy to a closed IPv6 port", ["deploy", B, "--rpc", "[::1]:9", "--timeout", "5"], ("[::1]:9",))

# ----------------------------------------------------------------------------- manifests


def manifest_edit(fn):
    def setup(ws):
        path = ws / "bundle" / "manifest.json"
        manifest = json.loads(path.read_text())
        result = fn(manifest)
        path.write_text(result if isinstance(result, str) else json.dumps(manifest if result is None else result))
    return setup


def tamper(rel):
    def setup(ws):
        path = ws / "bundle" / rel
        data = bytearray(path.read_bytes())
        data[100] ^= 0xFF
        path.write_bytes(bytes(data))
    return setup


edits = {
    "a list": (lambda m: [m], ("JSON object",)),
    "a string": (lambda m: "\"bundle\"", ("JSON object",)),
    "null": (lambda m: "null", ("JSON object",)),
    "empty": (lambda m: "", ("JSON",)),
    "not JSON": (lambda m: "{not json", ("JSON",)),
    "without inputs": (lambda m: m.pop("inputs") and None, ("inputs",)),
    "without outputs": (lambda m: m.pop("outputs") and None, ("outputs",)),
    "without files": (lambda m: m.pop("files") and None, ("files",)),
    "with files = []": (lambda m: m.update(files=[]), ("files",)),
    "without model.so's checksum": (lambda m: m["files"].pop("model.so") and None, ("model.so",)),
    "with a bad checksum string": (lambda m: m["files"].update({"model.so": "abc"}), ("model.so",)),
    "with a file outside the bundle": (lambda m: m["files"].update({"../notes.txt": "0" * 64}), ("../notes.txt",)),
    "with inputs = {}": (lambda m: m.update(inputs={}), ("inputs",)),
    "without an input's dtype": (lambda m: m["inputs"][0].pop("dtype") and None, ("dtype",)),
    "with dims = 3": (lambda m: m.update(dims=3), ("dims",)),
    "with an unknown dim role": (lambda m: m["dims"]["seq"].update(role="time"), ("role",)),
    "with min > max": (lambda m: m["dims"]["seq"].update(min=10, max=2), ("seq",)),
    "without reference": (lambda m: m.pop("reference") and None, ("reference",)),
    "without tolerance": (lambda m: m.pop("tolerance") and None, ("tolerance",)),
    "with outputs = []": (lambda m: m.update(outputs=[]), ("outputs",)),
    "with format_version '2'": (lambda m: m.update(format_version="2"), ("format",)),
    "with format_version 1 (before reference.cases)": (lambda m: m.update(format_version=1), ("format",)),
    "with format_version 3": (lambda m: m.update(format_version=3), ("format",)),
    "without target.device": (lambda m: m["target"].pop("device") and None, ("device",)),
    "with graph.spec null": (lambda m: m["graph"].update(spec=None), ("spec",)),
    "with an undefined input dim": (lambda m: m["inputs"][0].update(dims=["batch", "time", 64]), ("time",)),
}
for label, (fn, words) in edits.items():
    for cmd in (("inspect", B), ("parity", B, "--lengths", "3"), ("run", B, "--inputs", "{ws}/in.npz", "--out", "o.npz")):
        if cmd[0] != "inspect" and label not in ("a list", "without inputs", "without files", "without model.so's checksum"):
            continue
        add("manifests", f"{cmd[0]}: manifest {label}", list(cmd), words, setup=manifest_edit(fn))
add("manifests", "run: tampered model.so with the checksum list removed",
    ["run", B, "--inputs", "{ws}/in.npz", "--out", "o.npz"], ("files",),
    setup=steps(manifest_edit(lambda m: m.pop("files") and None), tamper("model.so")))
for rel in ("model.so", "model.onnx", "reference.npz", "run_on_board.py"):
    add("manifests", f"parity: tampered {rel}", ["parity", B, "--lengths", "3"], (rel,), setup=tamper(rel))


def truncate_so(keep):
    """model.so cut to `keep` bytes (negative: that many off its end), its checksum updated to match."""
    def setup(ws):
        import hashlib
        so = ws / "bundle" / "model.so"
        so.write_bytes(so.read_bytes()[:keep])
        manifest_edit(lambda m: m["files"].update({"model.so": hashlib.sha256(so.read_bytes()).hexdigest()}))(ws)
    return setup


for keep in (100_000, -100):  # 100000: TVM's load_module died by SIGBUS (exit 135), no message
    for cmd in (("run", B, "--inputs", "{ws}/in.npz", "--out", "o.npz"), ("parity", B, "--lengths", "3"),
                ("deploy", B, "--rpc", "127.0.0.1:9", "--timeout", "5")):
        cut = f"to {keep} bytes" if keep > 0 else f"by {-keep} bytes"
        add("manifests", f"{cmd[0]}: model.so truncated {cut}, checksum updated", list(cmd),
            ("model.so is truncated",), setup=truncate_so(keep))
add("manifests", "inspect: model.so deleted", ["inspect", B], ("model.so",), setup=lambda ws: (ws / "bundle" / "model.so").unlink())
add("manifests", "inspect: an unlisted file added", ["inspect", B], ("extra.txt",), setup=write("bundle/extra.txt", "x"))
add("manifests", "inspect: manifest.json is a folder", ["inspect", B], ("manifest.json",),
    setup=lambda ws: ((ws / "bundle" / "manifest.json").unlink(), (ws / "bundle" / "manifest.json").mkdir()))
add("manifests", "inspect: manifest.json deleted", ["inspect", B], ("manifest.json",),
    setup=lambda ws: (ws / "bundle" / "manifest.json").unlink())
add("manifests", "inspect: manifest.json binary", ["inspect", B], ("manifest.json",), setup=write("bundle/manifest.json", b"\xff\xfe\x00"))

# ----------------------------------------------------------------------------- signals


def intact(ws, result, before):
    """The bundle at WS/bundle: replaced by a new good one if the command succeeded, else as it was."""
    from bad_input_probe import tree_digest
    now = {k: v for k, v in tree_digest(ws).items() if k.startswith("bundle/")}
    was = {k: v for k, v in before.items() if k.startswith("bundle/")}
    if result.rc == 0 or any(rc == 0 for rc, _ in result.extra):  # this command or its twin succeeded
        return "" if (ws / "bundle" / "manifest.json").is_file() else "no bundle after a successful compile"
    return "" if now == was else "the previous bundle changed although the command failed"


for marker, sig, delay in (("[load]", signal.SIGINT, 0.0), ("[export]", signal.SIGINT, 0.5),
                           ("[simplify]", signal.SIGTERM, 0.2), ("[build]", signal.SIGINT, 1.0),
                           ("[build]", signal.SIGTERM, 1.0), ("[build]", signal.SIGHUP, 1.0),
                           ("[finalize]", signal.SIGTERM, 0.0), ("[finalize]", signal.SIGINT, 0.05),
                           ("[finalize]", signal.SIGTERM, 0.15), ("[finalize]", signal.SIGTERM, 0.3)):
    add("signals", f"{signal.Signals(sig).name} at {marker} +{delay:g} s, over a bundle",
        ["compile", TINY, "--lengths", "7", "--out", B], ("interrupted",), rc=(128 + sig, 0), signal=(marker, sig, delay),
        writes=("bundle",), check=intact)
add("signals", "SIGINT while compiling into a new folder", ["compile", TINY, "--lengths", "7", "--out", "fresh"],
    ("interrupted",), rc=(130,), signal=("[build]", signal.SIGINT, 0.5))
add("signals", "SIGTERM while compiling with --keep-intermediates", ["compile", TINY, "--out", "k", "--keep-intermediates"],
    ("interrupted",), rc=(143,), signal=("[build]", signal.SIGTERM, 0.5), writes=("work/k.intermediates",))
for delay in (0.3, 1.5, 3.0):
    add("signals", f"SIGINT {delay:g} s into run", ["run", B, "--inputs", "{ws}/in.npz", "--out", "o.npz"], ("interrupted",),
        rc=(130, 0), signal=(None, signal.SIGINT, delay), writes=("work/o.npz",))
add("signals", "SIGTERM 1 s into parity", ["parity", B, "--lengths", "3"], ("interrupted",),
    rc=(143, 0), signal=(None, signal.SIGTERM, 1.0))

# ----------------------------------------------------------------------------- concurrency
add("concurrency", "two compiles into one new folder", ["compile", TINY, "--lengths", "7", "--out", "same"],
    ("being written",), rc=(0, 2), twin=True, writes=("work/same",),
    check=lambda ws, r, before: "" if (ws / "work" / "same" / "manifest.json").is_file() else "no bundle at the end")
add("concurrency", "two compiles over one bundle", ["compile", TINY, "--lengths", "7", "--out", B],
    ("being written",), rc=(0, 2), twin=True, writes=("bundle",), check=intact)
add("concurrency", "compile after a killed writer's leftovers", ["compile", TINY, "--lengths", "7", "--out", B],
    rc=(0,), writes=("bundle", ".bundle.partial-999999", ".bundle.old-999999"),
    setup=lambda ws: (__import__("shutil").copytree(ws / "bundle", ws / ".bundle.partial-999999"),
                      __import__("shutil").copytree(ws / "bundle", ws / ".bundle.old-999999")),
    check=lambda ws, r, before: "" if not list(ws.glob(".bundle.*-999999")) else "stale partial folders stayed")
add("concurrency", "compile after a killed writer had moved the bundle aside", ["compile", TINY, "--lengths", "7", "--out", B],
    rc=(0,), setup=lambda ws: (ws / "bundle").rename(ws / ".bundle.old-999999"), writes=("bundle", ".bundle.old-999999"),
    check=lambda ws, r, before: "" if (ws / "bundle" / "manifest.json").is_file() and not list(ws.glob(".bundle.*"))
    else "the bundle was not recovered, or leftovers stayed")
