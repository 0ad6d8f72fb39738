"""The rknpu2 profile's vendor compiler, Rockchip RKNN-Toolkit2, driven as a subprocess.

Without the toolchain: the log parser on a real build log's excerpt, the profile-vs-vendor
agreement check, the worker's failure modes (a crash names the stage it died in), and a
compile that says no vendor build was made. With it (marker `rknn`, skipped with the
setup command when it is missing): a tiny graph through RKNN's build and simulator, and a
probe graph of single ops whose placement by RKNN must match our profile, op by op.
The full matrix (every graph, T, dtype, SoC; foreign encoders) is marked `rknn_full`.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from portable_pe.npu import rknn
from portable_pe.npu.agreement import agreement
from portable_pe.npu.profiles import NodeVerdict, check_model, load_profile
from portable_pe.npu.rknn_log import layer_table, placement
from portable_pe.npu.toolchain import VendorError, toolchain_python
from portable_pe.npu.vendors import VENDORS
from portable_pe.run.parity import TOLERANCES

from conftest import assert_parity

pytestmark = pytest.mark.integration  # run by scripts/test.sh after the default run (pyproject.toml)

DATA = Path(__file__).parent / "data"
HAVE_RKNN = toolchain_python("rknn") is not None
needs_rknn = pytest.mark.skipif(not HAVE_RKNN, reason="RKNN-Toolkit2 is not set up: bash scripts/npu_toolchain.sh rknn")


def test_layer_table_from_a_real_build_log():
    text = (DATA / "rknn_build_excerpt.log").read_text()
    rows = layer_table(text)
    assert [r.id for r in rows][:3] == [0, 1, 2] and rows[-1].op == "OutputOperator"
    erf = [r for r in rows if r.op == "Erf"]
    assert len(erf) == 1 and erf[0].target == "CPU" and erf[0].onnx_name == "gelu1_gelu1_e"
    assert erf[0].input_shape == "(1,1024,1,128)"
    placed = placement(text)
    assert placed["io_ops"] == 2 and placed["ops_cpu"] == 1 and placed["ops_total"] == len(rows) - 2
    why = placed["cpu_ops"][0]["why"][0]
    assert placed["cpu_ops"][0]["op"] == "Erf" and why.startswith("RKNN's layer table: 35 Erf FLOAT16 CPU")
    assert placed["cpu_rw_kb"] == 256 and placed["npu_cycles"] == 16384 + 8192 + 8192


def test_a_log_without_a_layer_table_is_an_error():
    with pytest.raises(ValueError, match="no layer table"):
        placement("I rknn building ...\nE build: something failed\n")


def _verdict(node, op, allowed, why=()):
    return NodeVerdict(node, op, allowed, list(why))


def test_agreement_finds_disagreements_both_ways():
    verdicts = [_verdict("mm", "MatMul", True), _verdict("e", "Erf", False, ["op Erf is not in profile"]),
                _verdict("x", "Exp", True), _verdict("r", "Reciprocal", False, ["not in profile"])]
    cpu = [{"op": "Erf", "name": "e", "target": "CPU"},  # both say CPU
           {"op": "Exp", "name": "x", "target": "CPU"},  # profile allows it: disagreement
           {"op": "Reshape", "name": "mm_rs", "target": "CPU"},  # inserted by the vendor
           {"op": "Reshape", "name": "input_rs#3", "target": "CPU"}]  # from no node
    result = agreement(verdicts, {"cpu_ops": cpu})
    assert not result["agree"]
    assert len(result["disagreements"]) == 2
    assert any(d.startswith("profile allows x [Exp]") for d in result["disagreements"])
    assert any(d.startswith("profile refuses r [Reciprocal]") for d in result["disagreements"])
    assert len(result["vendor_inserted_cpu_ops"]) == 2
    # a converted op keeps its node: RKNN turns Reciprocal r into Div "r#1"
    ok = agreement(verdicts, {"cpu_ops": [cpu[0], {"op": "Div", "name": "r#1", "target": "CPU"}]})
    assert ok["agree"] and ok["vendor_cpu_nodes"] == ["e", "r"]


def _tiny_model(seq=8, width=16):
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((width, width)).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, width])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, width])], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])


@pytest.mark.parametrize("crash_in, words", [
    ("build", ["rknn build (rk3588, int8): rknn crashed (SIGSEGV)"]),
    ("simulator", ["rknn simulator (rk3588, int8): rknn crashed (SIGSEGV)"]),
    ("refuse", ["rknn build (rk3588, int8): rknn failed (exit 1)", "RKNN said: E build: the vendor refused"]),
])
def test_a_failing_vendor_names_the_stage_and_its_words(tmp_path, monkeypatch, crash_in, words):
    """A stand-in worker (this interpreter) follows the real one's progress protocol and
    dies where RKNN can: in build, in the simulator, or refusing with an E line."""
    fake = tmp_path / "fake_worker.py"
    fake.write_text("import json, os, sys\n"
                    "def stage(s): json.dump({'stage': s}, open('progress.json', 'w'))\n"
                    "stage('build')\n"
                    f"if {crash_in!r} == 'refuse':\n"
                    "    print('E build: the vendor refused'); sys.exit(1)\n"
                    f"if {crash_in!r} == 'simulator': stage('simulator')\n"
                    "os.kill(os.getpid(), 11)\n")
    monkeypatch.setattr(rknn, "WORKER", fake)
    x = np.zeros((1, 8, 16), np.float32)
    with pytest.raises(VendorError) as err:
        rknn.build(_tiny_model(), soc="rk3588", dtype="int8", calibration=[{"x": x}], simulate=[{"x": x}],
                   python=Path(sys.executable), log=lambda m: None)
    for w in words:
        assert w in str(err.value)


def test_bad_soc_and_dtype_name_the_valid_ones():
    profile = load_profile("rknpu2")
    with pytest.raises(ValueError, match="rk3588, rk3576, rk3568"):
        profile.resolve_soc("rk9999")
    with pytest.raises(ValueError, match="generic_int8.*float16"):
        load_profile("generic_int8").check_dtype("fp16")
    assert profile.resolve_soc(None) == "rk3588" and set(profile.socs) <= set(rknn.SOCS)
    assert "Softmax" not in profile.for_soc("rk3568").ops and "Sin" in profile.for_soc("rk3576").ops


def test_vendor_graph_is_opset_19_and_refuses_newer_ops():
    model = _tiny_model()
    model.opset_import[0].version = 20
    assert rknn.vendor_graph(model).opset_import[0].version == 19
    gelu = helper.make_model(helper.make_graph(
        [helper.make_node("Gelu", ["x"], ["y"])], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])]), opset_imports=[helper.make_opsetid("", 20)])
    with pytest.raises(ValueError, match="opset <= 19.*Gelu"):
        rknn.vendor_graph(gelu)


# --- with the toolchain ------------------------------------------------------------------

#: single-op branches off one input, each its own graph output: (name, op, extra inputs, attrs)
def probe_model(seq: int = 32, width: int = 64) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits, nodes, outs = [], [], []
    shape = [1, seq, width]

    def const(name, value, dtype=np.float32):
        inits.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def op(kind, inputs, name, out_shape=shape, **attrs):
        nodes.append(helper.make_node(kind, inputs, [name], name=name, **attrs))
        outs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, out_shape))
        return name

    def pos(name):  # |x| + 1, a positive input, made by ops the NPU runs
        nodes.append(helper.make_node("Abs", ["x"], [name + "_abs"], name=name + "_abs"))
        nodes.append(helper.make_node("Add", [name + "_abs", const(name + "_one", 1.0)], [name], name=name))
        return name

    for kind in ("Erf", "Exp", "Sin", "Cos", "Floor", "Sign", "Abs", "Neg", "Sigmoid", "Tanh", "Relu", "Softplus",
                 "Elu", "LeakyRelu", "HardSigmoid", "HardSwish"):
        op(kind, ["x"], f"p_{kind}")
    op("Log", [pos("log_in")], "p_Log")
    op("Sqrt", [pos("sqrt_in")], "p_Sqrt")
    op("Reciprocal", [pos("recip_in")], "p_Reciprocal")
    op("Div", [const("num", 1.0), pos("div_in")], "p_Div_const_numerator")
    op("Div", ["x", pos("div_in2")], "p_Div_tensor")
    op("Div", ["x", const("three", 3.0)], "p_Div_const_divisor")
    op("Pow", ["x", const("two", 2.0)], "p_Pow")
    op("Max", ["x", const("zero", 0.0)], "p_Max")
    op("Min", ["x", const("zero2", 0.0)], "p_Min")
    op("Clip", ["x", const("lo", -1.0), const("hi", 1.0)], "p_Clip")
    op("Where", [const("cond", rng.random(shape) > 0.5, np.bool_), "x", const("zz", 0.0)], "p_Where")
    op("Softmax", ["x"], "p_Softmax", axis=-1)
    op("LayerNormalization", ["x", const("g", rng.standard_normal(width)), const("b", rng.standard_normal(width))],
       "p_LayerNormalization", axis=-1, epsilon=1e-5)
    op("MatMul", ["x", const("w", rng.standard_normal((width, 16)) * 0.1)], "p_MatMul", out_shape=[1, seq, 16])
    op("ReduceSum", ["x", const("ax", [-1], np.int64)], "p_ReduceSum", out_shape=[1, seq, 1], keepdims=1)
    op("ReduceMax", ["x", const("ax2", [-1], np.int64)], "p_ReduceMax", out_shape=[1, seq, 1], keepdims=1)
    op("Gather", ["x", const("gi", np.arange(0, seq, 2), np.int64)], "p_Gather", out_shape=[1, seq // 2, width], axis=1)
    op("Slice", ["x", const("s0", [1], np.int64), const("s1", [width], np.int64), const("s2", [2], np.int64),
                 const("s3", [2], np.int64)], "p_Slice_step2", out_shape=[1, seq, width // 2])
    op("Transpose", ["x"], "p_Transpose", out_shape=[1, width, seq], perm=[0, 2, 1])
    # a rank-5 stack, as HF RoFormer interleaves pairs: (1, 4, T, W/4) -> unsqueeze, concat -> back
    nodes.append(helper.make_node("Reshape", ["x", const("r4", [1, 4, seq, width // 4], np.int64)], ["x4"], name="x4"))
    for k in ("a", "b"):
        nodes.append(helper.make_node("Unsqueeze", ["x4", const(f"uax_{k}", [-1], np.int64)], [f"p_Unsqueeze5_{k}"],
                                      name=f"p_Unsqueeze5_{k}"))
    nodes.append(helper.make_node("Concat", ["p_Unsqueeze5_a", "p_Unsqueeze5_b"], ["p_Concat5"], name="p_Concat5", axis=-1))
    op("Reshape", ["p_Concat5", const("r3", [1, seq, 2 * width], np.int64)], "p_Reshape5", out_shape=[1, seq, 2 * width])
    op("CumSum", ["x", const("cax", 1, np.int64)], "p_CumSum")
    op("Tile", ["p_ReduceSum", const("reps", [1, 1, width], np.int64)], "p_Tile")
    graph = helper.make_graph(nodes, "rknn_probe", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    onnx.checker.check_model(model)
    return model


@needs_rknn
@pytest.mark.rknn
def test_profile_agrees_with_rknn_op_by_op():
    """Every probe op: where RKNN's compiler put it (rk3588, fp16) is what the rknpu2
    profile says, both ways; and a profile that is wrong either way is caught."""
    model = probe_model()
    built = rknn.build(model, soc="rk3588", dtype="fp16", calibration=[], log=lambda m: None)
    placed = built.report["placement"]
    profile = load_profile("rknpu2")
    result = agreement(check_model(model, profile), placed)
    assert result["agree"], "\n".join(result["disagreements"])
    cpu = set(result["vendor_cpu_nodes"])
    assert {"p_Erf", "p_Exp", "p_Sin", "p_Reciprocal", "p_Slice_step2"} <= cpu  # the probe reaches the CPU too
    assert {"p_LayerNormalization", "p_Softmax", "p_Sigmoid", "p_Concat5"}.isdisjoint(cpu)
    wrong = replace(profile, ops={**{k: v for k, v in profile.ops.items() if k != "Softmax"}, "Erf": {}})
    bad = agreement(check_model(model, wrong), placed)["disagreements"]
    assert any("allows p_Erf" in d for d in bad) and any("refuses p_Softmax" in d for d in bad)


@needs_rknn
@pytest.mark.rknn
def test_tiny_graph_through_rknn_build_and_simulator(bundle_factory, capsys):
    """The default CI run's RKNN check: the bundle holds what RKNN built and was handed,
    every op ran on the NPU, and the simulator, rerun by `parity`, matches PyTorch."""
    from portable_pe.cli.main import main
    from tests.conftest import TINY_SPEC
    bundle = bundle_factory(TINY_SPEC, "npu", profile="rknpu2", seq_len=32)  # test_npu's bundle
    vendor = bundle.manifest["vendor"]
    assert vendor["built"] and vendor["toolkit"] == "rknn-toolkit2 2.5.0" and vendor["soc"] == "rk3588"
    for name in ("model.rknn", "model.onnx", "dataset.txt", "build.log", "simulator.npz"):
        assert bundle.file(f"rknn/{name}").is_file(), name
    handed = onnx.load(str(bundle.file("rknn/model.onnx")))
    assert handed.opset_import[0].version == 19 and "Gelu" not in {n.op_type for n in handed.graph.node}
    assert len(bundle.file("rknn/dataset.txt").read_text().split()) == 8
    assert vendor["placement"]["ops_cpu"] == 0 and vendor["agreement"]["agree"]
    assert bundle.manifest["npu"]["coverage"]["source"].startswith("rknn-toolkit2 2.5.0 build log")
    # the simulator's outputs, kept in the bundle, against the bundle's PyTorch reference,
    # by the int8 row the bundle holds (not only the cosine compile recorded)
    assert bundle.manifest["tolerance"]["float32"] == TOLERANCES["int8"]
    with np.load(bundle.file("rknn/simulator.npz")) as simulated, np.load(bundle.file("reference.npz")) as reference:
        key = "T32/out/hidden"
        assert_parity({"hidden": reference[key]}, {"hidden": simulated[key]}, tolerance="int8",
                      name="rknn-simulator (from compile)", length=32)
    assert vendor["simulator"]["hidden"]["cosine"] >= TOLERANCES["int8"]["min_cosine"]
    report = bundle.path.parent / f"{bundle.path.name}-parity.json"
    assert main(["parity", str(bundle.path), "--json", str(report)]) == 0
    assert "| rknn-simulator | 32 | hidden |" in capsys.readouterr().out
    rows = {r["candidate"]: r for r in json.loads(report.read_text())["rows"]}
    assert set(rows) == {"onnxruntime", "tvm", "rknn-simulator"}
    assert rows["rknn-simulator"]["ok"], rows["rknn-simulator"]  # by the int8 row, its cosine >= 0.99 included


# --- without the toolchain: what compile says and keeps ---------------------------------

def _state(vendor, mode):
    from types import SimpleNamespace
    lines = []
    profile = {"rknn": "rknpu2", "ethos-u": "ethos-u85"}[vendor]
    return SimpleNamespace(report={"npu": {"vendor": vendor}}, target_options={"vendor_build": mode, "profile": profile},
                           spec=SimpleNamespace(vision=None), log=lines.append), lines


@pytest.mark.parametrize("vendor", sorted(VENDORS))
def test_without_the_toolchain_no_vendor_build_is_made_and_compile_says_how(vendor, tmp_path, monkeypatch):
    from portable_pe.backends.npu import vendor_build
    monkeypatch.setenv("PORTABLE_PE_TOOLCHAIN_DIR", str(tmp_path / "none"))
    state, lines = _state(vendor, "auto")
    staged = vendor_build(state)
    assert staged.report["vendor"]["built"] is False and staged.files == {}
    assert "no vendor build was made" in lines[0]
    assert f"bash scripts/npu_toolchain.sh {VENDORS[vendor].name}" in lines[0], lines
    state, lines = _state(vendor, "skip")
    assert vendor_build(state).report["vendor"]["why"] == "--vendor-build skip"


def test_required_vendor_build_without_toolchain_fails_and_keeps_the_old_bundle(tmp_path, monkeypatch, capsys,
                                                                                tiny_bundle):
    import shutil
    from portable_pe.bundle.artifact import load_bundle
    from portable_pe.cli.main import main
    from tests.conftest import TINY_SPEC
    monkeypatch.setenv("PORTABLE_PE_TOOLCHAIN_DIR", str(tmp_path / "none"))
    out = tmp_path / "bundle"
    shutil.copytree(tiny_bundle.path, out)  # a previous good bundle (llvm) at --out
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    code = main(["compile", str(TINY_SPEC), "--target", "npu", "--profile", "rknpu2", "--seq-len", "32",
                 "--vendor-build", "require", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    assert "rknn build: the rknn toolchain is not installed" in err and "npu_toolchain.sh rknn" in err
    load_bundle(out)  # still a whole, verified bundle: the very files it held
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


# --- the full matrix (-m rknn_full) -------------------------------------------------------

def _table():
    from conftest import load_script
    return load_script("npu_rknn_table")

def _check_cell(row, *, zero_cpu=True):
    assert "cosine" in row, row
    assert row["disagreements"] == [], row["disagreements"]
    if zero_cpu:
        assert row["cpu_ops"] == 0, row["cpu"]
    assert row["cosine"] >= _table().GOAL_COSINE[row["dtype"]], row


def _graphs():
    from portable_pe.spec.graphs import GRAPHS
    return list(GRAPHS)


@needs_rknn
@pytest.mark.rknn_full
@pytest.mark.parametrize("dtype", ["int8", "fp16"])
@pytest.mark.parametrize("seq_len", [64, 128, 512])
@pytest.mark.parametrize("graph", _graphs())
def test_every_shipped_graph_through_rknn(graph, seq_len, dtype):
    _check_cell(_table().cell(graph, seq_len=seq_len, dtype=dtype, soc="rk3588"))


@needs_rknn
@pytest.mark.rknn_full
@pytest.mark.parametrize("dtype", ["int8", "fp16"])
@pytest.mark.parametrize("name", ["hf_bert", "hf_roformer"])
def test_hugging_face_encoders_through_rknn(tmp_path_factory, name, dtype):
    from conftest import load_script
    path, shapes = load_script("hf_encoders").export_encoders(tmp_path_factory.mktemp("hf"), size="small", seq_len=128)[name]
    _check_cell(_table().cell(str(path), seq_len=128, dtype=dtype, soc="rk3588", shapes=shapes))


@needs_rknn
@pytest.mark.rknn_full
@pytest.mark.parametrize("soc", ["rk3576", "rk3568"])
def test_other_socs_agree_with_their_profile(soc):
    """rk3568's compiler runs Softmax on the CPU: the profile says so, and RKNN agrees."""
    row = _table().cell("rope", seq_len=64, dtype="int8", soc=soc)
    _check_cell(row, zero_cpu=soc != "rk3568")


@needs_rknn
@pytest.mark.rknn
def test_the_guides_rknn_column_is_the_vendor_build_and_names_a_refusal(tmp_path):
    """`portable-pe guide --targets npu-rknn`: each cell is RKNN's own build and simulator
    run; a length past a learned table is a cell that says why, not a lost column."""
    from portable_pe.spec.graphs import load_graph
    from portable_pe.guide.npu import run_vendor
    from portable_pe.npu.report import NpuJob
    data = Path(__file__).parent / "data" / "guide"
    jobs = [NpuJob(load_graph(str(data / "tiny_rope.toml")), 16), NpuJob(load_graph(str(data / "tiny_learned.toml")), 64)]
    result = run_vendor("rknn", jobs, work_dir=tmp_path, log=lambda m: None)
    rope, learned = result["reports"]["rknn-rk3588"]
    assert result["ran"] and rope["ok"], rope["error"]
    assert rope["ops_cpu"] == 0 and rope["ops_npu"] > 0 and rope["size_bytes"] > 0
    assert rope["accuracy"]["cosine"] >= TOLERANCES["int8"]["min_cosine"] and "simulator" in rope["accuracy"]["source"]
    assert rope["time_ms"] is None  # RKNN gives no time without a board: nothing is made up
    assert not learned["ok"] and "max length 32" in learned["error"]
