"""Bounds a graph imposes on its input dims, as typed records.

legalize finds them (MPT's ALiBi table of L rows: T <= L; with a KV cache T + past <= L;
a sliding window's cache: past <= W - 1) and records them in the model's metadata; the
compile narrows the bundle's dims to them, and the runtime refuses inputs beyond a bound
on a sum of dims (the manifest's ``dim_sums``, whose entries are DimBound.to_json()).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class DimBound:
    """sum(coefficient * dim) <= max over `terms` ({dim: coefficient})."""
    terms: dict[str, int]
    max: int
    why: str = field(default="", compare=False)

    @property
    def text(self) -> str:
        """The left side in words: "T", "T + past", "2*T + past"."""
        return " + ".join(d if c == 1 else f"{c}*{d}" for d, c in self.terms.items())

    def total(self, sizes: dict[str, int]) -> int | None:
        """The left side at `sizes` ({dim: size}), or None when a dim is not given."""
        if not all(d in sizes for d in self.terms):
            return None
        return sum(c * sizes[d] for d, c in self.terms.items())

    def to_json(self) -> dict:
        return {"dims": dict(self.terms), "max": self.max, **({"why": self.why} if self.why else {})}

    @classmethod
    def from_json(cls, data: dict) -> DimBound:
        return cls({str(d): int(c) for d, c in data["dims"].items()}, int(data["max"]), data.get("why", ""))


def apply_dim_bounds(io: dict, bounds: list[DimBound]) -> list[str]:
    """Narrow ``io["dims"]`` to the bounds the graph imposes; a bound on a sum of dims also
    goes to ``io["dim_sums"]``, which the runtime checks. Returns what changed, in words."""
    said = []
    for bound in bounds:
        if not all(d in io["dims"] for d in bound.terms):
            continue
        why = f"(the graph's shapes agree only up to {bound.text} = {bound.max})"
        for dim, coef in bound.terms.items():  # each dim alone, the others at their least
            rest = sum(c * io["dims"][o]["min"] for o, c in bound.terms.items() if o != dim)
            info = io["dims"][dim]
            if (bound.max - rest) // coef < info["max"]:
                info.update(max=(bound.max - rest) // coef, why=why)
        if len(bound.terms) > 1:
            io.setdefault("dim_sums", []).append(DimBound(bound.terms, bound.max, why).to_json())
        said.append(f"{bound.text} <= {bound.max}, where the graph's broadcasts agree")
    return said


def dim_sum_error(manifest: dict, sizes: dict[str, int]) -> str | None:
    """Why ``sizes`` ({dim: size}) break a bound on a sum of dims (``dim_sums``), or None."""
    for bound in map(DimBound.from_json, manifest.get("dim_sums", [])):
        total = bound.total(sizes)
        if total is not None and total > bound.max:
            return f"{bound.text} is {total}; this bundle accepts at most {bound.max} {bound.why}".strip()
    return None
