"""Where the legalize stage loses a shape: the first node whose output dims are not an
expression of the graph inputs' dims, or whose shape operand has no dim program.

``portable-pe inspect MODEL.onnx`` prints it with what the node saw: each input's
symbolic shape and, for small integer inputs, their symbolic values.
"""

from __future__ import annotations

import copy

import numpy as np
import onnx

from .graph import _infer
from .symbolic import _Sym


def _show_dims(dims) -> str:
    if dims is None:
        return "?"
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def _show_value(val) -> str:
    flat = [str(e) for e in np.asarray(val, dtype=object).ravel()]
    return ("[" + ", ".join(flat) + "]") if np.ndim(val) else flat[0]


def _seen(sym: _Sym, node: onnx.NodeProto) -> list[str]:
    seen = []
    for name in node.input:
        if not name:
            continue
        text = f"{name}: {_show_dims(sym.shape.get(name))}"
        if name in sym.val and sym.isint.get(name):
            text += f" = {_show_value(sym.val[name])}"
        seen.append(text)
    return seen


def first_unfollowed(model: onnx.ModelProto) -> dict | None:
    """The first node (graph order) whose shape legalize cannot follow, or None.

    Returns {"node", "op", "why", "inputs": ["name: [dims] = value", ...],
    "outputs": ["name: [dims]", ...]}."""
    from . import legalize  # pylint: disable=import-outside-toplevel
    from .rewrite import _Rewriter  # pylint: disable=import-outside-toplevel
    model = legalize(model)
    sym = _Sym(_infer(model).graph)
    sym.run()
    unexpressed = _Rewriter(copy.deepcopy(model), sym).dry_run()
    for index, node in enumerate(model.graph.node):
        outs = [o for o in node.output if o]
        lost = [o for o in outs if sym.shape.get(o) is None
                or not all(sym.followed(d) for d in sym.shape[o])]
        why = None
        if index in unexpressed:
            k, detail = unexpressed[index]
            why = f"input {node.input[k]!r} has no dim program: {detail}"
        elif lost:
            why = f"output dims of {', '.join(lost)} are not expressions of the input dims"
        if why:
            return {"node": node.name or outs[0], "op": node.op_type, "why": why,
                    "inputs": _seen(sym, node),
                    "outputs": [f"{o}: {_show_dims(sym.shape.get(o))}" for o in outs]}
    return None


def input_dims(model: onnx.ModelProto) -> list[str]:
    """The symbolic dims of the graph inputs (what every shape is an expression of)."""
    inits = {i.name for i in model.graph.initializer}
    names = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        for d in vi.type.tensor_type.shape.dim:
            if d.dim_param and d.dim_param not in names:
                names.append(d.dim_param)
    return names
