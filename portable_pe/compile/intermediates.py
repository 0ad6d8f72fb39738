"""--keep-intermediates: each stage's output, in BUNDLE.intermediates/ beside the bundle.

Dumps go to a hidden staging folder first. When the compile ends, successfully or not,
a staging folder that received anything replaces the previous BUNDLE.intermediates in
one rename; a compile that fails before its first dump (a bad spec) leaves the previous
one untouched. Only a folder of stage dumps (files named NN-...) is ever replaced.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from ..interrupts import deferred
from ..bundle.paths import OutputPathError, naming

_DUMP_NAME = re.compile(r"\d\d-[\w.-]+")


class Intermediates:
    def __init__(self, bundle_dest: Path, *, force: bool = False):
        self.dest = bundle_dest.parent / f"{bundle_dest.name}.intermediates"
        if self.dest.exists() and not force and not _is_dump_folder(self.dest):
            raise OutputPathError(
                f"--keep-intermediates would replace {self.dest}, which is not a folder of stage dumps "
                "(files named NN-...); refusing. Move it away, or --force to replace it")
        self.staging = bundle_dest.parent / f".{self.dest.name}.partial-{os.getpid()}"

    def dump(self, filename: str, content: str | bytes) -> None:
        self.staging.mkdir(parents=True, exist_ok=True)
        path = self.staging / filename
        try:
            with naming(self.dest / filename):  # a full disk: say which dump
                path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)
        except BaseException:  # no half-written dump; no empty staging folder to replace the last dumps with
            path.unlink(missing_ok=True)
            if not any(self.staging.iterdir()):
                self.staging.rmdir()
            raise

    def publish(self) -> Path | None:
        """Move this compile's dumps into place; None when there were none."""
        if not self.staging.is_dir():
            return None
        old = self.dest.parent / f".{self.dest.name}.old-{os.getpid()}"
        with deferred():
            if self.dest.exists():
                self.dest.rename(old)
            self.staging.rename(self.dest)
            if old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
            elif old.exists():
                old.unlink()
        return self.dest

    def discard(self) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)


def _is_dump_folder(path: Path) -> bool:
    return path.is_dir() and all(entry.is_file() and _DUMP_NAME.fullmatch(entry.name) for entry in path.iterdir())
