"""MetaSchedule candidates measured on boards behind a TVM RPC tracker.

    runner = board_runner(tracker="HOST:PORT", key="KEY")   # checks the tracker first
    ms.tune_tir(..., runner=runner)
    runner.usage()                                         # candidates per board, failures

Before any tuning the tracker must answer (refused or silent: an error at once) and hold
at least one board under the key (else the error lists the keys it does hold). Then one
worker process per registered board measures candidates, so N boards under one key
measure N candidates at a time, each on whichever board the tracker grants.

Every wait is bounded, so nothing hangs: the grant of a board (`timeout`), the board's
session (the board itself ends it after `timeout`), and each candidate as a whole (its
worker process is killed after `2 * timeout + grace` s: a board that hangs). A candidate
that fails otherwise (its board dropped, refused the module, ended the session) is
measured once more on a board the tracker grants; a killed one is not (it would most
likely run out of time again). When no board under the key is left, every remaining
candidate fails at once. MetaSchedule records a failed candidate as invalid, never as a
timing, and the compile's coverage counts such a kernel as a miss.

Boards without `tvm.contrib.random` (TVM's runtime-only builds, our emulated board) get
their random inputs sent from here instead.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.runner import EvaluatorConfig, PyRunner, PyRunnerFuture, RunnerResult

from ..run.deploy import parse_address
from .tracker import TrackerError, boards_under, grant_board

DEFAULT_TIMEOUT = 120.0
#: seconds on top of a grant and a session for a worker process to start (a TVM import)
DEFAULT_GRACE = 60.0
#: measurements per candidate: TVM's defaults (3 runs after a warm-up, at least 100 ms)
EVALUATOR = EvaluatorConfig(number=3, repeat=1, min_repeat_ms=100, enable_cpu_cache_flush=False)


@dataclass
class Measurement:
    board: str | None  # None: no board was granted
    ok: bool
    error: str = ""
    retried: bool = False


@dataclass
class Usage:
    """What the runner did, for the tuning log."""
    measurements: list[Measurement] = field(default_factory=list)

    def since(self, start: int) -> "Usage":
        return Usage(self.measurements[start:])

    def summary(self) -> str:
        ok = [m for m in self.measurements if m.ok]
        boards = Counter(m.board for m in self.measurements if m.board)
        text = (f"{len(ok)} of {len(self.measurements)} candidate(s) measured on "
                f"{len(boards)} board(s): " + (", ".join(f"{b} ({n})" for b, n in sorted(boards.items())) or "none"))
        retried = sum(m.retried for m in self.measurements)
        failed = [m for m in self.measurements if not m.ok]
        if retried:
            text += f"; {retried} retried"
        if failed:
            text += f"; {len(failed)} failed, last: {failed[-1].error}"
        return text


def board_runner(*, tracker: str, key: str, timeout: float = DEFAULT_TIMEOUT, grace: float = DEFAULT_GRACE,
                 log=print) -> "BoardRunner":
    """A MetaSchedule runner on the boards registered at `tracker` under `key`."""
    address = parse_address(tracker, what="--rpc-tracker")
    if not key:
        raise ValueError(f"--rpc-tracker {tracker} needs --rpc-key KEY (the key the boards registered under)")
    if not timeout > 0:
        raise ValueError(f"--rpc-timeout must be positive seconds, got {timeout}")
    boards = boards_under(tracker, key, timeout=min(timeout, 30.0))
    log(f"tracker {tracker}: {len(boards)} board(s) under key {key!r}: {', '.join(boards)}; "
        f"measuring {len(boards)} candidate(s) at a time")
    return BoardRunner(tracker=address, key=key, workers=len(boards), timeout=timeout, grace=grace)


@derived_object
class BoardRunner(PyRunner):
    """MetaSchedule's runner interface over our worker (the tracker's grant with the
    board's address, bounded waits, one retry)."""

    def __init__(self, *, tracker: tuple[str, int], key: str, workers: int, timeout: float, grace: float):
        from tvm.support.popen_pool import PopenPoolExecutor
        super().__init__()
        self.tracker, self.key, self.timeout = tracker, key, timeout
        self.limit = 2 * timeout + grace  # a grant, a session, and the worker's own start
        self.workers = workers
        self.pool = PopenPoolExecutor(max_workers=workers, timeout=self.limit)
        self.measured = Usage()
        self.boards_gone = False
        self._lock = threading.Lock()

    def usage(self) -> Usage:
        return self.measured

    def run(self, runner_inputs):
        return [_BoardFuture(self, runner_input) for runner_input in runner_inputs]

    def submit(self, runner_input):
        return self.pool.submit(_measure, self.tracker, self.key, self.timeout, str(runner_input.artifact_path),
                                str(runner_input.device_type),
                                tuple(arg.as_json() for arg in runner_input.args_info), EVALUATOR)

    def outcome(self, future) -> tuple[str | None, list[float] | str, bool]:
        """(board, run seconds or the error, whether it timed out)."""
        try:
            board, result = future.result()
            return board, result, False
        except TimeoutError:
            return None, f"killed after {self.limit:g} s without an answer", True
        except Exception as err:  # the worker process itself failed
            return None, _last_line(err), False

    def record(self, measurement: Measurement) -> None:
        with self._lock:
            self.measured.measurements.append(measurement)

    def boards_left(self) -> bool:
        """Whether the tracker still holds a board under the key (asked after a failure)."""
        if not self.boards_gone:
            try:
                boards_under(f"{self.tracker[0]}:{self.tracker[1]}", self.key, timeout=min(self.timeout, 30.0))
            except TrackerError:
                self.boards_gone = True
        return not self.boards_gone


@derived_object
class _BoardFuture(PyRunnerFuture):
    def __init__(self, runner, runner_input):
        super().__init__()
        self.runner, self.runner_input = runner, runner_input
        self.future = None if runner.boards_gone else runner.submit(runner_input)

    def done(self) -> bool:
        return self.future is None or self.future.done()

    def result(self) -> RunnerResult:
        runner = self.runner
        gone = f"no board left under key {runner.key!r}"
        if self.future is None:
            return self._failed(None, gone)
        board, outcome, timed_out = runner.outcome(self.future)
        if not isinstance(outcome, str):
            runner.record(Measurement(board, True))
            return RunnerResult(outcome, None)
        error = f"{_on(board)}{outcome}"
        # A candidate that ran out of time would most likely do so again: not retried. Any
        # other failure (a board that dropped) runs once more on a board the tracker grants.
        if timed_out:
            return self._failed(board, error)
        if not runner.boards_left():
            return self._failed(board, f"{error}; {gone}")
        board, again, _ = runner.outcome(runner.submit(self.runner_input))
        if not isinstance(again, str):
            runner.record(Measurement(board, True, retried=True))
            return RunnerResult(again, None)
        error += f"; retried: {_on(board)}{again}"
        return self._failed(board, error if runner.boards_left() else f"{error}; {gone}", retried=True)

    def _failed(self, board, error: str, *, retried: bool = False) -> RunnerResult:
        self.runner.record(Measurement(board, False, error, retried))
        return RunnerResult(None, error_msg=f"board runner: {error}")


def _on(board: str | None) -> str:
    return f"on {board}: " if board else ""


def _last_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[-1] if lines else type(err).__name__


def _measure(tracker: tuple[str, int], key: str, timeout: float, artifact_path: str, device_type: str,
             args_info: tuple, evaluator: EvaluatorConfig) -> tuple[str | None, list[float] | str]:
    """In a worker process: one candidate on the board the tracker grants; (board, run
    seconds), or (board or None, the error's last line)."""
    from tvm import rpc
    from tvm.s_tir.meta_schedule.runner.rpc_runner import default_cleanup, default_run_evaluator, default_upload_module
    try:
        host, port, matchkey = grant_board(tracker, key, wait=timeout)
    except TrackerError as err:
        return None, str(err)
    board, session = f"{host}:{port}", None
    remote_path = os.path.basename(artifact_path)
    try:
        session = rpc.connect(host, port, matchkey, session_timeout=timeout)
        module = default_upload_module(session, artifact_path, remote_path)
        device = session.device(device_type, 0)
        arguments = _arguments(session, device, args_info)
        return board, [float(c) for c in default_run_evaluator(session, module, device, evaluator, [arguments])]
    except Exception as err:  # the board's own words
        return board, _last_line(err)
    finally:
        if session is not None:
            try:
                default_cleanup(session, remote_path)
            except Exception:  # a board that dropped has nothing left to clean
                pass


def _arguments(session, device, args_info) -> list:
    """Random inputs on the board: filled there when it has tvm.contrib.random, else sent."""
    import tvm
    try:
        fill = session.get_function("tvm.contrib.random.random_fill_for_measure")
    except Exception:  # runtime-only TVM: "Module has no function ..."
        fill = None
    rng = np.random.default_rng(int(time.time()))
    arguments = []
    for kind, dtype, shape in args_info:
        if kind != "TENSOR":
            raise NotImplementedError(f"argument kind {kind}")
        tensor = tvm.runtime.empty(shape, dtype, device)
        if fill is not None:
            fill(tensor)
        elif np.dtype(dtype).kind == "f":
            tensor.copyfrom(rng.uniform(-1, 1, size=shape).astype(dtype))
        else:  # small integers: indices stay in range
            tensor.copyfrom(rng.integers(0, 2, size=shape).astype(dtype))
        arguments.append(tensor)
    return arguments
