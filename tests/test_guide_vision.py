"""`portable-pe guide --vision`: a tiny run writes the report from its JSON, refuses what a
bundle refuses in the runtime's words, and the claim's verdict follows its rule. What the
numbers are is measured, never asserted here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from portable_pe.guide.report import fmt_ms, fmt_pct
from portable_pe.guide.vision import LITTLE, render, resolve, run_vision_guide, verdict

DATA = Path(__file__).parent / "data"
GRAPHS = [str(DATA / "guide" / "tiny_vit_none.toml"), str(DATA / "vision" / "tiny_vit_rope_2d.toml"),
          str(DATA / "guide" / "tiny_video_none.toml"), str(DATA / "vision" / "tiny_video_mrope.toml")]
SIZES = ("24x48", "32x32", "32x30")  # the last not whole 8-pixel patches: refused
VIDEO_SIZES = ("4x24x32", "6x16x16")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("guide_vision")
    return out, run_vision_guide(graphs=GRAPHS, sizes=SIZES, video_sizes=VIDEO_SIZES, batches=(1,), out=out, repeat=2,
                                 log=lambda m: None)


def test_the_report_is_the_jsons_and_names_a_refusal_in_the_runtimes_words(tiny_run):
    out, result = tiny_run
    assert json.loads((out / "guide_vision.json").read_text()) == result
    md = (out / "guide_vision.md").read_text()
    assert md == render(json.loads((out / "guide_vision.json").read_text()))
    cells = {(r["graph"], r["size"]): r for r in result["llvm"]["latency"]}
    assert set(cells) == {(g, s) for g in ("tiny_vit_none", "tiny_vit_rope_2d") for s in SIZES}
    for graph in ("tiny_vit_none", "tiny_vit_rope_2d"):
        odd = cells[(graph, "32x30")]
        assert not odd["ok"] and "multiple of the patch size 8" in odd["error"] and odd["error"] in md
    for (graph, size), r in cells.items():
        if r["ok"]:
            row = next(line for line in md.splitlines() if line.startswith(f"| {graph} ("))
            assert fmt_ms(r["median_ms"]) in row
    profiled = {(p["graph"], p["size"]) for p in result["llvm"]["profile"]}
    assert profiled == {(g, s) for g in ("tiny_vit_none", "tiny_vit_rope_2d") for s in SIZES[:2]}
    rope = next(p for p in result["llvm"]["profile"] if p["graph"] == "tiny_vit_rope_2d" and p["size"] == "24x48")
    assert rope["added"], "2D RoPE's tables and rotation are kernels the baseline lacks"
    assert f"{fmt_ms(rope['position_ms'])} ({fmt_pct(rope['position_share'])})" in md
    parity = {p["graph"]: p for p in result["llvm"]["parity"]}
    assert parity["tiny_vit_rope_2d"]["ok"] and set(parity["tiny_vit_rope_2d"]["sizes"]) == set(SIZES[:2])  # the sizes it takes
    assert result["claim"]["verdict"] in ("holds", "partly holds", "does not hold") and result["claim"]["claim"] in md


def test_the_video_graph_is_timed_and_checked_against_its_own_no_position_twin(tiny_run):
    """3D M-RoPE against a video ViT without positions, at frames x H x W sizes, from one
    build each; its measured cost is part of the claim's row."""
    out, result = tiny_run
    video = result["video"]
    assert video["baseline"] == "tiny_video_none" and [g["name"] for g in video["graphs"]] == ["tiny_video_none",
                                                                                                 "tiny_video_mrope"]
    cells = {(r["graph"], r["size"]): r for r in video["llvm"]["latency"]}
    assert set(cells) == {(g, s) for g in ("tiny_video_none", "tiny_video_mrope") for s in VIDEO_SIZES}
    assert all(r["ok"] for r in cells.values()), cells
    md = (out / "guide_vision.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| tiny_video_mrope ("))
    mrope, none = cells[("tiny_video_mrope", "4x24x32")], cells[("tiny_video_none", "4x24x32")]
    assert f"{fmt_ms(mrope['median_ms'])} ({fmt_pct(mrope['median_ms'] / none['median_ms'] - 1)})" in row
    profile = {p["graph"]: p for p in video["llvm"]["profile"] if p["size"] == "4x24x32"}
    assert profile["tiny_video_mrope"]["added"], "M-RoPE's tables and rotation are kernels the baseline lacks"
    parity = {p["graph"]: p for p in video["llvm"]["parity"]}
    assert parity["tiny_video_mrope"]["ok"] and set(parity["tiny_video_mrope"]["sizes"]) == set(VIDEO_SIZES)
    assert result["claim"]["measured"]["tiny_video_mrope"].endswith("vs no positions")


def _result(latencies: dict, parity_ok: bool = True) -> dict:
    """A result holding only what verdict() reads: {graph: [ms per size]} at batch 1."""
    sizes = ["224x224", "384x384"]
    return {"baseline": "vit_none", "settings": {"sizes": sizes, "batches": [1]},
            "graphs": [{"name": g, "encoding": "none" if g == "vit_none" else "rope_2d"} for g in latencies],
            "llvm": {"latency": [{"graph": g, "batch": 1, "size": s, "ok": ms is not None, "median_ms": ms}
                                 for g, row in latencies.items() for s, ms in zip(sizes, row)],
                     "parity": [{"graph": g, "ok": parity_ok} for g in latencies]}}


def test_the_verdict_follows_its_rule():
    cheap = 1 + LITTLE / 2
    assert verdict(_result({"vit_none": [10, 30], "vit_a": [10 * cheap, 30]}))["verdict"] == "holds"
    assert verdict(_result({"vit_none": [10, 30], "vit_a": [10, 30 * (1 + 2 * LITTLE)]}))["verdict"] == "partly holds"
    assert verdict(_result({"vit_none": [10, 30], "vit_a": [10, None]}))["verdict"] == "does not hold"
    assert verdict(_result({"vit_none": [10, 30], "vit_a": [10, 30]}, parity_ok=False))["verdict"] == "does not hold"
    assert verdict(_result({"vit_none": [10, 30]}))["verdict"] == "not measured"


def test_text_graphs_are_refused_and_each_kind_gets_its_baseline():
    with pytest.raises(ValueError, match="not a vision graph"):
        resolve([str(DATA / "tiny_rope.toml")])
    video = str(DATA / "vision" / "tiny_video_mrope.toml")
    assert resolve([video]) == ({}, None)  # no image graph given
    sources, baseline = resolve([str(DATA / "vision" / "tiny_vit_rope_2d.toml"), video])
    assert baseline == "vit_none" and list(sources) == ["vit_none", "tiny_vit_rope_2d"]
    sources, baseline = resolve([video], video=True)
    assert baseline == "video_none" and list(sources) == ["video_none", "tiny_video_mrope"]


def _npu_result(rows: dict) -> dict:
    """A result holding only what vision_npu.verdict() reads: {graph: [(ok, cpu_ops, cosine, ms) per size]}."""
    from portable_pe.guide.vision_npu import ACCELERATORS
    sizes = ["112x112", "224x224"]
    return {"baseline": "vit_none",
            "graphs": [{"name": g, "encoding": "none" if g == "vit_none" else "rope_2d"} for g in rows],
            "npu_ethos_u": {"ran": True, "rows": [
                {"graph": g, "size": s, "accelerator": a, "ok": ok, "cpu_ops": cpu, "cosine": cos, "estimate_ms": ms}
                for g, cells in rows.items() for s, (ok, cpu, cos, ms) in zip(sizes, cells) for a in ACCELERATORS]}}


def test_the_npu_verdict_follows_its_rule():
    from portable_pe.guide.vision_npu import MIN_COSINE, verdict as npu_verdict
    none = [(True, 0, 0.999, 10.0), (True, 0, 0.999, 40.0)]
    cheap, dear = 1 + LITTLE / 2, 1 + 2 * LITTLE
    rule = dict(little=LITTLE, windowed="window_rel_bias_2d")
    assert npu_verdict(_npu_result({"vit_none": none, "vit_a": [(True, 0, 0.999, 10 * cheap), (True, 0, 0.999, 40)]}),
                       **rule)["verdict"] == "holds"
    assert npu_verdict(_npu_result({"vit_none": none, "vit_a": [(True, 0, 0.999, 10), (True, 0, 0.999, 40 * dear)]}),
                       **rule)["verdict"] == "partly holds"
    on_cpu = npu_verdict(_npu_result({"vit_none": none, "vit_a": [(True, 2, 0.999, 10), (True, 0, 0.999, 40)]}), **rule)
    assert on_cpu["verdict"] == "does not hold" and "2 op(s) on the CPU" in on_cpu["measured"]["missed"]
    low = npu_verdict(_npu_result({"vit_none": none, "vit_a": [(True, 0, MIN_COSINE / 2, 10), (True, 0, 0.999, 40)]}), **rule)
    assert low["verdict"] == "does not hold"
    assert npu_verdict(_npu_result({"vit_none": none, "vit_a": [(False, None, None, None), none[1]]}),
                       **rule)["verdict"] == "does not hold"
    assert npu_verdict(_npu_result({"vit_none": none}), **rule)["verdict"] == "not measured"
    # the video graphs count too, against their own twin
    fine = _npu_result({"vit_none": none, "vit_a": none})
    video = _npu_result({"video_none": none, "video_b": [(True, 0, 0.999, 10.0), (True, 3, 0.999, 40.0)]})
    both = npu_verdict({**fine, "video": {"baseline": "video_none", "graphs": video["graphs"],
                                          "npu_ethos_u": video["npu_ethos_u"]}}, **rule)
    assert both["verdict"] == "does not hold" and "video_b 224x224" in both["measured"]["missed"]


def test_vision_targets_other_than_llvm_and_ethos_u_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"--targets npu-rknn: expected a comma-separated subset of llvm, npu-ethos-u"):
        run_vision_guide(graphs=GRAPHS, targets=("npu-rknn",), out=tmp_path, log=lambda m: None)


@pytest.mark.integration
def test_the_ethos_u_part_is_velas_build_per_size_and_prices_positions_against_no_positions(tmp_path):
    """Vela's own build of each tiny graph at two NPU sizes (a third not whole patches:
    refused in compile's words), the video graphs against their own twin at a video size;
    the report is the JSON's, and the position cost is the difference of Vela's two
    estimates."""
    from portable_pe.npu.toolchain import toolchain_python
    if toolchain_python("ethos-u") is None:
        pytest.skip("Vela's toolchain is not installed: bash scripts/npu_toolchain.sh ethos-u")
    sizes = ("24x32", "32x32", "30x32")
    result = run_vision_guide(graphs=GRAPHS, targets=("npu-ethos-u",), npu_sizes=sizes, video_npu_sizes=("4x24x32",),
                              out=tmp_path, log=lambda m: None)
    assert "llvm" not in result and "claim" not in result and "llvm" not in result["video"]
    md = (tmp_path / "guide_vision.md").read_text()
    assert md == render(json.loads((tmp_path / "guide_vision.json").read_text()))
    rows = {(r["graph"], r["size"], r["accelerator"]): r for r in result["npu_ethos_u"]["rows"]}
    assert {(g, s) for g, s, _ in rows} == {(g, s) for g in ("tiny_vit_none", "tiny_vit_rope_2d") for s in sizes}
    for accelerator in ("ethos-u85", "ethos-u55"):
        odd = rows[("tiny_vit_rope_2d", "30x32", accelerator)]
        assert not odd["ok"] and "not a multiple of the patch size 8" in odd["error"]
        for size in sizes[:2]:
            mine, none = rows[("tiny_vit_rope_2d", size, accelerator)], rows[("tiny_vit_none", size, accelerator)]
            assert mine["ok"] and none["ok"], (mine, none)
            assert mine["position_ms"] == pytest.approx(mine["estimate_ms"] - none["estimate_ms"])
            assert f"({mine['position_ms']:+.2f})" in md
    video = {(r["graph"], r["accelerator"]): r for r in result["video"]["npu_ethos_u"]["rows"]}
    assert {(g, r["size"]) for (g, _), r in video.items()} == {(g, "4x24x32") for g in ("tiny_video_none",
                                                                                         "tiny_video_mrope")}
    for accelerator in ("ethos-u85", "ethos-u55"):
        mine, none = video[("tiny_video_mrope", accelerator)], video[("tiny_video_none", accelerator)]
        assert mine["ok"] and none["ok"], (mine, none)
        assert mine["position_ms"] == pytest.approx(mine["estimate_ms"] - none["estimate_ms"])
        assert f"### video (frames x H x W), {accelerator}" in md and f"({mine['position_ms']:+.2f})" in md
    assert "tiny_video_mrope" in result["npu_claim"]["measured"] or "tiny_video_mrope" in \
        result["npu_claim"]["measured"].get("missed", "")
    assert result["npu_claim"]["verdict"] in ("holds", "partly holds", "does not hold")


@pytest.mark.parametrize("name", ["guide_vision", "guide_vision_ethos_u"])
def test_the_committed_vision_reports_are_their_json_rendered_by_the_current_renderer(name):
    """scripts/results/guide/*.md are rendered from the JSON beside them only: a change to
    the renderer re-renders them (the figures stay those of the run in the JSON)."""
    results = Path(__file__).resolve().parent.parent / "scripts" / "results" / "guide"
    assert (results / f"{name}.md").read_text() == render(json.loads((results / f"{name}.json").read_text()))
