"""Bounds a graph imposes on its input dims, as typed records.

legalize finds them (MPT's ALiBi table of L rows: T <= L; with a KV cache T + past <= L;
a sliding window's cache: past <= W - 1) and records them in the model's metadata; the
compile narrows the bundle's dims to them, and the runtime refuses inputs beyond a bound
on a sum of dims (the manifest's ``dim_sums``, whose entries are DimBound.to_json()).

Relations tie a dim to others (``DimRelation``: an attention mask's ``s53 = past + T``):
learned where the graph is tried (compile.relation_probe) or stated with --dim-relation,
recorded as the manifest's ``dim_relations``; every input made for a check, the reference
or parity follows them, and the runtime refuses inputs that break one.
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


@dataclass(frozen=True)
class DimRelation:
    """dim == sum(coefficient * other) over `terms`: a dim the graph ties to others, such as
    an attention mask over the cache and the new tokens (``s53 = past + T``)."""
    dim: str
    terms: dict[str, int]
    how: str = field(default="learned", compare=False)  # learned (by the graph) or stated (--dim-relation)

    @property
    def text(self) -> str:
        return f"{self.dim} = " + " + ".join(d if c == 1 else f"{c}*{d}" for d, c in self.terms.items())

    def size(self, sizes: dict[str, int]) -> int:
        return sum(c * sizes[d] for d, c in self.terms.items())

    def to_json(self) -> dict:
        return {"dim": self.dim, "terms": dict(self.terms), "how": self.how}

    @classmethod
    def from_json(cls, data: dict) -> DimRelation:
        return cls(str(data["dim"]), {str(d): int(c) for d, c in data["terms"].items()}, data.get("how", "learned"))

    @classmethod
    def parse(cls, text: str) -> DimRelation:
        """``s53=past+T`` (--dim-relation): a dim, '=', and a sum of dims, each optionally k*dim."""
        import re
        dim, _, rhs = text.partition("=")
        terms, ok = {}, bool(dim.strip() and rhs.strip())
        for part in rhs.split("+"):
            m = re.fullmatch(r"\s*(?:(\d+)\s*\*\s*)?([A-Za-z_][\w.]*)\s*", part)
            if not m:
                ok = False
                break
            terms[m[2]] = terms.get(m[2], 0) + int(m[1] or 1)
        if not ok or dim.strip() in terms:
            raise ValueError(f"--dim-relation {text!r}: expected DIM=DIM[+DIM...] with each term a dim name or "
                             "k*name, the dim on the left not on the right (e.g. s53=past+T)")
        return cls(dim.strip(), terms, "stated")


def relations_of(io: dict) -> list[DimRelation]:
    """The relations a manifest (or describe_io's result) records (``dim_relations``)."""
    return [DimRelation.from_json(r) for r in io.get("dim_relations", [])]


def relation_error(manifest: dict, sizes: dict[str, int]) -> str | None:
    """Why ``sizes`` ({dim: size}) break a relation the bundle records, or None."""
    for relation in relations_of(manifest):
        if relation.dim in sizes and all(d in sizes for d in relation.terms):
            want = relation.size(sizes)
            if sizes[relation.dim] != want:
                given = ", ".join(f"{d} = {sizes[d]}" for d in relation.terms)
                return (f"dim {relation.dim} is {sizes[relation.dim]}, but this graph needs {relation.text} "
                        f"(= {want} with {given})")
    return None
