"""Deploy a bundle to a board over TVM RPC, run its reference inputs there, report parity.

    deploy(bundle, rpc="HOST:PORT")                  a board's RPC server
    deploy(bundle, tracker="HOST:PORT", key="KEY")   a board shared through an RPC tracker

Every wait is bounded: a socket probe first (refused / unreachable in at most `timeout`),
the RPC handshake and the tracker's grant in a watchdog thread, and the board itself
closes the session after `timeout` s (rpc session_timeout). The board's architecture is
read before anything is uploaded, so a bundle for another machine is refused up front.
"""

from __future__ import annotations

import gc
import socket
import struct
import threading
import traceback
from pathlib import Path

import numpy as np

from ..bundle.artifact import Bundle, load_bundle
from ..bundle.reference import bundle_cases
from ..bundle.shared_library import check_shared_library
from .parity import ParityReport, check_bundle, compare
from .local import check_inputs, entry_for, _outputs

DEFAULT_TIMEOUT = 600.0
#: ELF e_machine -> the arch name platform.machine() (and the manifest's host_arch) use
_ELF_MACHINES = {0x3E: "x86_64", 0xB7: "aarch64", 0x28: "arm", 0xF3: "riscv64", 0x03: "i386"}


class DeployError(RuntimeError):
    """The board cannot be reached, is busy, or cannot run this bundle."""


def parse_address(text: str, *, what: str) -> tuple[str, int]:
    """(host, port) of HOST:PORT, or [HOST]:PORT for an IPv6 address ("[::1]:9090" -> "::1")."""
    import ipaddress
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            if sep:
                raise ValueError(f"{what} {text!r}: [{host}] is not an IPv6 address; expected [HOST]:PORT "
                                 "with an IPv6 address in the brackets, e.g. [::1]:9190") from None
    else:
        host, sep, port = text.rpartition(":")
        if ":" in host:
            raise ValueError(f"{what} {text!r}: an IPv6 address must be bracketed: write [HOST]:PORT, "
                             "e.g. [::1]:9190")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{what} must be HOST:PORT (e.g. 127.0.0.1:9190, or [::1]:9190 for IPv6), got {text!r}")
    return host, int(port)


def show_address(host: str, port: int) -> str:
    """HOST:PORT as parse_address reads it back: [::1]:9090 for an IPv6 host."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def probe(host: str, port: int, *, timeout: float, what: str) -> None:
    """Fail fast when nothing listens (TVM's own connect retries refused tracker ports for 60 s)."""
    where = show_address(host, port)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except ConnectionRefusedError:
        start = (f"start one: `python -m tvm.exec.rpc_tracker --host 0.0.0.0 --port {port}`" if "tracker" in what
                 else "for the emulated board: `python scripts/board_server.py start`")
        raise DeployError(f"{what} {where} refused the connection: nothing listens there ({start})") from None
    except socket.timeout:
        raise DeployError(f"{what} {where} did not answer within {timeout:g} s") from None
    except OSError as err:
        raise DeployError(f"cannot reach {what} {where}: {err.strerror or err}") from None


def bounded(fn, *, timeout: float, what: str):
    """Run fn() but give up after `timeout` s: an RPC server busy with another session
    accepts the TCP connection and then stays silent, and TVM's handshake has no timeout."""
    result: dict = {}

    def target():
        try:
            result["value"] = fn()
        except BaseException as err:  # handed to the caller below
            result["error"] = err
    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise DeployError(f"{what}: no answer within {timeout:g} s (is the board busy with another session?)")
    if "error" in result:
        raise DeployError(f"{what}: {_first_line(result['error'])}") from None
    return result["value"]


def _first_line(err: BaseException) -> str:
    lines = [line for line in str(err).splitlines() if line.strip()]
    # TVM errors end with the useful line after a traceback
    return (lines[-1] if lines else type(err).__name__).strip()


def connect(*, rpc: str | None = None, tracker: str | None = None, key: str | None = None,
            timeout: float = DEFAULT_TIMEOUT):
    """An RPC session to the board; (session, description)."""
    from tvm import rpc as tvm_rpc
    if (rpc is None) == (tracker is None):
        raise ValueError("give either rpc='HOST:PORT' or tracker='HOST:PORT' with key=KEY")
    wait = min(timeout, 30.0)
    if rpc is not None:
        host, port = parse_address(rpc, what="--rpc")
        where = show_address(host, port)
        probe(host, port, timeout=wait, what="board RPC server")
        session = bounded(lambda: tvm_rpc.connect(host, port, session_timeout=timeout),
                           timeout=wait, what=f"RPC handshake with {where}")
        return session, where
    if not key:
        raise ValueError("--tracker must come with --key KEY (the key the board registered with)")
    host, port = parse_address(tracker, what="--tracker")
    where = show_address(host, port)
    probe(host, port, timeout=wait, what="RPC tracker")
    tracker_session = bounded(lambda: tvm_rpc.connect_tracker(host, port), timeout=wait,
                               what=f"RPC tracker {where}")
    summary = bounded(tracker_session.summary, timeout=wait, what=f"RPC tracker {where}")
    keys = sorted(summary.get("queue_info", {}))
    if key not in keys:
        raise DeployError(f"no board registered with key {key!r} at tracker {where}; "
                          f"registered keys: {', '.join(keys) or 'none'}")
    session = bounded(lambda: tracker_session.request(key, session_timeout=timeout, max_retry=1),
                       timeout=wait, what=f"tracker {where} request for key {key!r}")
    return session, f"{key} via tracker {where}"


def remote_arch(session) -> str | None:
    """The board's CPU architecture from the ELF header of its server process, or None.

    Both TVM RPC servers (python and apps/cpp_rpc) take an absolute path as is, and
    qemu-user maps /proc/self/exe to the emulated binary, so this is the board's arch."""
    try:
        header = bytes(session.download("/proc/self/exe"))[:20]
    except Exception:  # an RPC server that refuses: fall back to the load-time check
        return None
    if header[:4] != b"\x7fELF":
        return None
    return _ELF_MACHINES.get(struct.unpack_from("<H", header, 18)[0], f"ELF machine {header[18]:#x}")


def check_deployable(bundle: Bundle, board_arch: str | None, where: str) -> None:
    built_for = bundle.manifest["target"].get("host_arch")
    if board_arch and built_for and board_arch != built_for:
        raise DeployError(f"bundle {bundle.path} was built for {built_for} (target {bundle.target!r}) but the board "
                          f"at {where} is {board_arch}: compile for the board (e.g. --target arm for aarch64)")


def check_cpu_features(bundle: Bundle, session, where: str) -> None:
    """Refuse a bundle compiled for aarch64 features (manifest target.cpu_features: a
    --board's dot product, i8mm, bf16, SVE) that the board's cores lack, read from the RPC
    server's /proc/self/auxv (what qemu-user emulates, too): its first such instruction
    would kill the board's server with SIGILL and leave only a dropped connection."""
    from ..bundle.run_on_board import missing_cpu_features
    needed = bundle.manifest["target"].get("cpu_features", [])
    if not needed:
        return
    try:
        auxv = bytes(session.download("/proc/self/auxv"))
    except Exception:  # an RPC server that refuses: nothing to judge by
        return
    missing = missing_cpu_features(needed, auxv)
    if missing:
        board = bundle.manifest["target"].get("options", {}).get("board", "?")
        raise DeployError(f"bundle {bundle.path} was compiled for --board {board} (CPU features "
                          f"{', '.join(needed)}); the board at {where} has no {', '.join(missing)}, so "
                          "model.so would stop there with SIGILL: compile with the --board this board is "
                          "(generic: NEON only)")


class RemoteRunner:
    """model.so loaded into a Relax VM on the board; same call as runtime.LocalRunner.run."""

    def __init__(self, session, bundle: Bundle, where: str):
        from tvm import relax
        self.manifest, self.session = bundle.manifest, session
        self.device = session.device(bundle.manifest["target"]["device"], 0)
        session.upload(str(bundle.file("model.so")), "model.so")
        try:
            module = session.load_module("model.so")
        except Exception as err:
            # glibc reports a foreign ELF machine as "No such file or directory": say what it means
            arch = bundle.manifest["target"].get("host_arch")
            raise DeployError(f"the board at {where} could not load model.so, built for {arch} "
                              f"({bundle.target!r} target); is the board an {arch} machine? "
                              f"The board said: {_first_line(err)}") from None
        self.vm = relax.VirtualMachine(module, self.device)

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import tvm
        check_inputs(self.manifest, inputs)
        args = [tvm.runtime.tensor(np.ascontiguousarray(inputs[spec["name"]]), device=self.device)
                for spec in self.manifest["inputs"]]
        # a tuple result comes back as an RPCObjectRef that cannot be indexed: use the
        # stateful interface, which hands the outputs back one by one
        entry = entry_for(self.manifest, inputs)  # a tuned static entry at its exact shape
        self.vm.set_input(entry, *args)
        self.vm.invoke_stateful(entry)
        return _outputs(self.vm.get_outputs(entry), [o["name"] for o in self.manifest["outputs"]])


def deploy(bundle: Bundle | str | Path, *, rpc: str | None = None, tracker: str | None = None,
           key: str | None = None, timeout: float = DEFAULT_TIMEOUT, log=print) -> ParityReport:
    """Run the bundle on the board: its reference.npz cases (candidate "board vs
    reference.npz"), then the parity harness with the board as the TVM candidate."""
    bundle = bundle if isinstance(bundle, Bundle) else load_bundle(bundle)
    if bundle.manifest["target"]["device"] != "cpu":
        raise DeployError(f"bundle {bundle.path} runs on {bundle.manifest['target']['device']}; "
                          "deploy sends cpu bundles (arm, llvm) to boards")
    check_shared_library(bundle.file("model.so"))  # before any upload: a truncated one would crash the board's server
    session, where = connect(rpc=rpc, tracker=tracker, key=key, timeout=timeout)
    try:
        return _run_on_board(bundle, session, where, log)
    except BaseException as err:
        traceback.clear_frames(err.__traceback__)  # a kept error must not keep the session
        raise
    finally:
        # The board serves one session at a time and TVM has no close(): the session ends
        # when the last remote object is freed, so free them now, not whenever gc runs.
        del session
        gc.collect()


def _run_on_board(bundle: Bundle, session, where: str, log) -> ParityReport:
    arch = remote_arch(session)
    log(f"connected to {where} ({arch or 'architecture unknown'})")
    check_deployable(bundle, arch, where)
    check_cpu_features(bundle, session, where)
    log(f"uploading {bundle.file('model.so')}")
    runner = RemoteRunner(session, bundle, where)
    runs: dict[str, dict[str, np.ndarray]] = {}
    stored = bundle_cases(bundle)
    for case in stored:
        log(f"  running {case.label} on the board")
        runs[case.label] = runner.run(case.inputs)

    def cached(inputs):  # the harness regenerates the same seeded inputs: reuse the board's run
        label = next((c.label for c in stored
                      if all(np.array_equal(c.inputs[k], v) for k, v in inputs.items())), None)
        return runs[label] if label is not None else runner.run(inputs)

    # the tuned entries (batch 1) run at their own lengths too, so the board checks what tuning changed
    tuned = {e["seq"]: e["function"] for e in bundle.manifest.get("tuning", {}).get("specializations", [])
             if e["batch"] == 1}
    for length, function in sorted(tuned.items()):
        log(f"  tuned entry {function} runs at T={length}")
    if stored and stored[0].sizes is not None:  # a vision bundle: its stored sizes
        report = check_bundle(bundle, sizes=[c.sizes for c in stored], tvm_runner=cached)
    else:
        report = check_bundle(bundle, lengths=tuple(sorted({*(c.length for c in stored), *tuned})), tvm_runner=cached)
    report.target = f"{bundle.target} @ {where}"
    for case in stored:
        report.rows += compare(case.outputs, runs[case.label], name="board vs reference.npz",
                               length=case.length if case.sizes is None else case.label,
                               tolerance_overrides=bundle.manifest.get("tolerance"))
    return report
