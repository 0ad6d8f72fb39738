"""Deploying bundles over TVM RPC, and the runner every bundle ships (run_on_board.py).

Without the board: the happy path and the error paths against an x86 RPC server on
loopback. With the board (marker `board`): the emulated aarch64 board from
scripts/board_setup.sh, started here on a free port, directly and through a tracker."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from portable_pe.bundle import run_on_board as board_runner
from portable_pe.bundle.artifact import sha256_file
from portable_pe.cli.main import main as cli
from portable_pe.run.deploy import DeployError, deploy, parse_address
from portable_pe.spec.graphs import GRAPHS
from portable_pe.run.parity import TOLERANCES, compare

from conftest import DATA, TINY_SPEC, load_script, needs_cross, require_cross

pytestmark = pytest.mark.integration  # run by scripts/test.sh after the default run (pyproject.toml)

board_server = load_script("board_server")

_board_ready = pytest.mark.skipif(not board_server.board_available(),
                                  reason="emulated board not set up: run `bash scripts/board_setup.sh`")


def board(test):
    """Marker `board` plus a skip with the reason when the board is not built here."""
    return pytest.mark.board(_board_ready(test))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port: int, proc: subprocess.Popen, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{what} did not listen on {port} in {timeout} s")


def start_tvm(module: str, port: int, *extra: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", module, "--host", "127.0.0.1", "--port", str(port),
                             "--port-end", str(port + 1), *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_listening(port, proc, module)
    return proc


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="module")
def x86_server():
    """A TVM RPC server on this x86 machine: a board of the 'wrong' architecture for arm."""
    port = free_port()
    proc = start_tvm("tvm.exec.rpc_server", port)
    yield f"127.0.0.1:{port}"
    stop(proc)


@pytest.fixture(scope="module")
def arm_bundle(bundle_factory):
    require_cross()
    return bundle_factory(TINY_SPEC, "arm")


# ---------------------------------------------------------------- no board needed
@pytest.mark.parametrize("text", ["localhost", "host:", ":9190", "host:port", "host:70000"])
def test_bad_address_says_what_is_expected(text):
    with pytest.raises(ValueError, match=rf"--rpc must be HOST:PORT .*got '{text}'"):
        parse_address(text, what="--rpc")


def test_refused_connection_is_a_clear_error_at_once(tiny_bundle):
    port = free_port()  # nothing listens there
    start = time.monotonic()
    with pytest.raises(DeployError, match=rf"127.0.0.1:{port} refused the connection: nothing listens there"):
        deploy(tiny_bundle, rpc=f"127.0.0.1:{port}", log=lambda m: None)
    assert time.monotonic() - start < 5


def test_refused_tracker_does_not_retry_for_a_minute(tiny_bundle):
    port = free_port()
    start = time.monotonic()
    with pytest.raises(DeployError, match=rf"RPC tracker 127.0.0.1:{port} refused the connection"):
        deploy(tiny_bundle, tracker=f"127.0.0.1:{port}", key="board", log=lambda m: None)
    assert time.monotonic() - start < 5


def test_silent_server_times_out_instead_of_hanging(tiny_bundle):
    # accepts TCP (the kernel's backlog) and never speaks: like a board busy with a session
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        start = time.monotonic()
        with pytest.raises(DeployError, match=r"RPC handshake with .*no answer within 2 s"):
            deploy(tiny_bundle, rpc=f"127.0.0.1:{silent.getsockname()[1]}", timeout=2, log=lambda m: None)
        assert time.monotonic() - start < 10


def test_deploy_runs_the_reference_remotely_and_reports(tiny_bundle, x86_server):
    report = deploy(tiny_bundle, rpc=x86_server, log=lambda m: None)
    assert report.ok, report.to_markdown()
    lengths = sorted({r.length for r in report.rows if r.candidate == "board vs reference.npz"})
    assert lengths == tiny_bundle.manifest["reference"]["lengths"]
    assert {r.candidate for r in report.rows} == {"onnxruntime", "tvm", "board vs reference.npz"}


def test_wrong_architecture_is_refused_before_upload(arm_bundle, x86_server):
    with pytest.raises(DeployError, match=r"built for aarch64 \(target 'arm'\) but the board at .* is x86_64"):
        deploy(arm_bundle, rpc=x86_server, log=lambda m: None)


def test_load_failure_is_translated_when_the_arch_is_unknown(arm_bundle, x86_server, monkeypatch):
    # a server that will not reveal its architecture: the failed load names what was sent
    monkeypatch.setattr("portable_pe.run.deploy.remote_arch", lambda session: None)
    with pytest.raises(DeployError, match=r"could not load model.so, built for aarch64 \('arm' target\); is the board an aarch64 machine"):
        deploy(arm_bundle, rpc=x86_server, log=lambda m: None)


def test_cuda_bundles_are_not_sent_to_boards(tiny_bundle, tmp_path):
    copy = tmp_path / "b"
    shutil.copytree(tiny_bundle.path, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["target"]["device"] = "cuda"
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DeployError, match="runs on cuda; deploy sends cpu bundles"):
        deploy(copy, rpc="127.0.0.1:1", log=lambda m: None)


def perturbed(bundle, tmp_path) -> Path:
    """A copy whose stored reference outputs are off by 1e-2 (checksums kept consistent)."""
    copy = tmp_path / "perturbed"
    shutil.copytree(bundle.path, copy)
    with np.load(copy / "reference.npz") as npz:
        data = {k: npz[k] + np.float32(1e-2) if "/out/" in k else npz[k] for k in npz.files}
    np.savez(copy / "reference.npz", **data)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["files"]["reference.npz"] = sha256_file(copy / "reference.npz")
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


def run_runner(bundle_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(bundle_dir / "run_on_board.py")], capture_output=True, text=True,
                          timeout=300, env={"PATH": "/usr/bin:/bin", "TVM_USE_RUNTIME_LIB": "1"})


def test_shipped_runner_passes_and_fails_on_its_own(tiny_bundle, tmp_path):
    good = run_runner(tiny_bundle.path)
    assert good.returncode == 0, good.stdout + good.stderr
    assert "| tvm@board | 300 | hidden | 1x300x64 |" in good.stdout and "**PASS**" in good.stdout
    bad = run_runner(perturbed(tiny_bundle, tmp_path))
    assert bad.returncode == 1 and "**FAIL**" in bad.stdout, bad.stdout + bad.stderr


def _auxv(hwcap: int, hwcap2: int) -> bytes:
    """An aarch64 /proc/self/auxv: (type, value) pairs of 64-bit words, AT_NULL last."""
    import struct
    return struct.pack("<8Q", 6, 4096, 16, hwcap, 26, hwcap2, 0, 0)


def test_runner_reads_the_cpu_features_from_the_auxv_hwcaps():
    """HWCAP words that qemu-aarch64 reported for its CPU models (read on the emulated
    board): Cortex-A72 is ARMv8.0 (none of the optional features), Neoverse-N1 has the dot
    product and half-precision SIMD but no i8mm, bf16 or SVE; `max` has them all."""
    needed = ["bf16", "dotprod", "fullfp16", "i8mm", "sve", "sve2"]
    assert board_runner.missing_cpu_features(needed, _auxv(0x8FB, 0)) == needed
    assert board_runner.missing_cpu_features(needed, _auxv(0x119FFB, 0)) == ["bf16", "i8mm", "sve", "sve2"]
    assert board_runner.missing_cpu_features(needed, _auxv(0xECFFFFFB, 0x7F877FFF)) == []
    assert board_runner.missing_cpu_features(needed, b"") == []  # no auxv: nothing to judge by


def test_runner_refuses_a_tampered_bundle(tiny_bundle, tmp_path):
    copy = tmp_path / "tampered"
    shutil.copytree(tiny_bundle.path, copy)
    with open(copy / "model.so", "ab") as f:
        f.write(b"\0")
    result = run_runner(copy)
    assert result.returncode == 2 and "model.so does not match its checksum" in result.stderr


@pytest.mark.parametrize("offset", [0.0, 1e-5, 1e-2])
def test_runner_compares_like_the_parity_harness(offset):
    # run_on_board.py cannot import portable_pe: its copy of the rule must agree with parity.compare
    rng = np.random.default_rng(1)
    ref = rng.standard_normal((2, 9, 16)).astype(np.float32)
    got = ref + np.float32(offset)
    tol = TOLERANCES["float32"]
    row = compare({"h": ref}, {"h": got}, name="x", length=9)[0]
    assert board_runner.compare(ref, got, tol)[:4] == pytest.approx((row.max_abs, row.max_rel, row.cosine, row.ok))
    assert row.ok == (offset < 1e-3)


# ---------------------------------------------------------------- the emulated board
class Board:
    """The board's RPC server, started on a free port; restarted to switch to a tracker."""

    def __init__(self):
        self.tracker_proc = None
        self.address = None

    def direct(self) -> str:
        if self.address is None or self.tracker_proc is not None:
            self.close()
            host, port = board_server.start_server(port=0, timeout=120)
            self.address = f"{host}:{port}"
        return self.address

    def via_tracker(self, key: str) -> str:
        self.close()
        port = free_port()
        self.tracker_proc = start_tvm("tvm.exec.rpc_tracker", port)
        board_server.start_server(port=0, timeout=120, tracker=("127.0.0.1", port), key=key)
        self.address = f"127.0.0.1:{port}"
        time.sleep(1.0)  # the server registers right after it listens
        return self.address

    def close(self) -> None:
        board_server.stop_server()
        if self.tracker_proc is not None:
            stop(self.tracker_proc)
            self.tracker_proc = None
        self.address = None


@pytest.fixture(scope="module")
def emulated_board():
    if not board_server.board_available():
        pytest.skip("emulated board not set up: run `bash scripts/board_setup.sh`")
    if board_server.server_status() is not None:
        pytest.skip("a board RPC server is already running (python scripts/board_server.py stop)")
    b = Board()
    yield b
    b.close()


@board
def test_cli_deploy_over_rpc_passes_on_the_board(arm_bundle, emulated_board, capsys, tmp_path):
    rc = cli(["deploy", str(arm_bundle.path), "--rpc", emulated_board.direct(), "--json", str(tmp_path / "r.json")])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "(aarch64)" in out and "| board vs reference.npz | 300 | hidden | 1x300x64 |" in out
    rows = json.loads((tmp_path / "r.json").read_text())["rows"]
    print("board RPC max abs:", max(r["max_abs"] for r in rows if r["candidate"] != "onnxruntime"))


@board
def test_cli_deploy_mismatch_exits_non_zero(arm_bundle, emulated_board, tmp_path, capsys):
    rc = cli(["deploy", str(perturbed(arm_bundle, tmp_path)), "--rpc", emulated_board.direct()])
    assert rc == 1 and "**FAIL**" in capsys.readouterr().out


@board
def test_host_bundle_is_refused_by_the_board_before_upload(tiny_bundle, emulated_board):
    with pytest.raises(DeployError, match=r"built for x86_64 \(target 'llvm'\) but the board at .* is aarch64"):
        deploy(tiny_bundle, rpc=emulated_board.direct(), log=lambda m: None)


@board
def test_busy_board_times_out(arm_bundle, emulated_board):
    from tvm import rpc
    host, port = parse_address(emulated_board.direct(), what="board")
    held = rpc.connect(host, port, session_timeout=60)  # the board serves one session at a time
    try:
        with pytest.raises(DeployError, match="no answer within 3 s"):
            deploy(arm_bundle, rpc=f"{host}:{port}", timeout=3, log=lambda m: None)
    finally:
        del held


@board
@pytest.mark.parametrize("graph", ["tiny_vit_rope_2d", "tiny_swin_rel_bias_2d", "tiny_video_mrope"])
def test_a_vision_bundle_passes_on_the_board_at_its_sizes(graph, bundle_factory, emulated_board, capsys):
    """One arm build of a 2D-RoPE ViT, of a windowed Swin (shifted windows, 2D relative
    bias) and of the video graph (3D M-RoPE), each run on the board at every image size its
    reference holds, against the stored PyTorch outputs."""
    require_cross()
    bundle = bundle_factory(str(DATA / "vision" / f"{graph}.toml"), "arm")
    report = deploy(bundle, rpc=emulated_board.direct(), log=lambda m: None)
    board_rows = [r for r in report.rows if r.candidate == "board vs reference.npz"]
    assert len({r.length for r in board_rows}) >= 2 and all(r.ok for r in board_rows), report.to_markdown()
    assert report.ok, report.to_markdown()


@board
def test_shipped_runner_passes_on_the_board(arm_bundle, emulated_board):
    result = board_server.run_on_board(arm_bundle.file("run_on_board.py"), runtime_only=True,
                                       capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "parity on board (aarch64)" in result.stdout and "**PASS**" in result.stdout


@board
def test_deploy_through_a_tracker(arm_bundle, emulated_board):
    tracker = emulated_board.via_tracker("pe-board")
    with pytest.raises(DeployError, match=r"no board registered with key 'rk3399'.*registered keys: pe-board"):
        deploy(arm_bundle, tracker=tracker, key="rk3399", timeout=10, log=lambda m: None)
    report = deploy(arm_bundle, tracker=tracker, key="pe-board", log=lambda m: None)
    assert report.ok and "via tracker" in report.target, report.to_markdown()


@pytest.mark.slow
@board
@needs_cross
@pytest.mark.parametrize("graph", sorted(GRAPHS))
def test_every_shipped_graph_passes_on_the_board(graph, bundle_factory, emulated_board):
    bundle = bundle_factory(graph, "arm")
    report = deploy(bundle, rpc=emulated_board.direct(), log=lambda m: None)
    assert report.ok, report.to_markdown()
    runner = board_server.run_on_board(bundle.file("run_on_board.py"), ["--json", "/tmp/runner.json"],
                                       runtime_only=True, capture_output=True, text=True, timeout=900)
    assert runner.returncode == 0, runner.stdout + runner.stderr
    print(f"{graph}: RPC max abs {report.worst('board vs reference.npz'):.2e}, runner max abs "
          f"{max(r['max_abs'] for r in json.loads(Path('/tmp/runner.json').read_text())['rows']):.2e}")


# int8 bundles, one board per kind of kernel: i8mm (smmla) by default, sdot and plain NEON slow
INT8_BOARDS = [pytest.param("jetson-agx-thor", id="i8mm"),
               pytest.param("jetson-agx-orin", id="sdot", marks=pytest.mark.slow),
               pytest.param("generic", id="neon", marks=pytest.mark.slow)]


@board
@needs_cross
@pytest.mark.parametrize("board_name", INT8_BOARDS)
def test_int8_bundle_passes_on_the_board(board_name, bundle_factory, emulated_board):
    """The int8 kernels for the board's CPU run on the (emulated) board, judged against
    PyTorch float32 by the int8 row; onnxruntime's int8 rows (this machine) are not judged."""
    bundle = bundle_factory(TINY_SPEC, "arm", precision="int8", board=board_name)
    assert bundle.manifest["precision"] == "int8"
    assert bundle.manifest["tolerance"]["float32"] == TOLERANCES["int8_linear"]  # what `ok` below means
    report = deploy(bundle, rpc=emulated_board.direct(), log=lambda m: None)
    board_rows = [r for r in report.rows if r.candidate == "board vs reference.npz"]
    assert report.ok and board_rows and all(r.ok for r in board_rows), report.to_markdown()


@board
@needs_cross
def test_bf16_bundle_passes_on_the_board(bundle_factory, emulated_board):
    """The BFMMLA kernels of a Jetson AGX Thor build run on the board (qemu's `max` CPU has
    FEAT_BF16, board_server.DEFAULT_BOARD_CPU), judged against PyTorch float32 by the
    bf16_linear row; onnxruntime (float32) and OpenVINO (bf16) are shown, not judged."""
    bundle = bundle_factory(TINY_SPEC, "arm", precision="bf16", board="jetson-agx-thor")
    plan = bundle.manifest["bf16"]
    assert (plan["kernel"], plan["matmuls_float32"]) == ("neon-bfmmla", 0) and plan["matmuls_bf16"] > 0, plan
    assert bundle.manifest["tolerance"]["float32"] == TOLERANCES["bf16_linear"]  # what `ok` below means
    report = deploy(bundle, rpc=emulated_board.direct(), log=lambda m: None)
    board_rows = [r for r in report.rows if r.candidate == "board vs reference.npz"]
    assert report.ok and board_rows and all(r.ok for r in board_rows), report.to_markdown()
    # the kernels rounded: a float32 arm build is ~1e-6 off PyTorch here, bf16 operands ~1e-3
    assert min(r.max_abs for r in board_rows) > 1e-4, report.to_markdown()
    print("bf16 on the board: " + ", ".join(f"T={r.length} cosine {r.cosine:.7f} max abs {r.max_abs:.2e}"
                                           for r in board_rows))


@board
@needs_cross
def test_a_board_without_the_bundles_cpu_features_refuses_it(bundle_factory, monkeypatch):
    """A Jetson AGX Thor build (SVE, i8mm, bf16 ...) on an ARMv8.0 core (qemu's
    Cortex-A72): deploy and the shipped runner both name what the core lacks, instead of
    the board's process dying of SIGILL at the first such instruction."""
    bundle = bundle_factory(TINY_SPEC, "arm", precision="bf16", board="jetson-agx-thor")
    assert bundle.manifest["target"]["cpu_features"] == ["bf16", "dotprod", "fullfp16", "i8mm", "sve", "sve2"]
    monkeypatch.setenv(board_server.BOARD_CPU_ENV, "cortex-a72")
    result = board_server.run_on_board(bundle.file("run_on_board.py"), runtime_only=True,
                                       capture_output=True, text=True, timeout=600)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "this CPU has no bf16, dotprod, fullfp16, i8mm, sve, sve2" in result.stderr, result.stderr
    if board_server.server_status("a72") is not None:
        pytest.skip("a board RPC server named a72 is already running")
    host, port = board_server.start_server(port=0, timeout=120, name="a72")
    try:
        with pytest.raises(DeployError, match=r"has no bf16, dotprod, fullfp16, i8mm, sve, sve2, so model.so "
                                              r"would stop there with SIGILL"):
            deploy(bundle, rpc=f"{host}:{port}", log=lambda m: None)
    finally:
        board_server.stop_server(name="a72")


@board
@needs_cross
def test_bfmmla_kernel_on_the_board_computes_the_rounded_product(emulated_board, tmp_path):
    """One linear layer (bias, GELU) built for Thor's CPU, run on the board against the
    float64 product of its bf16-rounded operands: the packing and the 2 x 2 tiles exact up
    to float32 rounding (BFMMLA without FEAT_EBF16 sums with round-to-odd)."""
    import tvm
    from tvm import rpc
    from tvm.runtime.vm import VirtualMachine
    from portable_pe.backends import arm
    from test_bf16 import THOR, _build_for, _matmul_module, _oracle
    from conftest import assert_parity
    mod, w, b = _matmul_module(48, 80)
    arm.export_library(_build_for(mod, THOR), tmp_path / "linear.so")
    host, port = parse_address(emulated_board.direct(), what="board")
    remote = rpc.connect(host, port, session_timeout=300)
    remote.upload(str(tmp_path / "linear.so"))
    vm = VirtualMachine(remote.load_module("linear.so"), remote.cpu())
    for t in (1, 33, 128):
        x = np.random.default_rng(t).standard_normal((t, 48)).astype(np.float32)
        got = vm["main"](tvm.runtime.tensor(x, device=remote.cpu())).numpy()
        assert_parity(_oracle(x, w, b), got, tolerance="float32_abs", name=f"bfmmla T={t}")
