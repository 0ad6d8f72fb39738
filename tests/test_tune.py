"""Tuning databases: specialized entries, dispatch, coverage, and the committed databases."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import TINY_SPEC, fake_tuning_database
from portable_pe.spec.graphs import GRAPHS
from portable_pe.run.parity import check_bundle, dim_roles, make_inputs
from portable_pe.run.local import entry_for
from portable_pe.tune.autotune import is_rope_kernel
from portable_pe.tune.database import database_dir, tuned_points

pytestmark = pytest.mark.integration  # run by scripts/test.sh after the default run (pyproject.toml)


def test_rope_kernels_are_found_only_in_rope_graphs():
    from portable_pe.compile.pipeline import prepare
    from portable_pe.tune.database import as_main, fused_prim_funcs, specialize, specialized_name
    found = {}
    point = {"batch": 1, "seq": 32}
    for graph in ("rope", "alibi"):
        st = prepare(graph, log=lambda m: None)
        static = as_main(specialize(st.relax, dims=st.io["dims"], point=point), specialized_name(point))
        found[graph] = [n for n in fused_prim_funcs(static, st.tvm_target) if is_rope_kernel(n)]
    assert found["rope"] and not found["alibi"], found


def test_entry_dispatch_matches_exact_points():
    manifest = {"inputs": [{"name": "x", "dims": ["batch", "seq", 8]}, {"name": "positions", "dims": ["seq"]}],
                "dims": {"batch": {"role": "batch"}, "seq": {"role": "seq"}},
                "tuning": {"specializations": [{"function": "main_b1_t128", "batch": 1, "seq": 128}]}}
    def inputs(b, t):
        return {"x": np.zeros((b, t, 8)), "positions": np.zeros(t)}
    assert entry_for(manifest, inputs(1, 128)) == "main_b1_t128"
    assert entry_for(manifest, inputs(2, 128)) == "main"
    assert entry_for(manifest, inputs(1, 127)) == "main"


def test_committed_databases_are_applied_by_compile(bundle_factory):
    """Every committed database was rechecked on its target, entry included, and compile
    follows each verdict: a tuned entry that beat the dynamic main is added with the
    database's kept kernels, one that did not is left out with both timings. Parity holds at
    the tuned point on whichever entry runs it, and elsewhere on main."""
    from portable_pe.tune.judge import entry_verdict
    committed = [g for g in GRAPHS if tuned_points(database_dir("llvm", g))]
    assert "rope" in committed, "the default graph ships with a tuning database"
    unjudged = [(g, p["batch"], p["seq"]) for g in committed for p in tuned_points(database_dir("llvm", g))
                if entry_verdict(p) is None]
    assert not unjudged, f"rechecked before the entry verdict existed (portable-pe tune GRAPH --recheck): {unjudged}"
    bundle = bundle_factory("rope")
    tuning = bundle.manifest["tuning"]
    assert tuning["database"] == "targets/tuning/llvm/rope", tuning
    added = {(e["batch"], e["seq"]): e for e in tuning["specializations"]}
    left_out = {(e["batch"], e["seq"]): e for e in tuning.get("left_out", [])}
    for point in tuned_points(database_dir("llvm", "rope")):
        key, verdict = (point["batch"], point["seq"]), entry_verdict(point)
        if verdict["kept"]:
            assert key in added and added[key]["tuned_kernels"] == point["kept_kernels"], tuning
        else:
            assert key not in added and left_out[key]["main_ms"] == verdict["main_ms"], tuning
        inputs = make_inputs(bundle.manifest["inputs"], length=point["seq"], batch=point["batch"],
                             dim_roles=dim_roles(bundle.manifest))
        assert entry_for(bundle.manifest, inputs) == (added[key]["function"] if key in added else "main")
        report = check_bundle(bundle, lengths=(7, point["seq"]), batch=point["batch"])
        assert report.ok, report.to_markdown()


@pytest.mark.parametrize("kept", [True, False])
def test_a_tuned_entry_is_added_only_where_it_beat_main(tmp_path, monkeypatch, kept):
    """The recheck's verdict on the entry decides: kept, the bundle has main_b1_t8 and the
    point's inputs run it; not kept, the log and the manifest say why it was left out and
    the point runs main."""
    from portable_pe.compile.pipeline import compile_graph
    monkeypatch.setenv("PORTABLE_PE_TUNING_DIR", str(tmp_path / "db"))
    point = {"batch": 1, "seq": 8}
    verdict = {"function": "main_b1_t8", "tuned_ms": 0.5 if kept else 0.7, "main_ms": 0.6, "kept": kept}
    fake_tuning_database(tmp_path / "db", "tiny_rope", point, verdict)
    lines = []
    bundle = compile_graph(str(TINY_SPEC), out=tmp_path / "b", log=lines.append)
    log, tuning = "\n".join(lines), bundle.manifest["tuning"]
    inputs = make_inputs(bundle.manifest["inputs"], length=8, batch=1, dim_roles=dim_roles(bundle.manifest))
    if kept:
        assert [e["function"] for e in tuning["specializations"]] == ["main_b1_t8"], tuning
        assert "left_out" not in tuning and "main_b1_t8: 0 tuned kernel(s)" in log, log
        assert entry_for(bundle.manifest, inputs) == "main_b1_t8"
    else:
        assert tuning["specializations"] == [] and tuning["left_out"] == [{**point, **verdict}], tuning
        assert ("main_b1_t8 left out: the dynamic main ran batch=1 seq=8 in 0.600 ms, "
                "the tuned entry in 0.700 ms (tune --recheck)") in log, log
        assert entry_for(bundle.manifest, inputs) == "main"
    assert check_bundle(bundle, lengths=(5, 8)).ok


def test_no_tuning_builds_without_the_database(tmp_path):
    """tuning=False (`--no-tuning`): the compile log says the database is not used and names
    none of its kernels, the manifest records no database and no tuned entry, the tuned
    point's inputs run the dynamic main, and that build still matches PyTorch there."""
    from portable_pe.compile.pipeline import compile_graph
    from portable_pe.tune.database import specialized_name
    db_dir = database_dir("llvm", "rope")
    (point,) = tuned_points(db_dir)  # the database exists: it is there to be ignored
    lines = []
    bundle = compile_graph("rope", out=tmp_path / "untuned", tuning=False, log=lines.append)
    log = "\n".join(lines)
    assert "tuning database: not used (--no-tuning)" in log, log
    # a tuned build logs "main_b1_t128: N tuned kernel(s), M miss(es)" for each tuned entry
    assert specialized_name(point) not in log and "tuned kernel" not in log and "targets/tuning" not in log, log
    assert bundle.manifest["tuning"] == {"database": None}
    inputs = make_inputs(bundle.manifest["inputs"], length=point["seq"], batch=point["batch"],
                         dim_roles=dim_roles(bundle.manifest))
    assert entry_for(bundle.manifest, inputs) == "main"
    report = check_bundle(bundle, lengths=(7, point["seq"]), batch=point["batch"])
    assert {(r.candidate, r.length) for r in report.rows} == {(c, n) for c in ("onnxruntime", "tvm")
                                                              for n in (7, point["seq"])}
    assert report.ok, report.to_markdown()


@pytest.mark.slow
def test_tune_then_compile_uses_every_tuned_kernel(tmp_path, monkeypatch):
    from portable_pe.compile.pipeline import compile_graph
    from portable_pe.tune.autotune import tune_graph
    monkeypatch.setenv("PORTABLE_PE_TUNING_DIR", str(tmp_path / "db"))
    result = tune_graph(str(TINY_SPEC), seq=8, trials=2, only="rope", log=lambda m: None)
    assert result.tasks > 0 and (result.db_dir / "database_tuning_record.json").stat().st_size > 0
    bundle = compile_graph(str(TINY_SPEC), out=tmp_path / "b", log=lambda m: None)
    (point,) = tuned_points(result.db_dir)
    # tuning ends with the recheck: every tuned kernel was judged, the winners stay, and the
    # entry holding them was timed against main, which decides whether compile adds it
    assert len([v for v in point["kernels"] if v["tuned_ms"] is not None]) == result.tasks
    entries = bundle.manifest["tuning"]["specializations"]
    if point["entry"]["kept"]:
        assert [(e["function"], e["tuned_kernels"]) for e in entries] == [("main_b1_t8", point["kept_kernels"])]
    else:
        assert entries == [] and bundle.manifest["tuning"]["left_out"][0]["function"] == "main_b1_t8"
    assert check_bundle(bundle, lengths=(5, 8)).ok


def test_recheck_keeps_exactly_the_kernels_that_beat_the_default(tmp_path, monkeypatch):
    """On a copy of the committed rope database: after the recheck, the database holds a
    schedule for a kernel if and only if its verdict says the tuned one was faster."""
    import shutil
    from portable_pe.compile.pipeline import prepare
    from portable_pe.tune.autotune import recheck
    from portable_pe.tune.database import as_main, coverage, open_database, specialize, specialized_name
    from portable_pe.tune.judge import KEEP_MARGIN
    shutil.copytree(database_dir("llvm", "rope"), tmp_path / "llvm" / "rope")
    monkeypatch.setenv("PORTABLE_PE_TUNING_DIR", str(tmp_path))
    (saved,) = tuned_points(tmp_path / "llvm" / "rope")
    point = {"batch": saved["batch"], "seq": saved["seq"]}
    st = prepare("rope", log=lambda m: None)
    static = as_main(specialize(st.relax, dims=st.io["dims"], point=point), specialized_name(point))
    before, _ = coverage(static, st.tvm_target, open_database(tmp_path / "llvm" / "rope"))
    verdicts = recheck(st, point, runs=5, log=lambda m: None)
    after, _ = coverage(static, st.tvm_target, open_database(tmp_path / "llvm" / "rope"))
    assert {v["kernel"] for v in verdicts if v["tuned_ms"] is not None} == set(before)
    assert set(after) == {v["kernel"] for v in verdicts if v["kept"]}
    assert all(v["tuned_ms"] < v["default_ms"] * (1 - KEEP_MARGIN) for v in verdicts if v["kept"])
    (resaved,) = tuned_points(tmp_path / "llvm" / "rope")
    assert resaved["kernels"] == verdicts and resaved["kept_kernels"] == len(after)
    # and the entry with those kernels against the dynamic main, same margin
    whole = resaved["entry"]
    assert whole["function"] == specialized_name(point) and whole["tuned_ms"] > 0 and whole["main_ms"] > 0
    assert whole["kept"] == (whole["tuned_ms"] < whole["main_ms"] * (1 - KEEP_MARGIN)), whole


def test_tune_refuses_what_it_cannot_do():
    from test_cli import cli
    proc = cli("tune", "alibi", "--only", "rope", check_rc=2)
    assert "graph alibi has no RoPE kernels to tune" in proc.stderr
    proc = cli("tune", "learned", "--lengths", "600", check_rc=2)
    assert "cannot tune learned at batch=1 seq=600: seq (seq) allows 1..512" in proc.stderr
    proc = cli("tune", "rope", "--rpc-tracker", "localhost", check_rc=2)
    assert "--rpc-tracker must be HOST:PORT (e.g. 127.0.0.1:9190, or [::1]:9190 for IPv6), got 'localhost'" in proc.stderr
    proc = cli("tune", "rope", "--recheck", "--target", "arm", check_rc=2)
    assert "--recheck runs both builds on this machine, so it needs --target llvm, not arm" in proc.stderr
