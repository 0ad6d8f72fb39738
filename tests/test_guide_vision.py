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
GRAPHS = [str(DATA / "guide" / "tiny_vit_none.toml"), str(DATA / "vision" / "tiny_vit_rope_2d.toml")]
SIZES = ("24x48", "32x32", "32x30")  # the last not whole 8-pixel patches: refused


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("guide_vision")
    return out, run_vision_guide(graphs=GRAPHS, sizes=SIZES, batches=(1,), out=out, repeat=2, log=lambda m: None)


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


def test_video_and_text_graphs_are_refused_and_the_baseline_is_added():
    with pytest.raises(ValueError, match="video graph"):
        resolve([str(DATA / "vision" / "tiny_video_mrope.toml")])
    with pytest.raises(ValueError, match="not a vision graph"):
        resolve([str(DATA / "tiny_rope.toml")])
    sources, baseline = resolve([str(DATA / "vision" / "tiny_vit_rope_2d.toml")])
    assert baseline == "vit_none" and list(sources) == ["vit_none", "tiny_vit_rope_2d"]
