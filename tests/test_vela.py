"""Arm Ethos-U through Vela (npu/vela.py and its worker). The build tests need the ethos-u
toolchain (`bash scripts/npu_toolchain.sh ethos-u`) and skip with that command when it is
missing; the refusal and the worker's per-job errors need nothing but this interpreter."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from portable_pe.spec.graphs import load_graph
from portable_pe.npu.vela import ACCELERATORS, VelaJob, build_bundle_files, compile_jobs
from portable_pe.npu.toolchain import missing_message, toolchain_python
from portable_pe.run.parity import TOLERANCES

pytestmark = pytest.mark.integration  # run by scripts/test.sh after the default run (pyproject.toml)

TINY = Path(__file__).parent / "data" / "guide"
VISION = Path(__file__).parent / "data" / "vision"
needs_toolchain = pytest.mark.skipif(toolchain_python("ethos-u") is None, reason=missing_message("ethos-u"))


def test_a_length_past_the_learned_table_is_refused_before_any_vendor_work(tmp_path):
    spec = load_graph(str(TINY / "tiny_learned.toml"))
    with pytest.raises(ValueError, match="positions 0..63 exceed its 32-position limit"):
        build_bundle_files(spec=spec, seq_len=64, work_dir=tmp_path, log=lambda m: None)
    with pytest.raises(ValueError, match="needs a graph spec"):
        build_bundle_files(spec=None, seq_len=64, work_dir=tmp_path, log=lambda m: None)


def test_a_job_that_fails_in_the_worker_carries_its_stage_and_error(tmp_path):
    """This interpreter has no litert-torch: the worker runs, each job fails in its own words."""
    jobs = [VelaJob(load_graph(str(TINY / "tiny_rope.toml")), 16), VelaJob(load_graph(str(TINY / "tiny_learned.toml")), 64)]
    rope, learned = compile_jobs(jobs, accelerators=["ethos-u85"], work_dir=tmp_path, workers=1,
                                 log=lambda m: None, python=Path(sys.executable))
    assert rope["ok"] is False and rope["stage"] == "convert" and "litert_torch" in rope["error"]
    assert rope["export"]["program_bytes"] > 0
    assert learned["stage"] == "export" and "32-position limit" in learned["error"]


def test_every_vela_profile_has_an_accelerator():
    from portable_pe.npu.profiles import PROFILES, load_profile
    vela = {name: load_profile(name) for name in PROFILES if load_profile(name).vendor == "ethos-u"}
    assert set(vela) == {p for p in PROFILES if p.startswith("ethos-u")}
    assert all(profile.accelerator in ACCELERATORS for profile in vela.values())


@needs_toolchain
def test_tiny_encoder_builds_for_ethos_u85_with_every_operator_on_the_npu(tmp_path):
    spec = load_graph(str(TINY / "tiny_rope.toml"))
    files, report = build_bundle_files(spec=spec, seq_len=16, accelerator="ethos-u85", work_dir=tmp_path,
                                       log=lambda m: None)
    assert report["cpu_ops"] == 0 and report["npu_ops"] > 0, report["cpu_fallbacks"]
    assert report["accuracy_int8"]["cosine"] >= TOLERANCES["int8"]["min_cosine"]
    # Vela's command stream sits in the TFLite model as an `ethos-u` custom operator
    assert b"ethos-u" in files["model_vela.tflite"] and b"ethos-u" not in files["model_int8.tflite"]
    vela = json.loads(files["vela_report.json"])
    assert sum(layer["cycles"] for layer in vela["layers"]) > 0
    # two fields of Vela's summary agree with each other as we read them
    assert report["inference_ms"] == pytest.approx(1e3 * report["cycles_total"] / report["clock_hz"], rel=1e-6)


@needs_toolchain
def test_a_vision_graph_builds_for_ethos_u85_at_its_image_size_with_every_operator_on_the_npu(tmp_path, capsys):
    """A ViT with 2D RoPE and CLS + register tokens, pinned to 24 x 32 pixels: its grid's
    positions and RoPE tables fold into the program, its prefix tokens are padding plus a
    constant (ai-edge-quantizer cannot quantize a Concatenation with a constant operand),
    and Vela places every operator on the NPU. Measured: 243 ops, int8 cosine 0.9964."""
    from portable_pe.bundle.artifact import load_bundle
    from portable_pe.cli.main import main
    out = tmp_path / "bundle"
    args = ["compile", str(VISION / "tiny_vit_rope_2d.toml"), "--target", "npu", "--profile", "ethos-u85",
            "--image-size", "24x32", "--out", str(out)]
    assert main(args) == 0, capsys.readouterr().err
    vendor = load_bundle(out).manifest["vendor"]
    assert vendor["built"] and vendor["image"] == [24, 32] and vendor["cpu_ops"] == 0 and vendor["npu_ops"] > 0
    assert vendor["accuracy_int8"]["cosine"] >= 0.99, vendor["accuracy_int8"]  # LiteRT int8 vs PyTorch fp32
    assert vendor["cycles_total"] > 0


@needs_toolchain
def test_transformers_vit_builds_for_ethos_u85_with_its_cls_concatenation_rewritten(tmp_path):
    """transformers' own ViT class (tiny config, 32 x 32 pixels, patch 8): its CLS token is
    a concatenation with a constant after folding, which ai-edge-quantizer cannot quantize;
    written as padded parts (npu/constant_concat.py), Vela places every operator on the
    NPU and LiteRT's int8 output agrees with PyTorch's."""
    pytest.importorskip("transformers")
    from portable_pe.hf.vision import last_hidden_state_model
    from portable_pe.npu.vela import ModelJob, summarize
    job = ModelJob("hf_vit", lambda: last_hidden_state_model("vit"), (1, 3, 32, 32), 17)
    (entry,) = compile_jobs([job], accelerators=["ethos-u85"], work_dir=tmp_path, workers=1, log=lambda m: None)
    assert entry.get("ok"), entry.get("error")
    assert entry["export"]["padded_concats"] == 1
    vela = summarize(entry, "ethos-u85")
    assert vela["ok"] and vela["cpu_ops"] == 0 and vela["npu_ops"] > 0, vela.get("cpu_fallbacks")
    assert entry["accuracy"]["cosine"] >= 0.99, entry["accuracy"]


@needs_toolchain
def test_an_ethos_u85_bundle_holds_velas_build_and_can_be_recompiled_in_place(tmp_path, capsys):
    from portable_pe.bundle.artifact import load_bundle
    from portable_pe.cli.main import main
    out = tmp_path / "bundle"
    args = ["compile", str(TINY / "tiny_rope.toml"), "--target", "npu", "--profile", "ethos-u85", "--seq-len", "16",
            "--out", str(out)]
    assert main(args) == 0, capsys.readouterr().err
    bundle = load_bundle(out)
    vendor = bundle.manifest["vendor"]
    assert vendor["built"] and vendor["accelerator"] == "ethos-u85" and vendor["cpu_ops"] == 0
    # placement comes from Vela, not from our op list
    assert bundle.manifest["npu"]["coverage"]["source"].startswith("Vela")
    assert bundle.manifest["npu"]["coverage"]["nodes_npu"] == vendor["npu_ops"]
    assert b"ethos-u" in bundle.file("vela/model_vela.tflite").read_bytes()
    # a bundle with vendor subfolders is still a bundle that compile may replace
    assert main(args) == 0, capsys.readouterr().err
    assert load_bundle(out).manifest["vendor"]["built"]


def test_without_vela_the_precheck_refusal_names_the_graph_it_judged(tmp_path, monkeypatch, capsys):
    """No toolchain: the profile's check of the host ONNX graph decides, and says that it
    judged that graph (not the TFLite graph Vela would get) and how to get Vela's verdict."""
    from portable_pe.cli.main import main
    monkeypatch.setenv("PORTABLE_PE_TOOLCHAIN_DIR", str(tmp_path / "none"))
    args = ["compile", "rope_interleaved", "--target", "npu", "--profile", "ethos-u55", "--seq-len", "64",
            "--out", str(tmp_path / "b")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "of the host ONNX graph" in err and "[Gather]" in err and "npu_toolchain.sh ethos-u" in err, err
    assert not (tmp_path / "b").exists()


@needs_toolchain
# U55 with -m slow: its table's agreement with Vela runs by default in test_vela_agreement.py
@pytest.mark.parametrize("profile", [pytest.param("ethos-u55", marks=pytest.mark.slow), "ethos-u85"])
def test_where_vela_builds_its_verdict_decides_and_the_precheck_judges_the_tflite_graph(profile):
    """The issue's case: the host ONNX graph has Gathers U55's list lacks, the TFLite graph
    Vela gets has none; Vela places every operator on the NPU, and the [tflite] pre-check of
    the graph Vela got agrees with it."""
    from portable_pe.compile.pipeline import prepare
    options = {"profile": profile, "seq_len": 64, "npu_dtype": "int8", "vendor_build": "require"}
    logs = []
    st = prepare("rope_interleaved", target="npu", target_options=options, through="vendor", host_build=False,
                 log=logs.append)
    vendor = st.report["vendor"]
    assert vendor["built"] and vendor["cpu_ops"] == 0 and vendor["npu_ops"] > 0, vendor["cpu_fallbacks"]
    assert "GATHER" not in vendor["tflite_ops"]
    assert vendor["agreement"]["agree"], vendor["agreement"]["disagreements"]
    assert st.report["npu"]["profile_coverage_vendor_graph"]["nodes_host"] == 0
    assert vendor["accuracy_int8"]["cosine"] >= TOLERANCES["int8"]["min_cosine"]
    if profile == "ethos-u55":  # the ONNX check still refuses the Gathers, as a warning only
        assert any("host ONNX graph the profile refuses" in line and "[Gather]" in line for line in logs)


@needs_toolchain
def test_the_guides_ethos_u_columns_are_the_compile_pipelines_vendor_build(tmp_path):
    """`portable-pe guide --targets npu-ethos-u`: each cell is the vendor stage of the
    compile pipeline (the CLI's path); a length past a learned table is a cell that says why."""
    from portable_pe.guide.npu import run_vendor
    from portable_pe.npu.report import NpuJob
    jobs = [NpuJob(load_graph(str(TINY / "tiny_rope.toml")), 16), NpuJob(load_graph(str(TINY / "tiny_learned.toml")), 64)]
    result = run_vendor("ethos-u", jobs, work_dir=tmp_path, log=lambda m: None)
    assert result["ran"]
    for column in ("ethos-u85", "ethos-u55"):
        rope, learned = result["reports"][column]
        assert rope["ok"] and rope["ops_cpu"] == 0 and rope["ops_npu"] > 0, rope["error"]
        assert rope["time_ms"] > 0 and rope["size_bytes"] > 0 and rope["details"]["profile_disagreements"] == 0
        assert not learned["ok"] and "max length 32" in learned["error"]


def test_the_tflite_precheck_names_each_refused_operator_and_why(tmp_path):
    from dataclasses import replace
    from portable_pe.npu.profiles import load_profile
    from portable_pe.npu.tflite_check import check_tflite
    ops = [{"op": "FULLY_CONNECTED", "name": "fc", "dtypes": ["int32", "int8"], "rank": 3},
           {"op": "SIN", "name": "sin", "dtypes": ["int8"], "rank": 3},
           {"op": "EXP", "name": "exp", "dtypes": ["float32"], "rank": 3},
           {"op": "DIV", "name": "div", "dtypes": ["int8"], "rank": 3}]
    u55, u85 = (check_tflite(ops, load_profile(n)) for n in ("ethos-u55", "ethos-u85"))
    assert [v.allowed for v in u55] == [True, False, False, False]
    assert "TFLite op SIN is not in profile ethos-u55" in u55[1].why[0] and "float32" in u55[2].why[0]
    assert [v.allowed for v in u85] == [True, False, False, True]  # U85 divides, U55 does not
    with pytest.raises(ValueError, match="no \\[tflite\\] table"):
        check_tflite(ops, replace(load_profile("ethos-u55"), tflite={}))
    bad = tmp_path / "bad.toml"
    shipped = Path(__file__).parents[1] / "targets" / "npu" / "ethos-u55.toml"
    bad.write_text(shipped.read_text().replace("[tflite]\n", "[tflite]\nmax_rank = 4\n"))
    with pytest.raises(ValueError, match=r"\[tflite\] must have exactly the keys \['dtypes', 'ops'\]"):
        load_profile(bad)
