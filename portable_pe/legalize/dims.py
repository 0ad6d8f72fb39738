"""The dims of a graph's inputs as sympy symbols.

A dim named in an input's shape (``T``, ``past``) is a positive integer symbol; a KV
cache's past length (``io_names.past_dims``: a dim only cache inputs have) is
``nonnegative``, since the prefill runs at ``past = 0``: sympy must not decide
``max(0, 1 - past)`` as 0. Exporter-written dim expressions (``past + T``) are parsed
into the same symbols.
"""

from __future__ import annotations

import re

import sympy

from ..spec.io_names import past_dims

_DIM_EXPR_RE = re.compile(r"^[A-Za-z0-9_+\-*/() ]+$")


def _past_dims(graph) -> set[str]:
    """The KV cache's past-length dims (io_names.past_dims): 0 at the prefill."""
    def describe(vis):
        return [{"name": vi.name, "dims": [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim]}
                for vi in vis if vi.type.HasField("tensor_type")]
    inits = {i.name for i in graph.initializer}
    return past_dims(describe(vi for vi in graph.input if vi.name not in inits), describe(graph.output))


def _symbol(name: str, past: set[str]) -> sympy.Symbol:
    # a past length may be 0: sympy must not decide max(0, 1 - past) as 0
    if name in past:
        return sympy.Symbol(name, integer=True, nonnegative=True)
    return sympy.Symbol(name, integer=True, positive=True)


def _dims(t, past: set[str] = frozenset()) -> list:
    res = []
    for d in t.shape.dim:
        if d.HasField("dim_value"):
            res.append(sympy.Integer(d.dim_value))
        elif d.HasField("dim_param") and not d.dim_param.startswith("unk__"):
            p = d.dim_param
            if p.isidentifier():
                res.append(_symbol(p, past))
            elif _DIM_EXPR_RE.match(p):
                try:
                    names = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", p))
                    loc = {n: _symbol(n, past) for n in names}
                    res.append(sympy.sympify(p.replace("//", "/"), locals=loc))
                except Exception:  # pylint: disable=broad-except
                    res.append(None)
            else:
                res.append(None)
        else:
            res.append(None)
    return res
