"""Where portable-pe may write: checked before any work, so nothing a user owns is lost.

    bundle_destination(path)    compile --out: replace only a bundle, or create a new path
    output_file(path, kind=)    run --out, --json: a new file, or one of the same kind
    output_folder(path)         bench --out: a folder (new or existing) to put reports in
    write_file_atomically(path, data)
    naming(path)                an OSError while writing path says which path (a full disk)

Never, even with force: "" (the shell's empty "$UNSET"), ".", a parent of the working
directory, the home folder or the portable-pe checkout; nor a path inside a bundle (a
bundle holds exactly the files its manifest lists).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import zipfile
from pathlib import Path

from ..spec.registry import ROOT

MANIFEST = "manifest.json"
_CHECKOUT = ROOT


class OutputPathError(ValueError):
    """An output path that would lose data, or that cannot be written."""


def is_bundle_folder(path: Path) -> bool:
    """A folder whose manifest.json is a portable-pe manifest (a JSON object with a
    format_version) and whose subfolders (a vendor build's rknn/, vela/) hold only files
    that manifest lists: what compile may replace without --force."""
    try:
        if not (path.is_dir() and (path / MANIFEST).is_file()):
            return False
        manifest = json.loads((path / MANIFEST).read_text())
        if not (isinstance(manifest, dict) and "format_version" in manifest):
            return False
        listed = set(manifest.get("files") or {}) if isinstance(manifest.get("files"), dict) else set()
        for entry in path.rglob("*"):
            if entry.is_symlink() or (entry.parent != path and entry.is_file()
                                      and str(entry.relative_to(path)) not in listed):
                return False  # a subfolder holding something of the user's
    except (OSError, ValueError):
        return False
    return True


def bundle_destination(path: str | Path, *, force: bool = False, option: str = "--out") -> Path:
    """The resolved bundle folder to write, after refusing anything that would lose data.

    An existing bundle is replaced (atomically, by write_bundle); an existing file or a
    folder that is not a bundle only with `force`."""
    dest = _resolved(path, option)
    _refuse_protected(dest, path, option)
    _refuse_inside_bundle(dest, path, option)
    if dest.is_dir() and not is_bundle_folder(dest) and not force:
        raise OutputPathError(
            f"{option} {path}: {dest} is a folder that is not a portable-pe bundle (no manifest.json of "
            "ours, or a subfolder holds files it does not list); refusing to replace it. Give a new path, or --force to replace it")
    if dest.exists() and not dest.is_dir() and not force:
        raise OutputPathError(f"{option} {path}: {dest} is a file, not a bundle folder; refusing to replace "
                              "it. Give a new path, or --force to replace it")
    _require_writable_parent(dest, path, option)
    return dest


def output_file(path: str | Path, *, kind: str, option: str, protect: tuple[Path, ...] = ()) -> Path:
    """A file to write `kind` ("npz" or "json") to: new, or an existing file of that kind.
    `protect`: input files this command reads, which must not be overwritten."""
    dest = _resolved(path, option)
    _refuse_inside_bundle(dest, path, option)
    if dest.is_dir():
        raise OutputPathError(f"{option} {path} is a folder; expected the path of a .{kind} file to write")
    if any(dest == Path(p).resolve() for p in protect):
        raise OutputPathError(f"{option} {path} is also an input of this command; refusing to overwrite it. "
                              "Write the result elsewhere")
    if dest.exists() and not dest.is_file():  # a device (/dev/full, /dev/zero) or a socket: never read it
        raise OutputPathError(f"{option} {path} is not a regular file; expected the path of a .{kind} file to write")
    if dest.exists() and not _is_kind(dest, kind):
        raise OutputPathError(f"{option} {path} exists and is not a .{kind} file portable-pe wrote; "
                              "refusing to overwrite it. Give a new path, or remove the file first")
    _require_writable_parent(dest, path, option)
    return dest


def output_folder(path: str | Path, *, option: str, files: tuple[str, ...] = ()) -> Path:
    """A folder (new or existing) for report `files`; none of them may be a folder."""
    dest = _resolved(path, option)
    _refuse_inside_bundle(dest, path, option)
    if dest.exists() and not dest.is_dir():
        raise OutputPathError(f"{option} {path} is a file; expected a folder to write {', '.join(files)} into")
    for name in files:
        if (dest / name).is_dir():
            raise OutputPathError(f"{option} {path}: {dest / name} is a folder; expected to write a file there")
    _require_writable_parent(dest / (files[0] if files else "x"), path, option)
    return dest


def write_file_atomically(path: Path, data: bytes) -> None:
    """Write to a temporary sibling, then rename over `path`: never half written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        with naming(path), os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def naming(path: Path):
    """Re-raise an OSError that names no file, or names only the source of a copy, as one
    that names `path`, the file being written: a full disk's "No space left on device"
    comes from write() and close() without a filename (shutil.copyfile names the source
    first), and the CLI's one line (cli/errors.py describe) should say where."""
    try:
        yield
    except OSError as err:
        if err.errno is None or (err.filename is not None and err.filename2 is None):
            raise
        raise OSError(err.errno, err.strerror or os.strerror(err.errno), str(path)) from err


def _resolved(path: str | Path, option: str) -> Path:
    if not str(path).strip():
        raise OutputPathError(f"{option} is empty (an unset shell variable?); expected a path to write to")
    return Path(path).resolve()


def _refuse_protected(dest: Path, given, option: str) -> None:
    cwd = Path.cwd().resolve()
    protected = {cwd: "the working directory", Path.home().resolve(): "your home folder",
                 _CHECKOUT: "the portable-pe checkout"}
    for place, what in protected.items():
        if dest == place:
            raise OutputPathError(f"{option} {given!s} is {what} ({dest}); a bundle replaces its folder "
                                  "as a whole, so portable-pe never writes one there. Give a new folder, "
                                  "e.g. dist/<graph>-<target>")
        if dest in place.parents:
            raise OutputPathError(f"{option} {given!s} ({dest}) contains {what} ({place}); a bundle replaces "
                                  "its folder as a whole, so portable-pe never writes one there. Give a new folder")


def _refuse_inside_bundle(dest: Path, given, option: str) -> None:
    for folder in dest.parents:
        if is_bundle_folder(folder):
            raise OutputPathError(f"{option} {given!s} is inside the bundle {folder}: a bundle holds only the "
                                  "files its manifest lists. Write it outside the bundle")


def _require_writable_parent(dest: Path, given, option: str) -> None:
    """The nearest existing ancestor must be a folder this process can create files in."""
    folder = dest.parent
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        raise OutputPathError(f"{option} {given!s}: {folder} is a file, not a folder")
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        raise OutputPathError(f"{option} {given!s}: cannot write in {folder} ({err.strerror or err})") from None


def _is_kind(path: Path, kind: str) -> bool:
    try:
        if kind == "npz":
            with zipfile.ZipFile(path) as z:
                return all(name.endswith(".npy") for name in z.namelist())
        if kind == "json":
            json.loads(path.read_text())
            return True
    except (OSError, ValueError, zipfile.BadZipFile):
        return False
    raise ValueError(f"unknown output kind {kind!r}")
