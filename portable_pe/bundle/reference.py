"""A bundle's reference data as typed records: written and read here, and nowhere else.

    reference.npz   one array per (case, role, name); the keys are ours to choose and no
                    reader parses them
    manifest.json   reference.cases: [{"length": 128, "inputs": {"x": KEY, ...},
                                       "outputs": {"hidden": KEY}}, ...]
                    (a vision bundle's cases have "sizes": {"height": 32, "width": 48})

The manifest's index says which array is which, so the bundle's own run_on_board.py
(which cannot import portable-pe) reads the same records without knowing how keys are
spelled. A vendor's stored simulator outputs (rknn/simulator.npz) use the same index.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class ReferenceCase:
    """Seeded inputs at one length (or, for a vision bundle, one size: {role: pixels})
    and what the reference computed from them."""
    length: int | None
    inputs: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]
    sizes: dict[str, int] | None = None

    @property
    def label(self) -> str:
        return f"T{self.length}" if self.sizes is None else "x".join(map(str, self.sizes.values()))


def find_case(cases, length: int) -> ReferenceCase:
    """The case at `length`; a missing one is an error naming the lengths there are."""
    for case in cases:
        if case.length == length:
            return case
    raise KeyError(f"no reference case at length {length}; the bundle has {[c.length for c in cases]}")


def _key(case: ReferenceCase, role: str, name: str) -> str:
    return f"{case.label}/{role}/{name}"


def write_cases(cases) -> tuple[bytes, list[dict]]:
    """(the .npz bytes, the manifest's index of it) for `cases`; a case's outputs may be
    empty (a vendor simulator's stored outputs have no inputs of their own)."""
    arrays, index = {}, []
    for case in sorted(cases, key=lambda c: (c.length or 0, list((c.sizes or {}).values()))):
        entry = {**({"length": case.length} if case.sizes is None else {"sizes": dict(case.sizes)}),
                 "inputs": {}, "outputs": {}}
        for role, short, values in (("inputs", "in", case.inputs), ("outputs", "out", case.outputs)):
            for name, value in values.items():
                entry[role][name] = key = _key(case, short, name)
                arrays[key] = value
        index.append(entry)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue(), index


def read_cases(npz_path: Path, index: list[dict]) -> list[ReferenceCase]:
    """The records `index` describes, from the .npz at `npz_path`."""
    with np.load(npz_path) as npz:
        return [ReferenceCase(entry.get("length"), {n: npz[k] for n, k in entry["inputs"].items()},
                              {n: npz[k] for n, k in entry["outputs"].items()}, entry.get("sizes")) for entry in index]


def bundle_cases(bundle) -> list[ReferenceCase]:
    """A bundle's reference cases (reference.npz, indexed by manifest.json)."""
    return read_cases(bundle.file("reference.npz"), bundle.manifest["reference"]["cases"])
