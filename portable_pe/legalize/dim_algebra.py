"""Arithmetic on symbolic dims (sympy expressions of the graph inputs' dims, None where a
dim is not known): equality for every value of the dims, numpy broadcasting, axes."""

from __future__ import annotations

import numpy as np
import sympy


def same(a, b) -> bool:
    """a == b for every value of the symbols (dims are positive integers)."""
    if a is None or b is None:
        return False
    return sympy.expand(a - b) == 0


def _n(v) -> int | None:
    """An int for a known number, else None."""
    return int(v) if v is not None and getattr(v, "is_number", False) else None


def broadcast(*shapes):
    """Numpy broadcasting of symbolic shapes; a dim that cannot be decided is None."""
    if any(s is None for s in shapes):
        return None
    rank = max(len(s) for s in shapes)
    out = []
    for i in range(rank):
        dims = [s[i - rank + len(s)] for s in shapes if i - rank + len(s) >= 0]
        known = [d for d in dims if d is not None and not (d.is_number and int(d) == 1)]
        if len(known) < len([d for d in dims if d is None or not (d.is_number and int(d) == 1)]):
            out.append(None)  # an unknown dim next to non-1 dims: could be 1 or not
            continue
        if not known:
            out.append(sympy.Integer(1) if all(d is not None for d in dims) else None)
        elif all(same(known[0], d) for d in known[1:]):
            out.append(known[0])
        else:
            out.append(None)
    return out


def _ax(a, rank):
    return a + rank if a < 0 else a


def _vals(v):
    return None if v is None else [e for e in np.asarray(v, dtype=object).ravel()]


def rule_registry():
    """(a table op_type -> shape rule, the decorator that fills it: @rule("Conv", ...))."""
    table: dict = {}

    def rule(*ops):
        def register(fn):
            for op in ops:
                table[op] = fn
            return fn
        return register
    return table, rule
