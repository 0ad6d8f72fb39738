"""`portable-pe guide`: a tiny run writes the report, and the report's numbers are the run's
(guide.json). What the numbers are is measured, never asserted here."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from portable_pe.guide import GUIDE_TARGETS, render_from, resolve_graphs, run_guide
from portable_pe.guide.claims import CLAIMS, evaluate
from portable_pe.guide.npu import run_vendor
from portable_pe.npu.report import REPORT_KEYS, NpuJob, npu_report
from portable_pe.npu.vendors import VENDORS, Vendor
from portable_pe.guide.report import fmt_ms, fmt_pct, render
from portable_pe.spec.graphs import load_graph

ROOT = Path(__file__).resolve().parent.parent
TINY = Path(__file__).parent / "data" / "guide"
GRAPHS = [str(TINY / f"tiny_{n}.toml") for n in ("none", "rope", "learned")]  # learned: a 32-row table


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("guide")
    result = run_guide(graphs=GRAPHS, targets=("llvm",), lengths=(16, 48), batches=(1,), out=out, repeat=2,
                       log=lambda m: None)
    return out, result


def _row(markdown: str, section: str, first_cell: str) -> str:
    body = markdown.split(section, 1)[1]
    return next(line for line in body.splitlines() if line.startswith(f"| {first_cell} |"))


def test_tiny_run_writes_the_report_plots_and_json(tiny_run):
    out, result = tiny_run
    assert json.loads((out / "guide.json").read_text()) == json.loads(json.dumps(result, default=str))
    md = (out / "guide.md").read_text()
    assert (out / "guide-llvm.png").stat().st_size > 0 and "](guide-llvm.png)" in md
    assert [c["key"] for c in result["claims"]] == list(CLAIMS)
    for claim in result["claims"]:
        assert claim["claim"] in md and claim["verdict"] in ("holds", "partly holds", "does not hold", "not measured")


def test_latency_memory_and_profile_cells_are_the_jsons(tiny_run):
    out, result = tiny_run
    md = (out / "guide.md").read_text()
    llvm = result["llvm"]
    assert {(r["graph"], r["seq"]) for r in llvm["latency"]} == {(g, n) for g in ("tiny_none", "tiny_rope", "tiny_learned")
                                                                   for n in (16, 48)}
    for r in llvm["latency"]:
        row = _row(md, "## llvm (this CPU): latency", r["graph"])
        cell = row.split("|")[2 + (16, 48).index(r["seq"])]
        if r["ok"]:
            assert cell.strip().startswith(fmt_ms(r["median_ms"])), (row, r)
        else:  # the learned table has 32 rows: its bundle refuses 48 tokens, in the runtime's words
            assert r["graph"] == "tiny_learned" and r["seq"] == 48 and "32 rows" in r["error"]
            assert cell.strip() == "refused" and r["error"] in md
    for p in llvm["profile"]:
        if p["graph"] != "tiny_none":
            row = _row(md, "## llvm: the position work alone", p["graph"])
            assert f"{fmt_ms(p['position_ms'])} ({fmt_pct(p['position_share'])})" in row
    rope = next(p for p in llvm["profile"] if p["graph"] == "tiny_rope" and p["seq"] == 16)
    assert any("sin" in name for name, _ in rope["added"]), "RoPE's tables are kernels the baseline lacks"


def test_report_is_rendered_from_the_json_alone(tiny_run, tmp_path):
    out, result = tiny_run
    edited = json.loads((out / "guide.json").read_text())
    cell = next(r for r in edited["llvm"]["latency"] if r["graph"] == "tiny_rope" and r["seq"] == 48)
    cell["median_ms"] = 987.654
    (tmp_path / "guide.json").write_text(json.dumps(edited))
    md = render_from(tmp_path / "guide.json").read_text()
    assert "988" in _row(md, "## llvm (this CPU): latency", "tiny_rope")
    edited["claims"] = evaluate(edited)  # verdicts are derived from the numbers again
    assert md == render(edited, plots={"llvm": "guide-llvm.png"})
    rope_long = next(c for c in edited["claims"] if c["key"] == "rope_long")
    over = 987.654 / next(r["median_ms"] for r in edited["llvm"]["latency"]
                          if r["graph"] == "tiny_none" and r["seq"] == 48) - 1
    assert f"B=1 T=48 {fmt_pct(over)} vs none" in rope_long["measured"]["llvm"]


def test_length_section_compares_beyond_the_example_and_names_the_refusal(tiny_run):
    _, result = tiny_run
    rows = {r["graph"]: r for r in result["lengths"]}
    rope, learned = rows["tiny_rope"], rows["tiny_learned"]
    assert [c["seq"] for c in rope["checks"]] == [32, 64] and all(c["ok"] for c in rope["checks"])
    assert learned["table_limit"] == 32 and learned["checks"][1]["seq"] == 64 and "refused" in learned["checks"][1]
    assert "is 33" in learned["beyond"]["refused"] and "1..32" in learned["beyond"]["refused"]
    assert rope["beyond"]["seq"] == 1025 and "1..1024" in rope["beyond"]["refused"]


def test_int8_tables_are_built_for_the_encoder_that_stores_one(tiny_run):
    _, result = tiny_run
    builds = result["tables"]["builds"]
    assert [b["graph"] for b in builds] == ["tiny_learned"]  # rope computes its tables at run time
    assert builds[0]["model_onnx_bytes"]["int8"] < builds[0]["model_onnx_bytes"]["fp32"]


def test_graphs_of_different_models_are_refused():
    with pytest.raises(ValueError, match="one model"):
        resolve_graphs([str(TINY / "tiny_rope.toml"), "rope"])
    sources, specs, baseline = resolve_graphs(["rope", "alibi"])  # the shipped baseline is added
    assert baseline == "none" and list(sources) == ["none", "rope", "alibi"]


def test_cli_choices_come_from_the_registries():
    assert list(GUIDE_TARGETS) == ["llvm", *(f"npu-{v}" for v in VENDORS)]
    proc = subprocess.run([sys.executable, "-m", "portable_pe", "guide", "--targets", "llvm,npu-nope"],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2 and f"valid: {', '.join(GUIDE_TARGETS)}" in proc.stderr and "npu-rknn" in proc.stderr
    for vendor in VENDORS.values():
        assert (ROOT / "scripts" / "toolchains" / f"{vendor.name}.sh").is_file()


# ----------------------------------------------------------------------------- NPU columns
def _fake_vendor(monkeypatch, times: dict[str, float], keys_ok: bool = True):
    """A vendor "fake" in the registry whose module (in sys.modules) fills column "c"."""
    import types
    from portable_pe.npu.vendor_hooks import VendorHooks

    def guide(jobs, *, columns, work_dir, log, prepare):
        rows = [npu_report(column="c", job=j, ok=True, time_ms=times[j.spec.name] * j.seq_len, ops_npu=3, ops_cpu=0)
                for j in jobs]
        if not keys_ok:
            rows[0]["extra"] = 1
        return {"c": rows}
    module = types.ModuleType("fake_vendor")
    module.HOOKS = VendorHooks(prefix="fake/", build=None, guide=guide, describe=str)
    monkeypatch.setitem(sys.modules, "fake_vendor", module)
    monkeypatch.setitem(VENDORS, "fake", Vendor("fake", "a fake vendor", ("c",), "fake_vendor"))


def test_npu_column_contract_and_position_work(monkeypatch, tmp_path):
    from portable_pe.guide import _add_position_work
    from portable_pe.npu import toolchain
    monkeypatch.setattr(toolchain, "toolchain_python", lambda name: Path(sys.executable))
    specs = [load_graph(str(TINY / f"tiny_{n}.toml")) for n in ("none", "rope")]
    jobs = [NpuJob(s, n) for s in specs for n in (16, 32)]
    _fake_vendor(monkeypatch, {"tiny_none": 1.0, "tiny_rope": 1.25})
    got = run_vendor("fake", jobs, work_dir=tmp_path, log=lambda m: None)
    assert got["ran"] and all(set(r) == set(REPORT_KEYS) for r in got["reports"]["c"])
    _add_position_work(got, "tiny_none")
    rope32 = next(r for r in got["reports"]["c"] if r["graph"] == "tiny_rope" and r["seq_len"] == 32)
    assert rope32["position_ms"] == pytest.approx(1.25 * 32 - 32) and rope32["position_share"] == pytest.approx(0.2)
    _fake_vendor(monkeypatch, {"tiny_none": 1.0, "tiny_rope": 1.0}, keys_ok=False)
    with pytest.raises(RuntimeError, match="npu_report"):
        run_vendor("fake", jobs, work_dir=tmp_path, log=lambda m: None)


def test_a_missing_toolchain_is_a_not_run_section_with_the_setup_command(monkeypatch, tmp_path, tiny_run):
    monkeypatch.setenv("PORTABLE_PE_TOOLCHAIN_DIR", str(tmp_path / "none-here"))
    _, result = tiny_run
    jobs = [NpuJob(load_graph(str(TINY / "tiny_rope.toml")), 16)]
    got = run_vendor("ethos-u", jobs, work_dir=tmp_path, log=lambda m: None)
    assert not got["ran"] and "npu_toolchain.sh ethos-u" in got["error"]
    md = render({**result, "npu": {"ethos-u": got}})
    assert re.search(r"## NPU: ethos-u\n\nNot run: .*npu_toolchain\.sh ethos-u", md)
