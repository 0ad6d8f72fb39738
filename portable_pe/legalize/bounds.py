"""Upper bounds on input dims that a graph itself imposes, and dims simplified under them.

MPT precomputes its ALiBi table for ``max_seq_len`` positions (L) and slices the last
``T`` of them: ``table[..., max(0, L - T):]``, a length ``L - Max(0, L - T)``. That is
``T`` only for ``T <= L``; the attention scores ``[.., T, T]`` it is added to make the graph
run only there (for ``T > L`` the broadcast of ``T`` against ``L`` fails). Without the
bound, the Add's dim stays undecided, and the slice start ``Max(0, L - T)`` reaches TVM's
importer as a Max of PrimValues, which it cannot convert.

``bound_from_broadcast`` finds such a bound: two dims broadcast together that are equal
exactly for ``s <= U`` (and not 1 at ``s = U + 1``, so the graph fails there: the bound
only names the inputs the graph runs on). ``under`` then rewrites a dim for ``s <= U``
(``Max(0, L - T)`` becomes ``L - T``), which is exact wherever the graph runs; the
compiler records ``U`` as the dim's maximum, so the runtime refuses longer inputs.
"""

from __future__ import annotations

import sympy


def _has_minmax(e) -> bool:
    return isinstance(e, sympy.Basic) and e.has(sympy.Min, sympy.Max)


def under(e, bounds: dict):
    """e with every Min/Max decided for symbol s <= bounds[s] (dims are >= 1)."""
    if not _has_minmax(e):
        return e
    for s, top in bounds.items():
        if s in e.free_symbols:
            t = sympy.Dummy("t", integer=True, nonnegative=True)  # s = top - t
            e = sympy.expand(sympy.expand(e.subs(s, top - t)).subs(t, top - s))
    return e


def _candidates(e, s) -> set[int]:
    """Where two arguments of a Min/Max in e cross, as integer values of s."""
    found = set()
    for atom in e.atoms(sympy.Min, sympy.Max):
        args = list(atom.args)
        for i, a in enumerate(args):
            for b in args[i + 1:]:
                diff = sympy.expand(a - b)
                if diff.free_symbols == {s} and sympy.degree(diff, s) == 1:
                    root = sympy.solve(diff, s)[0]
                    if root.is_number:
                        found.add(int(sympy.floor(root)))
    return found


def bound_from_broadcast(a, b):
    """(s, U) if dims a and b are equal exactly for s <= U (and both not 1 above), else None."""
    if a is None or b is None or not (_has_minmax(a) or _has_minmax(b)):
        return None
    diff = sympy.expand(a - b)
    if len(diff.free_symbols) != 1:
        return None
    (s,) = diff.free_symbols
    for top in sorted(_candidates(a, s) | _candidates(b, s), reverse=True):
        if top < 1 or sympy.expand(under(diff, {s: top})) != 0:
            continue
        above = [sympy.sympify(x).subs(s, top + 1) for x in (a, b)]
        if all(v.is_number for v in above) and above[0] != above[1] and 1 not in above:
            return s, top
    return None
