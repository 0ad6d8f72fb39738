"""Target specs (targets/<name>.toml) and the TARGETS registry.

A spec says which backend module builds for it (portable_pe/backends/<backend>.py, each
with the same functions), which TVM target to use, where the code runs, and tolerance
overrides. Nothing else in the package branches on a target's name or kind.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass, field
from pathlib import Path

from ..spec.registry import ROOT, read_toml, toml_registry

TARGETS_DIR = ROOT / "targets"
_KEYS = {"name", "description", "backend", "device", "planned", "tvm", "tolerance", "options"}


class TargetUnavailable(RuntimeError):
    """The target is registered but not built yet, or its toolchain is missing here."""


@dataclass(frozen=True)
class TargetSpec:
    name: str
    description: str
    backend: str
    device: str
    tvm: dict
    planned: str | None = None
    tolerance: dict = field(default_factory=dict)
    options: dict = field(default_factory=dict)

    def require_available(self) -> None:
        if self.planned:
            raise TargetUnavailable(f"target {self.name!r} is not available yet: {self.planned}")


TARGETS: dict[str, Path] = toml_registry(TARGETS_DIR)


def load_target(name: str) -> TargetSpec:
    if name not in TARGETS:
        raise ValueError(f"unknown target {name!r}; valid: {', '.join(TARGETS)}")
    path = TARGETS[name]
    data = read_toml(path, what="target spec")
    unknown = set(data) - _KEYS
    missing = {"name", "backend", "device", "tvm"} - set(data)
    if unknown or missing:
        raise ValueError(f"{path}: unknown keys {sorted(unknown)}, missing keys {sorted(missing)}")
    return TargetSpec(description=data.get("description", ""), **{k: v for k, v in data.items() if k != "description"})


def target_json(target) -> dict:
    """A TVM target as plain JSON, its host target included (json's default=list would
    write a nested target as the list of its keys)."""
    import tvm

    def plain(value):
        if isinstance(value, tvm.target.Target):
            return plain(value.export())
        if hasattr(value, "items"):
            return {str(k): plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)) or type(value).__name__ == "Array":
            return [plain(v) for v in value]
        return value if isinstance(value, (bool, int, float)) or value is None else str(value)
    return plain(target)


def target_arch(target) -> str:
    """The CPU architecture a TVM target builds for: its triple's first part, else this machine's."""
    triple = str(target.attrs.get("mtriple", "")) if "mtriple" in target.attrs else ""
    return triple.split("-")[0] if triple else platform.machine()
