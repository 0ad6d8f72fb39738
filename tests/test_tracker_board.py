"""Tuning on boards through a TVM RPC tracker, end to end on the emulated aarch64 board.

A tracker, two board servers registered under one key, `tune --trials 2` of the rope
graph's RoPE kernels measured on them, then a compile that applies the database and a
deploy through the tracker with parity. Marker `tracker` (deselected by default; .ci/run
runs it after the default suite with -s, so CI's log shows the tune, compile and deploy
output). Emulated timings mean nothing: the database goes to a temporary
PORTABLE_PE_TUNING_DIR, never to targets/tuning/.
"""

from __future__ import annotations

import json
import os
import re
import threading

import pytest

from conftest import require_cross

from portable_pe.cli.main import main as cli
from portable_pe.tune.database import database_dir, tuned_points

from test_deploy import board_server, free_port, stop
from test_tune_rpc import start_tvm, wait_for_boards

pytestmark = pytest.mark.tracker
BOARD, GRAPH, SEQ, TRIALS, KEY = "rasp4b64", "rope", 32, 2, "emuboard"


@pytest.fixture(scope="module")
def fleet():
    """(tracker address, the two boards' addresses), both registered under KEY."""
    if not board_server.board_available():
        pytest.skip("emulated board not set up: run `bash scripts/board_setup.sh`")
    require_cross()
    port = free_port()
    tracker = start_tvm("tvm.exec.rpc_tracker", port)
    names = [f"tracker-ci-{os.getpid()}-{i}" for i in (1, 2)]
    errors = []

    def start(name):  # both boards boot at once: each is a Python under qemu (tens of seconds)
        try:
            board_server.start_server(port=0, timeout=600, tracker=("127.0.0.1", port), key=KEY, name=name)
        except Exception as err:
            errors.append(err)
    threads = [threading.Thread(target=start, args=(name,)) for name in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        if errors:
            raise errors[0]
        yield f"127.0.0.1:{port}", wait_for_boards(f"127.0.0.1:{port}", KEY, 2)
    finally:
        for name in names:
            board_server.stop_server(name)
        stop(tracker)


def run_cli(capsys, *args) -> str:
    """The CLI in this process; its output is echoed (CI's log) and returned."""
    rc = cli([str(a) for a in args])
    out, err = capsys.readouterr()
    with capsys.disabled():
        print(f"\n$ portable-pe {' '.join(map(str, args))}\n{out}{err}", flush=True)
    assert rc == 0, f"rc {rc}: {err}"
    return out


def measured_workloads(db_dir) -> int:
    """Workloads with at least one candidate that ran (MetaSchedule writes 1e10 s for one that did not)."""
    ok = set()
    for line in (db_dir / "database_tuning_record.json").read_text().splitlines():
        workload, record = json.loads(line)
        if record[1] and max(float(s) for s in record[1]) < 1e9:
            ok.add(workload)
    return len(ok)


def test_tune_on_two_boards_then_compile_and_deploy_through_the_tracker(fleet, tmp_path, monkeypatch, capsys):
    tracker, boards = fleet
    monkeypatch.setenv("PORTABLE_PE_TUNING_DIR", str(tmp_path / "db"))
    out = run_cli(capsys, "tune", GRAPH, "--target", "arm", "--board", BOARD, "--only", "rope", "--trials", TRIALS,
                  "--lengths", SEQ, "--rpc-tracker", tracker, "--rpc-key", KEY)
    db_dir = database_dir("arm", GRAPH, variant=BOARD)
    (point,) = tuned_points(db_dir)
    assert point.get("complete", True) and (point["seq"], point["trials_per_task"]) == (SEQ, TRIALS), point
    assert f"tracker {tracker}: 2 board(s) under key '{KEY}'" in out
    # every candidate ran on one of the two boards, and both boards measured
    used = re.findall(r"(127\.0\.0\.1:\d+) \(\d+\)", point["measured"])
    assert set(used) == set(boards), point["measured"]
    tuned = measured_workloads(db_dir)
    assert 0 < tuned <= point["tasks"], point

    bundle = tmp_path / "rope-arm"
    out = run_cli(capsys, "compile", GRAPH, "--target", "arm", "--board", BOARD, "--out", bundle, "--lengths", f"7,{SEQ}")
    missing = point["tasks"] - tuned
    assert re.search(rf"main_b1_t{SEQ}: {tuned} tuned kernel\(s\), \d+ miss\(es\)", out), out
    manifest = json.loads((bundle / "manifest.json").read_text())
    (entry,) = manifest["tuning"]["specializations"]
    assert entry["tuned_kernels"] == tuned and entry["untuned_kernels"] >= missing, entry

    out = run_cli(capsys, "deploy", bundle, "--tracker", tracker, "--key", KEY, "--json", tmp_path / "deploy.json")
    assert f"tuned entry main_b1_t{SEQ} runs at T={SEQ}" in out and "**PASS**" in out
    rows = json.loads((tmp_path / "deploy.json").read_text())["rows"]
    assert {r["length"] for r in rows if r["candidate"] == "tvm"} >= {SEQ}
    assert all(r["ok"] for r in rows), [r for r in rows if not r["ok"]]
