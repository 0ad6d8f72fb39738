"""The artifact bundle: write it atomically, load it only if it verifies.

    <bundle>/model.so        TVM Relax executable for the target
    <bundle>/model.onnx      the simplified ONNX graph that was compiled
    <bundle>/reference.npz   seeded inputs and reference outputs, per length
    <bundle>/manifest.json   what it is, how it was made, sha256 of every file
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from .lock import bundle_lock
from ..interrupts import deferred
from .manifest import ManifestError, validate_manifest
from .paths import MANIFEST, bundle_destination, naming

#: 2: reference.npz is indexed by the manifest's reference.cases (bundle/reference.py)
FORMAT_VERSION = 2


class BundleError(ValueError):
    """A bundle that is missing, tampered with, truncated, or made for something else."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True)
class Bundle:
    path: Path
    manifest: dict

    def file(self, name: str) -> Path:
        return self.path / name

    @property
    def name(self) -> str:
        return self.manifest["graph"]["name"]

    @property
    def target(self) -> str:
        return self.manifest["target"]["name"]


@dataclass(frozen=True)
class BundleWriter:
    """A resolved bundle destination whose write lock is held (bundle_writer)."""
    dest: Path

    def write(self, files: dict[str, Path | bytes], manifest: dict) -> Bundle:
        return _write(self.dest, files, manifest)


@contextlib.contextmanager
def bundle_writer(dest: str | Path, *, replace_any: bool = False):
    """The one place a bundle's destination is resolved and its lock taken, held from the
    start of a compile to its end, so a second writer of the same bundle fails at once,
    not after its compile. `dest` may be an existing bundle or a new path (anything else
    only with `replace_any`, see paths.bundle_destination)."""
    dest = bundle_destination(dest, force=replace_any)
    with bundle_lock(dest):
        yield BundleWriter(dest)


def write_bundle(dest: Path, files: dict[str, Path | bytes], manifest: dict, *,
                 replace_any: bool = False) -> Bundle:
    """Write a bundle in one go (bundle_writer for a caller that holds the lock longer)."""
    with bundle_writer(dest, replace_any=replace_any) as writer:
        return writer.write(files, manifest)


def _write(dest: Path, files: dict[str, Path | bytes], manifest: dict) -> Bundle:
    """Write into a temporary sibling folder, then rename into place. A failure or a signal
    at any point leaves `dest` as it was (absent, or the previous good bundle)."""
    _recover_leftovers(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{dest.name}.partial-{os.getpid()}"
    old = dest.parent / f".{dest.name}.old-{os.getpid()}"
    tmp.mkdir()
    try:
        for name, content in files.items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)  # e.g. rknn/model.rknn
            with naming(dest / name):  # a full disk: say which file of the bundle
                if isinstance(content, bytes):
                    (tmp / name).write_bytes(content)
                else:
                    shutil.copyfile(content, tmp / name)
        manifest = {**manifest, "format_version": FORMAT_VERSION,
                    "files": {name: sha256_file(tmp / name) for name in sorted(files)}}
        validate_manifest(manifest, where=f"{dest / MANIFEST} (being written)")
        with naming(dest / MANIFEST):
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        with deferred():
            if dest.exists():
                dest.rename(old)
            tmp.rename(dest)
    except BaseException:
        with deferred():
            _remove(tmp)
            if old.exists() and not dest.exists():
                old.rename(dest)
        raise
    with deferred():
        _remove(old)
    return Bundle(dest, manifest)


def _recover_leftovers(dest: Path) -> None:
    """Folders a killed writer (SIGKILL, power loss) left next to `dest`. Under the bundle
    lock no one else writes here, so they are stale: partial ones go, and a previous
    bundle moved aside just before the kill goes back into place."""
    for partial in dest.parent.glob(f".{dest.name}.partial-*"):
        _remove(partial)
    for old in sorted(dest.parent.glob(f".{dest.name}.old-*")):
        if dest.exists():
            _remove(old)
        else:
            old.rename(dest)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink(missing_ok=True)


def load_bundle(path: str | Path, *, verify: bool = True) -> Bundle:
    """Load and verify a bundle: the manifest schema, format version, every checksum, and
    a checksum for every file in the folder."""
    if not str(path).strip():
        raise BundleError("the bundle path is empty; expected a bundle folder (with manifest.json)")
    path = Path(path)
    manifest_path = path / MANIFEST
    if path.is_file():
        raise BundleError(f"{path} is a file; expected a bundle folder (with {MANIFEST})")
    if not path.is_dir():
        raise BundleError(f"{path} is not a bundle folder (expected a folder with {MANIFEST})")
    if not manifest_path.is_file():
        raise BundleError(f"{path} has no {MANIFEST}: not a portable-pe bundle, or a partial one")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise BundleError(f"{manifest_path} is not valid JSON ({err}): the bundle is corrupt") from None
    version = manifest.get("format_version") if isinstance(manifest, dict) else None
    if isinstance(manifest, dict) and version != FORMAT_VERSION:
        raise BundleError(f"{manifest_path}: format_version is {version!r}; expected {FORMAT_VERSION}, the "
                          "version this portable-pe reads: recompile the bundle")
    try:
        validate_manifest(manifest, where=str(manifest_path))
    except ManifestError as err:
        raise BundleError(str(err)) from None
    if verify:
        for name, expected in manifest["files"].items():
            file = path / name
            if not file.is_file():
                raise BundleError(f"{file} is missing from the bundle")
            if sha256_file(file) != expected:
                raise BundleError(f"{file} does not match its checksum in {MANIFEST}: "
                                  "the file was modified or truncated; recompile or re-copy the bundle")
        listed = {*manifest["files"], MANIFEST}
        unlisted = sorted(str(p.relative_to(path)) for p in path.rglob("*")
                          if p.is_file() and str(p.relative_to(path)) not in listed)
        if unlisted:
            raise BundleError(f"{path} holds {', '.join(unlisted)}, which {MANIFEST}'s checksum list does not "
                              "cover: a bundle must hold only the files it lists (it was changed after it was "
                              "written); recompile or re-copy it")
    return Bundle(path, manifest)
