"""Ctrl-C, SIGTERM and SIGHUP as one exception, so partial files are cleaned up.

The CLI installs the handlers: each signal raises Interrupted (a KeyboardInterrupt), which
`finally` blocks and write_bundle's cleanup see, and the CLI turns into exit 128 + signal
(130 for Ctrl-C, 143 for SIGTERM). TVM's C++ code turns an exception raised inside it into
its own RuntimeError with no message; the signal stays recorded here, so the compile
stages can tell an interrupt from a failure (`raise_if_interrupted`).
"""

from __future__ import annotations

import contextlib
import signal
import threading

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_received: list[int] = []


class Interrupted(KeyboardInterrupt):
    def __init__(self, signum: int = signal.SIGINT):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def _handler(signum, frame):
    _received.append(signum)
    raise Interrupted(signum)


def install() -> None:
    """Raise Interrupted on SIGINT, SIGTERM and SIGHUP (main thread only)."""
    if threading.current_thread() is threading.main_thread():
        for sig in SIGNALS:
            signal.signal(sig, _handler)


def ignore_from_now() -> None:
    """Ignore SIGINT, SIGTERM and SIGHUP for the rest of the process (main thread only).

    For the CLI process once its command has returned: its outputs are complete, and what
    is left is the interpreter's teardown (TVM's and torch's, about 0.5 s). Python restores
    the default handlers there, so a Ctrl-C in that window killed the process with status
    130 and no message, after the command had succeeded."""
    if threading.current_thread() is threading.main_thread():
        for sig in SIGNALS:
            signal.signal(sig, signal.SIG_IGN)


_ignore_once_complete = False


def ignore_once_complete() -> None:
    """For the CLI process (cli.main.entry): from the moment a command's outputs are
    complete (outputs_complete), signals are ignored. In-process callers of cli.main keep
    their handlers."""
    global _ignore_once_complete
    _ignore_once_complete = True


def outputs_complete() -> None:
    """A command's outputs are written: a Ctrl-C from here on, say from a reader that stops
    once it has seen the "wrote" line (at once when stdout is unbuffered), must not end
    the process with 130 and a message that nothing was written."""
    if _ignore_once_complete:
        ignore_from_now()


def raise_if_interrupted(err: BaseException) -> None:
    """Re-raise as Interrupted when `err` is what a signal turned into inside C++ code."""
    if _received and not isinstance(err, KeyboardInterrupt):
        raise Interrupted(_received[-1]) from err


@contextlib.contextmanager
def deferred():
    """Hold SIGINT/SIGTERM/SIGHUP until the block ends: renames and cleanups that must not
    stop half way run to the end, and the signal is raised right after. (A signal mask
    would not do: the OS may deliver the signal to any of TVM's or onnxruntime's threads.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: held.append(signum)) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if held:  # now, as if it came at this moment, to whatever handled it before
            signal.raise_signal(held[0])
