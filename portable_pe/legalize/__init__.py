"""ONNX -> ONNX rewrites that let TVM's Relax ONNX importer follow dynamic shapes.

TVM's importer tracks shapes symbolically (``relax.ShapeExpr``) only through a few
patterns: ``Shape`` (with start/end) of a tensor whose shape it knows, ``Gather``
of one element, ``Concat`` of shape-like pieces, ``Squeeze``/``Unsqueeze``.  Anything
else (``Range`` with a computed limit, arithmetic on shape values, ``Shape`` of a
tensor whose shape it lost) yields fresh, unrelated symbolic variables; a later
broadcast against the real sequence axis then loses the shape and a ``-1`` reshape
fails ("Reshape expects the input tensor to have known shape").

``legalize`` evaluates every small integer/shape computation of the graph
symbolically (sympy, dims of the graph inputs as symbols), then:

* folds computations whose value is a plain constant into initializers;
* rebuilds every shape operand (Reshape/Expand/ConstantOfShape/Tile shape inputs)
  as ``Concat(Shape(input, start=i, end=i+1) | constant ...)`` -- the form the
  importer turns into a ``ShapeExpr`` over the graph inputs' symbolic dims
  (a dim that is a compound expression becomes ``-1`` in Reshape or ``1`` in Expand
  when that is exact);
* replaces ``Range(start, limit, delta)`` whose length depends on an input dim by
  ``ConstantOfShape([n]) -> CumSum -> Add``, which keeps the length tied to the
  input's dim (TVM's Range converter always invents a fresh length variable);
* removes the dead remains.

Nothing is fixed to a size: batch and sequence axes stay dynamic.

Modules
-------
``symbolic``  ``_Sym``: sympy evaluation of the graph's small integer/shape values
``rewrite``   ``_Rewriter``: rebuilds shape operands and Ranges, folds constants
``graph``     shape inference, dead-code removal, input-shape overrides
"""

from __future__ import annotations

import copy
import re

import onnx

from .graph import _dce, _infer, _set_input_shapes
from .rewrite import _Rewriter
from .symbolic import _Sym

__all__ = ["legalize", "blocking_nodes"]


def legalize(
    model: onnx.ModelProto, *, input_shapes: dict[str, list[int | str]] | None = None
) -> onnx.ModelProto:
    """Rewrite ``model`` (a copy) so that TVM's Relax ONNX importer can follow its shapes.

    ``input_shapes`` optionally overrides graph input dims: ints fix a dim, strings
    name a symbolic dim (the same name in two inputs means the same size).
    Dynamic dims stay dynamic.
    """
    model = copy.deepcopy(model)
    if model.functions:
        from onnx import inliner  # pylint: disable=import-outside-toplevel

        model = inliner.inline_local_functions(model)
    if input_shapes:
        _set_input_shapes(model, input_shapes)
    # unnamed dynamic input dims get a name so that they are traceable symbols
    for vi in model.graph.input:
        for ax, d in enumerate(vi.type.tensor_type.shape.dim):
            if not d.HasField("dim_value") and not d.HasField("dim_param"):
                d.dim_param = f"{re.sub(r'[^A-Za-z0-9_]', '_', vi.name)}_dim{ax}"
    for _ in range(8):
        inferred = _infer(model)
        sym = _Sym(inferred.graph)
        sym.run()
        changed = _Rewriter(model, sym).run()
        _dce(model.graph)
        if not changed:
            break
    out = _infer(model)
    return out


# --------------------------------------------------------------------------- #
# blocking nodes
# --------------------------------------------------------------------------- #
def blocking_nodes(model: onnx.ModelProto) -> list[dict]:
    """Nodes that TVM's ONNX import (with portable_pe's converters) would reject.

    Computed statically from the converter tables; nothing is compiled.
    """
    from .. import onnx_ops  # pylint: disable=import-outside-toplevel

    return onnx_ops.unsupported_nodes(model)
