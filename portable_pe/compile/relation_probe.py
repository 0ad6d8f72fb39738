"""How a foreign graph's sequence dims relate, learned by running the graph with onnxruntime.

Every symbolic dim of a foreign file gets a size of its own in the inputs the compile
makes (the simplify check, the reference, parity). Most are independent (a KV cache's
``past`` and the new tokens' ``T``), but some are tied: the attention mask of an Optimum
or onnxruntime-genai export covers the cache and the new tokens, ``[1, past + T]``, under
a name of its own (torch.export's ``s53``). Fed an unrelated size, the graph indexes past
the mask ("GatherND ... invalid index found, index = 7"). The file does not say so, and
the mask is read through an index, not a broadcast, so no shape rule shows it: the graph
is run. Each dim gets its own size (two different sets); where that fails, each dim in
turn (the one in fewest inputs first) is tried as another dim, then as the sum of two,
and the first relation under which the graph runs at both sets is kept. ``--dim-relation
s53=past+T`` states one instead. A graph that runs only with every sequence dim at one
length (the old assumption) is kept so, with a note.
"""

from __future__ import annotations

from itertools import combinations

from ..run.parity import make_inputs
from ..spec.dims import DimRelation
from ..spec.io_names import SEQ, dim_roles

#: two size sets for the free dims, different in every dim and in every sum of two
_SIZES = ((7, 5, 3, 11, 13, 17), (4, 9, 6, 15, 19, 23))


class DimRelationError(ValueError):
    """The graph runs with its dims at no sizes the probe could relate."""


def learn_relations(model, io: dict, *, stated: tuple[DimRelation, ...] = (), log=print) -> dict:
    """`io` with ``dim_relations`` (JSON of DimRelation) when the graph's sequence dims are
    tied; `io` itself when they are independent."""
    seq = [d for d, info in io["dims"].items() if info.get("role") == SEQ]
    for relation in stated:
        unknown = sorted({relation.dim, *relation.terms} - set(io["dims"]))
        if unknown:
            raise ValueError(f"--dim-relation {relation.text}: the graph has no dim {', '.join(unknown)}; "
                             f"expected names of its symbolic dims: {', '.join(io['dims'])}")
    if len(seq) < 2 and not stated:
        return io
    from .simplify import ort_session
    session = ort_session(model, spin=False, quiet=True)
    relations, failure = list(stated), _failure(session, io, seq, list(stated))
    if failure is not None:
        relations, found_failure = _search(session, io, seq, list(stated), failure)
        pasts = [d for d in seq if io["dims"][d].get("past")]
        if found_failure is not None and len(pasts) > 1:
            # a flat cache has one past length: exports that name each cache input's own
            # (torch.export's Dim.AUTO) need those tied before a mask over past + T can be
            equal = [DimRelation(d, {pasts[0]: 1}) for d in pasts[1:] if d not in {r.dim for r in stated}]
            tied = list(stated) + equal
            relations, found_failure = _search(session, io, seq, tied, _failure(session, io, seq, tied))
        if found_failure is None:
            for relation in relations[len(stated):]:
                log(f"  dims: {relation.text} (the graph runs only so: at independent sizes onnxruntime says "
                    f"{failure})")
        failure = found_failure
    if failure is not None:
        if _runs_at_one_length(session, io):
            log(f"  dims: {', '.join(seq)} kept at one length in the checks: the graph fails with them at "
                f"different sizes ({failure}) and no relation found explains it; state one with "
                "--dim-relation DIM=DIM+DIM if they are tied")
            return io
        raise DimRelationError(
            f"onnxruntime cannot run the graph with its dims {', '.join(seq)} at independent sizes ({failure}), "
            "and no dim equal to another or to a sum of two made it run; state how they relate: "
            f"--dim-relation {seq[-1]}={'+'.join(seq[:2]) if len(seq) > 2 else seq[0]} (for example)")
    if not relations:
        return io
    return {**io, "dim_relations": [r.to_json() for r in relations]}


def _search(session, io, seq, relations, failure):
    """Relations added one dim at a time (the dim in fewest inputs first) until the graph
    runs at both size sets: (relations, None), or (relations tried, the last failure).
    `failure` is `relations`' own (_failure), which the caller has already run."""
    tied = {r.dim for r in relations}
    for dim in sorted((d for d in seq if d not in tied), key=lambda d: _inputs_with(io, d)):
        if failure is None:
            break
        found = _relation_for(session, io, seq, relations, dim)
        if found is not None:
            relations = [*relations, found]
            failure = _failure(session, io, seq, relations)
    return relations, failure


def _inputs_with(io: dict, dim: str) -> int:
    return sum(dim in i["dims"] for i in io["inputs"])


def _free_sizes(seq: list[str], relations, which: int) -> dict[str, int]:
    """Set `which` of sizes for the dims no relation ties (beyond six dims: 3, 4, 5, ...)."""
    tied = {r.dim for r in relations}
    free = [d for d in seq if d not in tied]
    sizes = _SIZES[which] if len(free) <= len(_SIZES[which]) else range(3 + which, 3 + which + len(free))
    return dict(zip(free, sizes))


def _failure(session, io: dict, seq: list[str], relations) -> str | None:
    """onnxruntime's words at the first size set where the graph fails, or None."""
    from .simplify import run_failure
    for which in (0, 1):
        sizes = _free_sizes(seq, relations, which)
        words = run_failure(session, make_inputs(io["inputs"], dim_roles=dim_roles(io), dim_sizes=sizes,
                                                 relations=relations))
        if words is not None:
            return f"at {', '.join(f'{d} = {n}' for d, n in sizes.items())}: {words}"
    return None


def _relation_for(session, io, seq, relations, dim) -> DimRelation | None:
    others = [d for d in seq if d != dim and d not in {r.dim for r in relations}]
    candidates = [{o: 1} for o in others] + [{a: 1, b: 1} for a, b in combinations(others, 2)]
    for terms in candidates:
        relation = DimRelation(dim, terms)
        if _failure(session, io, seq, [*relations, relation]) is None:
            return relation
    return None


def _runs_at_one_length(session, io: dict) -> bool:
    from .simplify import run_failure
    return run_failure(session, make_inputs(io["inputs"], length=7, dim_roles=dim_roles(io))) is None
