"""One writer per bundle: two compiles into the same --out would otherwise race on the
rename into place ("Directory not empty") and one would lose its work after the fact.

The lock is an flock on a file under the temp folder named after the bundle's resolved
path, so nothing is left in the user's folders and a killed writer's lock dies with it.
A second writer fails at once, naming the first one's pid.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import tempfile
from pathlib import Path

class BundleBusy(RuntimeError):
    """Another process is writing the same bundle."""


def _lock_file(dest: Path) -> Path:
    folder = Path(tempfile.gettempdir()) / f"portable-pe-locks-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder / (hashlib.sha256(str(dest).encode()).hexdigest()[:24] + ".lock")


@contextlib.contextmanager
def bundle_lock(dest: Path):
    """Hold the write lock of bundle folder `dest` (resolved). Taken once per write, by
    artifact.bundle_writer: a second holder, in this process or another, fails at once."""
    lock = _lock_file(Path(dest).resolve())
    fd = _acquire(lock, dest)
    try:
        yield
    finally:
        lock.unlink(missing_ok=True)
        os.close(fd)


def _acquire(lock: Path, dest: Path) -> int:
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").split("\n")[0] or "?"
            os.close(fd)
            raise BundleBusy(f"{dest} is being written by another portable-pe process (pid {holder}); "
                             "wait for it to finish, or write to another --out") from None
        try:  # the holder before us may have removed the file after we opened it: retry on the new one
            same = os.fstat(fd).st_ino == os.stat(lock).st_ino
        except FileNotFoundError:
            same = False
        if same:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n{dest}\n".encode())
            return fd
        os.close(fd)
