#!/usr/bin/env python3
"""The emulated aarch64 edge board: a TVM RPC server and a script runner under qemu-aarch64.

Build the board first with ``bash scripts/board_setup.sh``. Then::

    python scripts/board_server.py start [--port 9190] [--timeout 120]   # prints HOST:PORT
    python scripts/board_server.py start --tracker HOST:PORT --key KEY   # register with a tracker
    python scripts/board_server.py start --name b2 --port 0 --tracker HOST:PORT --key KEY  # a second one
    python scripts/board_server.py status
    python scripts/board_server.py stop
    python scripts/board_server.py run [--runtime-only] SCRIPT.py [ARGS...]

The RPC server binds 127.0.0.1 only. The stock ``python -m tvm.exec.rpc_server`` dies under
qemu-user (its worker re-execs ``sys.executable``: "Exec format error"), so the server is
``tvm.rpc.server.PopenRPCServerState`` started in-process after
``multiprocessing.set_start_method("fork")``.

Importable API (no TVM import on the host side)::

    board_paths() -> BoardPaths(board_dir, rootfs, site, qemu)
    board_command(script, args=(), python_args=()) -> list[str]
    board_env(runtime_only=False, base=None) -> dict
    run_on_board(script, args=(), runtime_only=False, **subprocess_kwargs) -> CompletedProcess
    start_server(port=9190, timeout=120.0, tracker=None, key="", name="") -> (host, port)
    stop_server(name="") -> bool
    server_status(name="") -> dict | None

``name`` runs several servers on the one board at once (each its own process, pid, state
and log), e.g. two boards registered under one tracker key: ``start --name b1 ...``.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterable, Sequence

HOST = "127.0.0.1"
DEFAULT_PORT = 9190
# The emulated CPU: qemu's `max` has every extension the arm boards' kernels use (FEAT_I8MM's
# smmla, FEAT_DotProd's sdot, FEAT_BF16's bfmmla). It is qemu-user's default too; named
# here so that no qemu release can change it under the tests. qemu 7.2 (Debian 12) has no
# named model with BF16 (neoverse-n2 and cortex-a710 came in qemu 8); PORTABLE_PE_BOARD_CPU
# picks another, e.g. cortex-a76 for a board with sdot and no BF16 or I8MM.
BOARD_CPU_ENV = "PORTABLE_PE_BOARD_CPU"
DEFAULT_BOARD_CPU = "max"
DEFAULT_TIMEOUT = 120.0
BOARD_PYTHON = "usr/bin/python3.11"

# Runs *on the board* (aarch64 python under qemu). argv: host port port_end
_SERVER_CODE = r"""
import logging, multiprocessing, sys, threading
multiprocessing.set_start_method("fork")
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
import tvm
from tvm.rpc.server import PopenRPCServerState
host, port, port_end = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
# optional: register with an RPC tracker under a key (then only tracker-granted clients connect)
tracker = (sys.argv[4], int(sys.argv[5])) if len(sys.argv) > 5 else None
key = sys.argv[6] if len(sys.argv) > 6 else ""
state = PopenRPCServerState(host, port, port_end, tracker_addr=tracker, key=key)
PopenRPCServerState.current = state
print("BOARD_RPC_READY %s:%d tvm %s" % (host, state.port, tvm.__version__), flush=True)
state.thread.join()
"""


class BoardError(RuntimeError):
    """The board is missing, or the server could not be started/stopped."""


class BoardPaths:
    """Paths of one board. (A plain class: a dataclass breaks loading this file via importlib
    without registering it in sys.modules.)"""

    def __init__(self, board_dir: Path, rootfs: Path, site: Path, qemu: str, name: str = ""):
        self.board_dir, self.rootfs, self.site, self.qemu = board_dir, rootfs, site, qemu
        self.name = name  # the server instance: "" is the default one

    @property
    def _stem(self) -> str:
        return f"rpc_server-{self.name}" if self.name else "rpc_server"

    def __repr__(self) -> str:
        return f"BoardPaths(board_dir={self.board_dir!s}, rootfs={self.rootfs!s}, site={self.site!s}, qemu={self.qemu})"

    @property
    def python(self) -> Path:
        return self.rootfs / BOARD_PYTHON

    @property
    def pid_file(self) -> Path:
        return self.board_dir / f"{self._stem}.pid"

    @property
    def state_file(self) -> Path:
        return self.board_dir / f"{self._stem}.json"

    @property
    def log_file(self) -> Path:
        return self.board_dir / "logs" / f"{self._stem}.log"


def board_dir() -> Path:
    env = os.environ.get("PORTABLE_PE_BOARD_DIR")
    return Path(env) if env else Path.home() / ".cache" / "portable-pe" / "board"


def board_paths(check: bool = False, name: str = "") -> BoardPaths:
    """Where the board lives (and server instance `name`'s files). With ``check=True`` raise
    BoardError if it is not built."""
    if name and not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise BoardError(f"server name must be letters, digits, '_', '.' or '-', got {name!r}")
    d = board_dir()
    qemu = os.environ.get("PORTABLE_PE_QEMU") or shutil.which("qemu-aarch64") or "qemu-aarch64"
    paths = BoardPaths(d, d / "rootfs", d / "site", qemu, name)
    if check:
        problems = []
        if not shutil.which(paths.qemu):
            problems.append("qemu-aarch64 not on PATH")
        if not paths.python.exists():
            problems.append(f"no board python at {paths.python}")
        if not (paths.site / "tvm").is_dir():
            problems.append(f"no aarch64 tvm in {paths.site}")
        if problems:
            raise BoardError(
                "emulated board not ready (" + "; ".join(problems) + "): run `bash scripts/board_setup.sh`"
            )
    return paths


def board_available() -> bool:
    """True when the board is built (handy for pytest skipif)."""
    try:
        board_paths(check=True)
        return True
    except BoardError:
        return False


def board_command(
    script: str | os.PathLike | None,
    args: Iterable[str] = (),
    python_args: Sequence[str] = (),
) -> list[str]:
    """argv that runs ``python3.11 [python_args] script args`` on the board.

    ``script=None`` lets ``python_args`` carry e.g. ``["-c", code]`` or ``["-m", mod]``.
    """
    p = board_paths()
    cpu = os.environ.get(BOARD_CPU_ENV) or DEFAULT_BOARD_CPU
    cmd = [p.qemu, "-cpu", cpu, "-L", str(p.rootfs), str(p.python), *python_args]
    if script is not None:
        cmd.append(str(script))
    cmd.extend(str(a) for a in args)
    return cmd


def board_env(runtime_only: bool = False, base: dict | None = None) -> dict:
    """Environment for a board process: PYTHONPATH is the aarch64 site only (never the host's)."""
    p = board_paths()
    env = dict(os.environ if base is None else base)
    env.pop("PYTHONHOME", None)
    env.pop("PYTHONSTARTUP", None)
    env["PYTHONPATH"] = str(p.site)
    env["PYTHONNOUSERSITE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    if runtime_only:
        env["TVM_USE_RUNTIME_LIB"] = "1"  # runtime only: ~2 s import under qemu instead of ~6 s
    else:
        env.pop("TVM_USE_RUNTIME_LIB", None)
    return env


def run_on_board(
    script: str | os.PathLike | None,
    args: Iterable[str] = (),
    runtime_only: bool = False,
    python_args: Sequence[str] = (),
    **kwargs,
) -> subprocess.CompletedProcess:
    """subprocess.run the script on the board; extra kwargs go to subprocess.run."""
    board_paths(check=True)
    env = board_env(runtime_only, kwargs.pop("env", None))
    return subprocess.run(board_command(script, args, python_args), env=env, **kwargs)


# ------------------------------------------------------------------ RPC server
def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie counts as dead
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def _is_our_server(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return _pid_alive(pid)
    return any(b"qemu-aarch64" in c for c in cmdline) and any(b"BOARD_RPC_READY" in c for c in cmdline)


def _port_open(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


# TVM's RPC handshake (tvm/rpc/base.py; no TVM import here): the client sends RPC_MAGIC and
# a "client:<matchkey>" key; a server whose key differs answers one int32 code and
# carries on. The probe's key is one no server holds.
_RPC_MAGIC = 0xFF271
_PROBE_KEY = b"client:portable-pe-readiness-probe"


def _rpc_server_answers(host: str, port: int, timeout: float = 1.0, answer_timeout: float = 1.0) -> bool:
    """Whether a TVM RPC server answers the handshake at host:port (it replies 'key
    mismatch' to the probe's key). Not a bare connect-and-close: a server registered with
    a tracker takes a connection that closes mid-handshake as a network error, drops its
    tracker connection and registers again, and a tracker client that asks in between
    finds no board (seen: `tune --rpc-tracker` answered "registered keys: none" right
    after both boards of the tracker test had registered)."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(answer_timeout)
            sock.sendall(struct.pack("<ii", _RPC_MAGIC, len(_PROBE_KEY)) + _PROBE_KEY)
            return len(sock.recv(4)) == 4
    except OSError:
        return False


def _free_port(host: str = HOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _log_tail(path: Path, n: int = 30) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(lines[-n:])


def server_status(name: str = "") -> dict | None:
    """{'pid', 'host', 'port', 'log', 'accepting'} of the running server `name`, or None.

    Removes stale pid/state files."""
    p = board_paths(name=name)
    if not p.pid_file.exists():
        return None
    try:
        pid = int(p.pid_file.read_text().strip())
        state = json.loads(p.state_file.read_text()) if p.state_file.exists() else {}
    except (OSError, ValueError):
        pid, state = -1, {}
    if pid <= 0 or not _pid_alive(pid) or not _is_our_server(pid):
        p.pid_file.unlink(missing_ok=True)
        p.state_file.unlink(missing_ok=True)
        return None
    state["pid"] = pid
    state["accepting"] = bool(state.get("port")) and _rpc_server_answers(state.get("host", HOST), state["port"])
    return state


def start_server(port: int = DEFAULT_PORT, timeout: float = DEFAULT_TIMEOUT, quiet: bool = True,
                 tracker: tuple[str, int] | None = None, key: str = "", name: str = "") -> tuple[str, int]:
    """Start the board RPC server in the background (idempotent) and return (host, port).

    ``port=0`` picks a free port. With ``tracker=(host, port)`` the server registers with
    that RPC tracker under ``key`` (clients then come through the tracker). Waits at most
    ``timeout`` s for the port to accept connections; raises BoardError with the log tail
    if the server dies or never listens. ``name`` picks the server instance."""
    p = board_paths(check=True, name=name)
    st = server_status(name)
    stop_hint = f"python scripts/board_server.py stop{' --name ' + name if name else ''}"
    wanted = [list(tracker), key] if tracker else None
    if st is not None:
        if st.get("tracker") != wanted:
            raise BoardError(
                f"board RPC server already running on {st['host']}:{st['port']} (pid {st['pid']}) with "
                f"tracker {st.get('tracker')}, not {wanted}; run `{stop_hint}` first"
            )
        if port in (0, st["port"]):
            return st["host"], st["port"]
        raise BoardError(
            f"board RPC server already running on {st['host']}:{st['port']} (pid {st['pid']}); "
            f"run `{stop_hint}` first"
        )
    if port == 0:
        port = _free_port()
    if _port_open(HOST, port, timeout=0.5):
        raise BoardError(f"port {HOST}:{port} is already in use by another process")

    p.log_file.parent.mkdir(parents=True, exist_ok=True)
    server_args = [HOST, str(port), str(port + 1), *([tracker[0], str(tracker[1]), key] if tracker else [])]
    cmd = board_command(None, server_args, python_args=["-c", _SERVER_CODE])
    # The server needs only the runtime (modules arrive compiled), and imports 3x faster so.
    env = board_env(runtime_only=os.environ.get("PORTABLE_PE_BOARD_FULL_TVM") != "1")
    t0 = time.monotonic()
    with open(p.log_file, "wb") as log:
        log.write(f"# {time.strftime('%F %T')} starting: {' '.join(cmd[:6])} -c <server> {HOST} {port}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            cmd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, cwd=str(p.board_dir),
        )
    p.pid_file.write_text(f"{proc.pid}\n")
    p.state_file.write_text(json.dumps({"host": HOST, "port": port, "log": str(p.log_file), "started": time.time(),
                                        "tracker": wanted}))

    while True:
        rc = proc.poll()
        if rc is not None:
            p.pid_file.unlink(missing_ok=True)
            p.state_file.unlink(missing_ok=True)
            raise BoardError(
                f"board RPC server exited with code {rc} before listening on {HOST}:{port}. "
                f"Log {p.log_file}:\n{_log_tail(p.log_file)}"
            )
        # the server under qemu may take seconds to answer once it listens
        if _rpc_server_answers(HOST, port, timeout=0.5, answer_timeout=30):
            break
        if time.monotonic() - t0 > timeout:
            _kill_group(proc.pid)
            p.pid_file.unlink(missing_ok=True)
            p.state_file.unlink(missing_ok=True)
            raise BoardError(
                f"board RPC server did not listen on {HOST}:{port} within {timeout:.0f} s. "
                f"Log {p.log_file}:\n{_log_tail(p.log_file)}"
            )
        time.sleep(0.25)
    if not quiet:
        print(f"board RPC server pid {proc.pid} up in {time.monotonic() - t0:.1f} s, log {p.log_file}", file=sys.stderr)
    return HOST, port


def _kill_group(pid: int, grace: float = 10.0) -> None:
    """SIGTERM the server's process group (qemu + forked session workers), then SIGKILL.

    The server runs in its own session, so its pid is also its process-group id."""

    def group_gone() -> bool:
        try:  # reap the leader if it is our child
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return not _pid_alive(pid)
        return False

    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        except PermissionError:
            os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if group_gone():
                return
            time.sleep(0.1)


def stop_server(name: str = "") -> bool:
    """Stop the board RPC server `name`; False if none was running."""
    p = board_paths(name=name)
    st = server_status(name)
    if st is None:
        return False
    _kill_group(st["pid"])
    p.pid_file.unlink(missing_ok=True)
    p.state_file.unlink(missing_ok=True)
    return True


# ------------------------------------------------------------------ CLI
def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("start", help="start the RPC server on the board, print HOST:PORT")
    s.add_argument("--port", type=int, default=DEFAULT_PORT, help="0 = any free port (default %(default)s)")
    s.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds to wait (default %(default)s)")
    s.add_argument("--tracker", metavar="HOST:PORT", help="register with this TVM RPC tracker (needs --key)")
    s.add_argument("--key", default="", help="the key to register under, e.g. rasp4b64 or board")
    for name, text in (("stop", "stop the RPC server"), ("status", "report the RPC server")):
        sub.add_parser(name, help=text)
    for cmd in (s, sub.choices["stop"], sub.choices["status"]):
        cmd.add_argument("--name", default="", help="the server instance, for several at once (default: the one)")
    sub.add_parser("paths", help="print board paths")
    r = sub.add_parser("run", help="run a python script on the board")
    r.add_argument("--runtime-only", action="store_true", help="set TVM_USE_RUNTIME_LIB=1 (runtime-only tvm)")
    r.add_argument("script")
    r.add_argument("args", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)

    try:
        if a.cmd == "start":
            tracker = None
            if a.tracker:
                t_host, _, t_port = a.tracker.rpartition(":")
                if not t_host or not t_port.isdigit() or not a.key:
                    raise BoardError(f"--tracker needs HOST:PORT and --key KEY, got {a.tracker!r} key {a.key!r}")
                tracker = (t_host, int(t_port))
            host, port = start_server(a.port, a.timeout, quiet=False, tracker=tracker, key=a.key, name=a.name)
            print(f"{host}:{port}")
        elif a.cmd == "stop":
            print("stopped" if stop_server(a.name) else "not running")
        elif a.cmd == "status":
            st = server_status(a.name)
            if st is None:
                print("not running")
                return 1
            print(f"running pid {st['pid']} on {st['host']}:{st['port']} "
                  f"({'accepting' if st['accepting'] else 'NOT accepting'}) log {st.get('log')}")
        elif a.cmd == "paths":
            p = board_paths()
            print(f"board_dir={p.board_dir}\nrootfs={p.rootfs}\nsite={p.site}\nqemu={p.qemu}")
        elif a.cmd == "run":
            return run_on_board(a.script, a.args, runtime_only=a.runtime_only).returncode
    except BoardError as e:
        print(f"board_server: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
