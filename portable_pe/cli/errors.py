"""How a command's failure reaches the user: one line on stderr and an exit status.

    0    success            1   parity failed (a report was printed)
    2    bad input: a path, file, spec, number or bundle that is wrong, named in the message;
         also a busy bundle, an unreachable board, a missing toolchain
    3    a bug in portable-pe (the line says so; --debug shows the traceback)
    128+N  stopped by signal N: 130 for Ctrl-C, 143 for SIGTERM (partial files removed),
         141 when the reader of stdout went away (`portable-pe list | head`), silently

No Python traceback reaches the user unless --debug is given.
"""

from __future__ import annotations

import sys

from ..interrupts import Interrupted, outputs_complete, raise_if_interrupted

BAD_INPUT, INTERNAL = 2, 3


def run_command(command: str, fn, args, *, debug: bool = False) -> int:
    try:
        code = fn(args)
        outputs_complete()
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
        return code
    except KeyboardInterrupt as err:
        return interrupted(command, err)
    except BrokenPipeError:
        return reader_gone()
    except Exception as err:  # every failure becomes one line; --debug shows where it came from
        if debug:
            raise
        try:  # a signal that landed inside C++ code or a module's import arrives as another error
            raise_if_interrupted(err)
        except KeyboardInterrupt as signalled:
            return interrupted(command, signalled)
        code, message = describe(err)
        print(f"portable-pe {command}: {'error' if code == BAD_INPUT else 'internal error'}: {message}",
              file=sys.stderr)
        return code


def reader_gone() -> int:
    """Exit as a command killed by SIGPIPE would (141), without a message: `| head` got
    what it wanted. Python ignores SIGPIPE and raises instead; stdout is pointed at
    /dev/null so that the flush at exit does not raise again."""
    import os
    import signal
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 128 + signal.SIGPIPE


def interrupted(command: str, err: KeyboardInterrupt) -> int:
    """The line and exit status for Ctrl-C or a termination signal."""
    print(f"{('portable-pe ' + command).strip()}: interrupted ({err if isinstance(err, Interrupted) else 'SIGINT'}); "
          "no partial output was left", file=sys.stderr)
    return err.exit_code if isinstance(err, Interrupted) else 130


def describe(err: Exception) -> tuple[int, str]:
    """(exit status, message) for an exception."""
    if isinstance(err, OSError) and err.strerror:  # raised by the OS: say what and where
        where = f": {err.filename}" if err.filename else ""
        return BAD_INPUT, f"{err.strerror}{where}"
    if isinstance(err, (ValueError, OSError, RuntimeError)) and not isinstance(err, (RecursionError, NotImplementedError)):
        return BAD_INPUT, str(err).strip() or type(err).__name__
    if isinstance(err, MemoryError):
        return BAD_INPUT, "out of memory (try smaller --batch or --lengths)"
    text = str(err).strip().splitlines()
    return INTERNAL, (f"{type(err).__name__}: {text[-1] if text else ''} (a bug in portable-pe: "
                      "rerun with --debug for the traceback and report it)")

