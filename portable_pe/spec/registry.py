"""TOML registries: one folder, one file per entry, the file's stem is the entry's name.

Graphs (graphs/), targets (targets/) and NPU profiles (targets/npu/) are all kept this way.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from ..user_files import require_file

#: the checkout: shipped graphs (graphs/) and targets (targets/) are read from it
ROOT = Path(__file__).resolve().parents[2]


def toml_registry(folder: Path) -> dict[str, Path]:
    """name -> path for every *.toml file in `folder`, sorted by name."""
    return {p.stem: p for p in sorted(folder.glob("*.toml"))}


def read_toml(path: Path, *, what: str) -> dict:
    """The parsed file; a missing or malformed file is an error that names it."""
    require_file(path, what=what)
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"{path}: not valid TOML: {err}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not valid TOML: the file is not UTF-8 text") from None
