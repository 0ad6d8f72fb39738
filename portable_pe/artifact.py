"""The artifact bundle: write it atomically, load it only if it verifies.

    <bundle>/model.so        TVM Relax executable for the target
    <bundle>/model.onnx      the simplified ONNX graph that was compiled
    <bundle>/reference.npz   seeded inputs and reference outputs, per length
    <bundle>/manifest.json   what it is, how it was made, sha256 of every file
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

FORMAT_VERSION = 1
MANIFEST = "manifest.json"


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


def write_bundle(dest: Path, files: dict[str, Path | bytes], manifest: dict) -> Bundle:
    """Write into a temporary sibling folder, then rename into place.

    A failure at any point leaves `dest` as it was (absent, or the previous good bundle).
    """
    dest = Path(dest).resolve()
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{dest.name}.partial-{os.getpid()}"
    old = dest.parent / f".{dest.name}.old-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        for name, content in files.items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)  # e.g. rknn/model.rknn
            if isinstance(content, bytes):
                (tmp / name).write_bytes(content)
            else:
                shutil.copyfile(content, tmp / name)
        manifest = {**manifest, "format_version": FORMAT_VERSION,
                    "files": {name: sha256_file(tmp / name) for name in sorted(files)}}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        if dest.exists():
            dest.rename(old)
        tmp.rename(dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old.exists() and not dest.exists():
            old.rename(dest)
        raise
    shutil.rmtree(old, ignore_errors=True)
    return Bundle(dest, manifest)


def load_bundle(path: str | Path, *, verify: bool = True) -> Bundle:
    """Load and verify a bundle: format version, every checksum, no missing file."""
    path = Path(path)
    manifest_path = path / MANIFEST
    if not path.is_dir():
        raise BundleError(f"{path} is not a bundle folder (expected a folder with {MANIFEST})")
    if not manifest_path.is_file():
        raise BundleError(f"{path} has no {MANIFEST}: not a portable-pe bundle, or a partial one")
    try:
        manifest = json.loads(manifest_path.read_text())
    except json.JSONDecodeError as err:
        raise BundleError(f"{manifest_path} is not valid JSON ({err}): the bundle is corrupt") from None
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise BundleError(f"{manifest_path}: format version {version!r}, this portable-pe reads "
                          f"version {FORMAT_VERSION}; recompile the bundle")
    if verify:
        for name, expected in manifest.get("files", {}).items():
            file = path / name
            if not file.is_file():
                raise BundleError(f"{file} is missing from the bundle")
            if sha256_file(file) != expected:
                raise BundleError(f"{file} does not match its checksum in {MANIFEST}: "
                                  "the file was modified or truncated; recompile or re-copy the bundle")
    return Bundle(path, manifest)
