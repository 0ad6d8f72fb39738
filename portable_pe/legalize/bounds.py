"""Min/Max of dims decided where one side wins for every input the graph runs on, and
upper bounds on input dims (or on a sum of them) that a graph itself imposes.

A dim symbol is at least 1, a KV cache's past length at least 0 (its sympy symbol is
``nonnegative`` rather than ``positive``). ``decide`` drops every argument of a Min/Max
that provably loses for all such values: ``max(0, 1 - past - 2 * T)`` is 0. What stays
undecided (a sliding window's ``max(0, past - 4095)``) is kept: TVM carries it as
``tirx.max`` (``onnx_ops.minmax``).

MPT precomputes its ALiBi table for ``max_seq_len`` positions (L) and slices the last
``T`` (with a cache ``past + T``) of them: ``table[..., max(0, L - T):]``, a length
``L - Max(0, L - T)``. That is ``T`` only for ``T <= L``; the attention scores it is
added to make the graph run only there (beyond, the broadcast of ``T`` against ``L``
fails). Without the bound, the Add's dim stays undecided, and TVM loses the shape.

``bound_from_broadcast`` finds such a bound: two dims broadcast together that are equal
exactly for ``f <= U``, f a dim or a sum of dims (``T``, ``past + T``), and not 1 at
``f = U + 1`` (the graph fails there: the bound only names the inputs the graph runs on).
``under`` decides Min/Max also under the bounds found (``Max(0, L - T)`` becomes
``L - T``), which is exact wherever the graph runs; the compiler records the bound in
the manifest, so the runtime refuses larger inputs.
"""

from __future__ import annotations

import math

import sympy


def _has_minmax(e) -> bool:
    return isinstance(e, sympy.Basic) and e.has(sympy.Min, sympy.Max)


def low(s) -> int:
    """The smallest value dim symbol s takes: 0 for a past length, else 1."""
    return 1 if s.is_positive else 0


def _linear(e) -> dict | None:
    """{symbol or 1: coefficient} of a linear expression with number coefficients, or None."""
    e = sympy.expand(e)
    try:
        poly = sympy.Poly(e, *sorted(e.free_symbols, key=str)) if e.free_symbols else None
    except sympy.PolynomialError:
        return None
    if poly is None:
        return {1: e} if e.is_number else None
    if poly.total_degree() > 1 or not all(c.is_number for c in poly.coeffs()):
        return None
    terms = {1: poly.coeff_monomial(1)}
    terms.update({s: poly.coeff_monomial(s) for s in poly.gens})
    return terms


def nonnegative(d, bounds: dict | None = None) -> bool:
    """d >= 0 for every dim >= its low and every bound f <= U (a sufficient check).

    d is linear: d = c + sum(k_s * s). With s = low(s) + t_s (t_s >= 0) it is provably
    nonnegative when every k_s >= 0 and its value at the lows is. A bound f <= U adds a
    slack u = U - f >= 0: d = lam * u + (d + lam * f - lam * U), lam >= 0 chosen to make the
    coefficients of the symbols of f nonnegative."""
    if _has_minmax(d):  # each Min/Max is one of its arguments: true for all of them is enough
        picks = _branches(sympy.expand(d))
        return picks is not None and all(nonnegative(b, bounds) for b in picks)
    terms = _linear(d)
    if terms is None:
        return False
    tries = [({}, 0)] + [(_linear(f), top) for f, top in (bounds or {}).items()]
    for form, top in tries:
        if form is None:
            continue
        form = {s: k for s, k in form.items() if s != 1}
        lam = max([0] + [-terms.get(s, 0) / k for s, k in form.items()])
        coeffs = {s: terms.get(s, 0) + lam * form.get(s, 0) for s in set(terms) | set(form) if s != 1}
        if any(k < 0 for k in coeffs.values()):
            continue
        if terms[1] - lam * top + sum(k * low(s) for s, k in coeffs.items()) >= 0:
            return True
    return False


def _branches(e, limit: int = 64) -> list | None:
    """e with every Min/Max replaced by one of its arguments, every way (None past limit)."""
    atom = next((a for a in sympy.preorder_traversal(e) if isinstance(a, (sympy.Min, sympy.Max))), None)
    if atom is None:
        return [e]
    found = []
    for arg in atom.args:
        sub = _branches(e.xreplace({atom: arg}), limit)
        if sub is None or len(found) + len(sub) > limit:
            return None
        found.extend(sub)
    return found


def decide(e, bounds: dict | None = None):
    """e with the arguments of every Min/Max that provably lose dropped (innermost first)."""
    if not _has_minmax(e):
        return e
    args = [decide(a, bounds) for a in e.args]
    if isinstance(e, (sympy.Max, sympy.Min)):
        sign = 1 if isinstance(e, sympy.Max) else -1  # Max keeps a over b when a - b >= 0
        keep = [a for i, a in enumerate(args)
                if not any(nonnegative(sign * (b - a), bounds) and (j < i or not nonnegative(sign * (a - b), bounds))
                           for j, b in enumerate(args) if j != i)]
        return keep[0] if len(keep) == 1 else type(e)(*keep)
    return e.func(*args)


def under(e, bounds: dict):
    """e with every Min/Max decided for the dim lows and the bounds {f: U} (f <= U)."""
    return sympy.expand(decide(e, bounds)) if _has_minmax(e) else e


def _candidates(e) -> set[tuple]:
    """(f, U): where two arguments of a Min/Max in e cross, f <= U with f a dim or a sum of
    dims of positive integer coefficients (their gcd 1)."""
    found = set()
    for atom in e.atoms(sympy.Min, sympy.Max):
        args = list(atom.args)
        for i, a in enumerate(args):
            for b in args[i + 1:]:
                terms = _linear(a - b)
                if terms is None or len(terms) < 2:
                    continue
                ks = [k for s, k in terms.items() if s != 1]
                if not all(k.is_Integer for k in ks) or not (all(k > 0 for k in ks) or all(k < 0 for k in ks)):
                    continue
                sign = 1 if ks[0] > 0 else -1
                g = math.gcd(*[int(k) for k in ks])
                form = sum(sign * k / g * s for s, k in terms.items() if s != 1)
                found.add((form, int(sympy.floor(-sign * terms[1] / g))))  # f = -c / g where they cross
    return found


def bound_from_broadcast(a, b):
    """(f, U) if dims a and b are equal exactly for f <= U (and both not 1 above), else None;
    f is a dim symbol or a sum of dims."""
    if a is None or b is None or not (_has_minmax(a) or _has_minmax(b)):
        return None
    diff = sympy.expand(a - b)
    if not diff.free_symbols:
        return None
    for form, top in sorted(_candidates(a) | _candidates(b), key=lambda c: -c[1]):
        if top < 1 or not form.free_symbols <= diff.free_symbols | a.free_symbols | b.free_symbols:
            continue
        if sympy.expand(under(diff, {form: top})) != 0:
            continue
        above = _just_above(form, top, a, b)
        if above is not None and above[0] != above[1] and 1 not in above:
            return form, top
    return None


def _just_above(form, top, a, b):
    """a and b at a point where f = top + 1 (other dims at their lows), or None."""
    syms = sorted(form.free_symbols, key=str)
    for s in syms:  # the one that moves: coefficient 1 reaches top + 1 exactly
        k = form.coeff(s)
        rest = {o: low(o) for o in syms if o != s}
        value = (top + 1 - form.subs(s, 0).subs(rest)) / k
        if value.is_Integer and value >= low(s):
            point = {**rest, s: value}
            point.update({o: low(o) for o in (a.free_symbols | b.free_symbols) - set(point)})
            vals = [sympy.sympify(x).subs(point) for x in (a, b)]
            return vals if all(v.is_number for v in vals) else None
    return None


def bound_from_attention(mask_len, total):
    """Attention's mask against its keys (past + new): the bound_from_broadcast bound, where
    above it the mask is the longer one (Attention-24 pads a shorter mask; nothing takes a
    longer one)."""
    found = bound_from_broadcast(mask_len, total)
    if found is None:
        return None
    above = _just_above(*found, mask_len, total)
    return found if above is not None and above[0] > above[1] else None
