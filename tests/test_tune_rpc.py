"""Tuning through a TVM RPC tracker: the runner, its errors, and per-board databases.

Without the board: a real tracker with x86 RPC servers on loopback (boards of this
machine's architecture), and fake boards that register like TVM's server and then drop
the session or never answer. The end-to-end run on the emulated aarch64 board (tune,
compile, deploy) is tests/test_tracker_board.py (marker `tracker`)."""

from __future__ import annotations

import json
import os
import socket
import struct
import threading
import time

import pytest

from portable_pe.cli.main import main as cli
from portable_pe.tune.tracker import TrackerError, boards_under
from portable_pe.tune.database import database_dir

from conftest import TINY_SPEC, load_script
from test_deploy import free_port, needs_cross, stop, wait_listening

pytestmark = pytest.mark.integration  # run by scripts/test.sh after the default run (pyproject.toml)


def start_tvm(module: str, port: int, *extra: str):
    """A TVM tracker or RPC server on loopback (a TVM import: minutes on a busy machine)."""
    import subprocess
    import sys
    proc = subprocess.Popen([sys.executable, "-m", module, "--host", "127.0.0.1", "--port", str(port),
                             "--port-end", str(port + 1), *extra], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_listening(port, proc, module, timeout=600)
    except BaseException:
        stop(proc)
        raise
    return proc


def wait_for_boards(tracker: str, key: str, count: int, timeout: float = 600) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            boards = boards_under(tracker, key, timeout=10)
            if len(boards) >= count:
                return boards
        except TrackerError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{count} board(s) under {key!r} did not register at {tracker} in {timeout} s")
        time.sleep(0.5)


class FakeBoard:
    """Registers at the tracker under `key` as TVM's RPC server does, then misbehaves when
    the granted client connects: "drop" closes the connection (a board that died; with
    `leave=True` it also leaves the tracker), "silent" accepts and never answers."""

    def __init__(self, tracker_port: int, key: str, mode: str, *, leave: bool = False):
        from tvm.rpc import base
        self.mode, self.leave, self.held = mode, leave, []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.tracker = socket.create_connection(("127.0.0.1", tracker_port), timeout=10)
        self.tracker.sendall(struct.pack("<i", base.RPC_TRACKER_MAGIC))
        base.recvall(self.tracker, 4)
        base.sendjson(self.tracker, [base.TrackerCode.UPDATE_INFO, {"key": f"server:{key}", "addr": ["127.0.0.1", self.port]}])
        assert base.recvjson(self.tracker) == base.TrackerCode.SUCCESS
        base.sendjson(self.tracker, [base.TrackerCode.PUT, key, [self.port, base.random_key(key + ":")], None])
        assert base.recvjson(self.tracker) == base.TrackerCode.SUCCESS
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _serve(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            if self.mode == "silent":
                self.held.append(conn)
                continue
            conn.close()
            if self.leave:
                self.tracker.close()

    def close(self):
        for sock in (self.listener, self.tracker, *self.held):
            sock.close()


@pytest.fixture(scope="module")
def tracker():
    port = free_port()
    proc = start_tvm("tvm.exec.rpc_tracker", port)
    yield port
    stop(proc)


@pytest.fixture(scope="module")
def x86_boards(tracker):
    """Under key 'x86': a board that drops every session, registered first (so the tracker
    grants it first), then two x86 RPC servers."""
    address = f"127.0.0.1:{tracker}"
    dead = FakeBoard(tracker, "x86", "drop")
    servers = [start_tvm("tvm.exec.rpc_server", free_port(), "--tracker", address, "--key", "x86") for _ in range(2)]
    boards = wait_for_boards(address, "x86", 3)
    yield dead.address, [b for b in boards if b != dead.address]
    dead.close()
    for server in servers:
        stop(server)


@pytest.fixture(scope="module")
def candidate(tmp_path_factory):
    """A built x86 candidate and its arguments, as MetaSchedule's builder hands them over."""
    import tvm
    from tvm import te
    from tvm.s_tir.meta_schedule.arg_info import TensorInfo
    from tvm.s_tir.meta_schedule.runner import RunnerInput
    a = te.placeholder((64, 64), name="a")
    b = te.compute((64, 64), lambda i, j: a[i, j] * 2.0, name="b")
    path = tmp_path_factory.mktemp("candidate") / "candidate.so"
    tvm.compile(tvm.IRModule({"main": te.create_prim_func([a, b])}), target="llvm").export_library(str(path))
    return RunnerInput(str(path), "cpu", [TensorInfo("float32", [64, 64])] * 2)


def runner_for(tracker_port: int, key: str, **options):
    from portable_pe.tune.rpc import board_runner
    return board_runner(tracker=f"127.0.0.1:{tracker_port}", key=key, log=lambda m: None, **options)


# ---------------------------------------------------------------- before any tuning
def test_the_board_servers_readiness_probe_speaks_the_rpc_handshake():
    """scripts/board_server.py waits for its server with TVM's handshake and a key no server
    holds, not a bare connect-and-close (which a tracker-registered TVM server takes as a
    network error: it leaves the tracker and registers again, and a client asking in
    between finds no board)."""
    from tvm.rpc import base
    board_server = load_script("board_server")
    for answer in (struct.pack("<i", base.RPC_CODE_MISMATCH), b""):
        listener = socket.create_server(("127.0.0.1", 0))
        got = {}

        def serve():
            conn, _ = listener.accept()
            with conn:
                magic, keylen = struct.unpack("<ii", base.recvall(conn, 8))
                got.update(magic=magic, key=base.recvall(conn, keylen).decode())
                conn.sendall(answer)
        worker = threading.Thread(target=serve)
        worker.start()
        answered = board_server._rpc_server_answers("127.0.0.1", listener.getsockname()[1], answer_timeout=10)
        worker.join()
        listener.close()
        assert got["magic"] == base.RPC_MAGIC and got["key"].startswith("client:")
        assert answered is bool(answer)  # no answer (the listener closed): not ready


def test_a_tracker_registered_server_answers_the_probe_and_stays_registered():
    board_server = load_script("board_server")
    tracker_port, port = free_port(), free_port()
    # a tracker of its own: the module's tracker would list this key to the tests after it
    tracker = start_tvm("tvm.exec.rpc_tracker", tracker_port)
    address = f"127.0.0.1:{tracker_port}"
    server = start_tvm("tvm.exec.rpc_server", port, "--tracker", address, "--key", "probed")
    try:
        wait_for_boards(address, "probed", 1)
        for _ in range(5):
            assert board_server._rpc_server_answers("127.0.0.1", port, answer_timeout=30)
            assert boards_under(address, "probed", timeout=10) == [f"127.0.0.1:{port}"]
    finally:
        stop(server)
        stop(tracker)


def test_tracker_that_is_down_is_a_clear_error_at_once(capsys):
    port = free_port()
    rc = cli(["tune", str(TINY_SPEC), "--rpc-tracker", f"127.0.0.1:{port}", "--rpc-key", "board"])
    out, err = capsys.readouterr()
    assert rc == 2 and f"RPC tracker 127.0.0.1:{port} refused the connection" in err
    assert "python -m tvm.exec.rpc_tracker" in err
    assert "[export]" not in out  # refused before the graph was touched


def test_no_board_under_the_key_names_the_keys_there_are(tracker, x86_boards, capsys):
    rc = cli(["tune", str(TINY_SPEC), "--rpc-tracker", f"127.0.0.1:{tracker}", "--rpc-key", "rasp4b64"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert f"no board registered with key 'rasp4b64' at tracker 127.0.0.1:{tracker}; registered keys: x86" in err


def test_rpc_key_alone_is_refused(capsys):
    assert cli(["tune", str(TINY_SPEC), "--rpc-key", "x86"]) == 2
    assert "--rpc-key needs --rpc-tracker HOST:PORT" in capsys.readouterr().err


# ---------------------------------------------------------------- the runner
def test_candidates_run_on_every_board_of_the_key_and_a_dropped_one_is_retried(tracker, x86_boards, candidate):
    dead, live = x86_boards
    runner = runner_for(tracker, "x86")
    assert runner.workers == 3  # one candidate per registered board at a time
    results = [f.result() for f in runner.run([candidate] * 4)]
    assert all(r.error_msg is None and len(r.run_secs) == 1 and float(r.run_secs[0]) > 0 for r in results), \
        [r.error_msg for r in results]
    used = runner.usage().measurements
    # the first grant went to the board that drops: that candidate ran again on a live one
    assert len(used) == 4 and all(m.ok for m in used) and sum(m.retried for m in used) == 1
    assert {m.board for m in used} <= set(live)
    assert runner.usage().summary().startswith("4 of 4 candidate(s) measured on ")


def test_when_the_last_board_drops_the_candidates_fail_at_once(tracker, candidate):
    dead = FakeBoard(tracker, "gone", "drop", leave=True)
    try:
        runner = runner_for(tracker, "gone", timeout=10)
        results = [f.result() for f in runner.run([candidate])]
        results += [f.result() for f in runner.run([candidate])]  # a later batch: not even submitted
        assert all(r.run_secs is None for r in results)
        assert results[0].error_msg.startswith(f"board runner: on {dead.address}: ")
        assert results[0].error_msg.endswith("no board left under key 'gone'"), results[0].error_msg
        assert results[1].error_msg == "board runner: no board left under key 'gone'"
        assert [m.board for m in runner.usage().measurements] == [dead.address, None]
    finally:
        dead.close()


def test_a_silent_board_times_out_instead_of_hanging(tracker, candidate):
    silent = FakeBoard(tracker, "silent", "silent")
    try:
        runner = runner_for(tracker, "silent", timeout=1, grace=2)
        (result,) = [f.result() for f in runner.run([candidate])]  # returns: the worker was killed
        assert result.error_msg == "board runner: killed after 4 s without an answer", result.error_msg
        (measured,) = runner.usage().measurements
        assert not measured.ok and not measured.retried  # a timed-out candidate is not run again
    finally:
        silent.close()


# ---------------------------------------------------------------- targets and databases
@needs_cross
def test_core_counts_come_from_the_tag_the_table_or_the_option():
    from portable_pe.backends import arm
    from portable_pe.backends.targets import load_target
    spec = load_target("arm")
    cores = {board: arm.tvm_target(spec, board=board).attrs.get("num-cores") for board in spec.options["board"]["choices"]}
    # the Jetson AGX tags carry their CPU core counts (Orin 64GB: 12x Cortex-A78AE, Thor: 14x Neoverse-V3AE)
    assert cores == {"generic": None, "rasp4b64": 4, "rk3399": 6, "jetson-orin-nano": 6, "jetson-agx-orin": 12,
                     "jetson-agx-thor": 14}
    assert int(arm.tvm_target(spec, board="rasp4b64", num_cores=2).attrs["num-cores"]) == 2
    with pytest.raises(ValueError, match="--num-cores must be a positive integer"):
        arm.tvm_target(spec, board="generic", num_cores=0)


@needs_cross
def test_tuning_a_board_without_a_core_count_says_what_to_pass(capsys):
    assert cli(["tune", str(TINY_SPEC), "--target", "arm"]) == 2
    out, err = capsys.readouterr()
    assert "has no core count, which MetaSchedule needs (\"num-cores\"): pass --num-cores N" in err
    assert "[export]" not in out  # said before the export
    from portable_pe.tune.autotune import check_tunable
    check_tunable("arm", {"num_cores": 2})
    check_tunable("arm", {"board": "rk3399"})


def _commit_record(db_dir, kernel, target) -> None:
    """One measured-looking record for `kernel` (a trivial schedule: its loops looked up)."""
    from tvm.s_tir import Schedule
    from tvm.s_tir import meta_schedule as ms
    from portable_pe.tune.database import open_database, workload
    mod = workload(kernel)
    database = open_database(db_dir)
    sch = Schedule(mod)
    block = sch.get_child_blocks(sch.get_sblock("root"))[0] if _has_root(mod) else None
    if block is not None:
        sch.get_loops(block)
    database.commit_tuning_record(ms.database.TuningRecord(
        sch.trace, database.commit_workload(mod), [1e-3], target, ms.arg_info.ArgInfo.from_prim_func(mod["main"])))


def _has_root(mod) -> bool:
    return "sblock \"root\"" in mod.script() or 'T.sblock("root")' in mod.script()


@needs_cross
def test_compile_applies_the_boards_own_database(tmp_path, monkeypatch, capsys):
    """A database under targets/tuning/arm/<board>/<graph>/ is the one `compile --board` uses
    (hits and misses reported)."""
    from portable_pe.compile.pipeline import compile_graph, prepare
    from portable_pe.tune.database import as_main, database_dir_of, fused_prim_funcs, specialize, specialized_name
    monkeypatch.setenv("PORTABLE_PE_TUNING_DIR", str(tmp_path / "db"))
    st = prepare(str(TINY_SPEC), target="arm", target_options={"board": "rasp4b64"}, log=lambda m: None)
    db_dir = database_dir_of(st)
    assert db_dir == database_dir("arm", "tiny_rope", variant="rasp4b64") == tmp_path / "db/arm/rasp4b64/tiny_rope"
    point = {"batch": 1, "seq": 8}
    kernels = fused_prim_funcs(as_main(specialize(st.relax, dims=st.io["dims"], point=point),
                                       specialized_name(point)), st.tvm_target)
    # a kernel MetaSchedule tunes: not one written scheduled (the fused attention), whose
    # symbolic shapes a tuning record cannot describe
    tuned = next(name for name in sorted(kernels) if not (kernels[name].attrs or {}).get("tirx.is_scheduled"))
    db_dir.mkdir(parents=True)
    _commit_record(db_dir, kernels[tuned], st.tvm_target)
    (db_dir / "tuned.json").write_text(json.dumps({"graph": "tiny_rope", "points": [{**point, "trials_per_task": 1}]}))
    logs = []
    bundle = compile_graph(str(TINY_SPEC), target="arm", target_options={"board": "rasp4b64"}, out=tmp_path / "b",
                           log=logs.append)
    (entry,) = bundle.manifest["tuning"]["specializations"]
    assert (entry["function"], entry["tuned_kernels"], entry["untuned_kernels"]) == ("main_b1_t8", 1, len(kernels) - 1)
    assert f"main_b1_t8: 1 tuned kernel(s), {len(kernels) - 1} miss(es)" in "\n".join(logs)
    assert bundle.manifest["tuning"]["database"].endswith("arm/rasp4b64/tiny_rope")


@needs_cross
def test_candidates_are_exported_into_their_own_folder(tmp_path):
    """MetaSchedule deletes a measured candidate's whole folder (remove_build_dir): a
    candidate written straight into /tmp took /tmp with it."""
    import tempfile
    import tvm
    from tvm import te
    from tvm.s_tir import meta_schedule as ms
    from portable_pe.compile.pipeline import prepare
    from portable_pe.tune.autotune import _builder
    st = prepare("", target="arm", target_options={"board": "rasp4b64"}, through="target", log=lambda m: None)
    a = te.placeholder((8,), name="a")
    module = tvm.compile(tvm.IRModule({"main": te.create_prim_func([a, te.compute((8,), lambda i: a[i] + 1.0)])}),
                         target=st.tvm_target)
    path = _builder(st).f_export(module)
    folder = os.path.dirname(path)
    assert os.path.realpath(folder) != os.path.realpath(tempfile.gettempdir()) and os.listdir(folder) == ["candidate.so"]
    sentinel = tmp_path / "still-here"
    sentinel.write_text("")
    ms.utils.remove_build_dir(path)
    assert not os.path.exists(folder) and sentinel.exists()


def _bind_gpu_schedule(kernel):
    """A valid GPU schedule for an injective kernel (producers inlined, the output's loops
    fused and bound to 96-thread blocks, a size dlight never picks), or None when the
    kernel is not that simple."""
    from tvm.s_tir import Schedule
    from portable_pe.tune.database import workload
    sch = Schedule(workload(kernel))
    try:
        *producers, last = sch.get_child_blocks(sch.get_sblock("root"))
        for block in reversed(producers):
            sch.compute_inline(block)
        _, threads = sch.split(sch.fuse(*sch.get_loops(last)), factors=[None, 96])
        sch.bind(sch.get_loops(last)[0], "blockIdx.x")
        sch.bind(threads, "threadIdx.x")
    except Exception:  # a reduction, a non-inlinable producer: not this kernel
        return None
    return sch


def test_cuda_compile_applies_the_archs_database_before_dlight(tmp_path, monkeypatch):
    """cuda: the database lives under targets/tuning/cuda/<arch>/<graph>/, its kernels are the
    ones TVM's CUDA pipeline fuses, and the compile applies it before dlight's schedules
    (the tuned kernel keeps its 96-thread blocks)."""
    from tvm.s_tir import meta_schedule as ms
    from portable_pe.compile.pipeline import compile_graph, prepare
    from portable_pe.backends import get_backend
    from portable_pe.tune.database import (as_main, database_dir_of, fused_prim_funcs, open_database, specialize,
                                           specialized_name, workload)
    monkeypatch.setenv("PORTABLE_PE_TUNING_DIR", str(tmp_path / "db"))
    st = prepare(str(TINY_SPEC), target="cuda", target_options={"arch": "sm_80"}, log=lambda m: None)
    db_dir = database_dir_of(st)
    assert db_dir == tmp_path / "db/cuda/sm_80/tiny_rope"
    point = {"batch": 1, "seq": 8}
    kernels = fused_prim_funcs(as_main(specialize(st.relax, dims=st.io["dims"], point=point), specialized_name(point)),
                               st.tvm_target, backend=get_backend("cuda"))
    name, sch = next((n, s) for n, s in ((n, _bind_gpu_schedule(k)) for n, k in sorted(kernels.items())) if s)
    db_dir.mkdir(parents=True)
    database = open_database(db_dir)
    mod = workload(kernels[name])
    database.commit_tuning_record(ms.database.TuningRecord(
        sch.trace, database.commit_workload(mod), [1e-3], st.tvm_target, ms.arg_info.ArgInfo.from_prim_func(mod["main"])))
    (db_dir / "tuned.json").write_text(json.dumps({"graph": "tiny_rope", "points": [{**point, "trials_per_task": 1}]}))
    bundle = compile_graph(str(TINY_SPEC), target="cuda", target_options={"arch": "sm_80"}, out=tmp_path / "b",
                           keep_intermediates=True, log=lambda m: None)
    (entry,) = bundle.manifest["tuning"]["specializations"]
    assert (entry["tuned_kernels"], entry["untuned_kernels"]) == (1, len(kernels) - 1), entry
    source = (tmp_path / "b.intermediates" / "06-kernels.cu").read_text()
    # (the kernel is renamed in the whole module, e.g. fused_add_reshape_transpose -> fused_add4_reshape2_transpose3)
    assert "__launch_bounds__(96)" in source, f"{name} was not built from the database's 96-thread schedule"


def test_cuda_tuning_without_the_cuda_runtime_says_where_to_run_it(capsys):
    import tvm
    if tvm.runtime.enabled("cuda"):
        pytest.skip("TVM's CUDA runtime is enabled here: cuda candidates can be built")
    assert cli(["tune", str(TINY_SPEC), "--target", "cuda", "--arch", "sm_90", "--rpc-tracker", "127.0.0.1:9",
                "--rpc-key", "h100"]) == 2
    err = capsys.readouterr().err
    assert "TVM here has no CUDA runtime (no NVIDIA driver): its builds hold CUDA source only" in err
