"""ONNX -> ONNX rewrites that let TVM's Relax ONNX importer follow dynamic shapes.

TVM's importer tracks shapes symbolically (``relax.ShapeExpr``) only through a few
patterns: ``Shape`` (with start/end) of a tensor whose shape it knows, ``Gather``
of one element, ``Concat`` of shape-like pieces, ``Squeeze``/``Unsqueeze``.  Anything
else (``Range`` with a computed limit, arithmetic on shape values, ``Shape`` of a
tensor whose shape it lost) yields fresh, unrelated symbolic variables; a later
broadcast against the real sequence axis then loses the shape and a ``-1`` reshape
fails ("Reshape expects the input tensor to have known shape").

``legalize`` follows every tensor's shape symbolically (sympy, the dims of the graph
inputs as symbols: ``T + 1``, ``past + T``, ``ceil(T / 4) * 4`` stay exact where ONNX's
own inference writes ``unk__``), evaluates the graph's small integer computations, then:

* folds computations whose value is a plain constant into initializers;
* rebuilds every operand where such a value leaves the shape computation: a shape,
  bound or size (Reshape, Expand, ConstantOfShape, Tile, Slice, Split, ...) as a dim
  program the importer reads as a ``ShapeExpr`` of the input dims (``dimexpr``), a
  data operand (a position offset, a mask bound) as a tensor of the same values;
* replaces ``Range(start, limit, delta)`` whose length depends on an input dim by
  ``ConstantOfShape([n]) -> CumSum -> Add``, which keeps the length tied to the
  input's dims (TVM's Range converter always invents a fresh length variable);
* writes a constant Pad by symbolic amounts as Concat with ConstantOfShape blocks;
* removes the dead remains;
* decides a Min/Max of dims where one side wins for every input (``bounds``: dims are
  >= 1, a KV cache's past length >= 0); one that stays undecided (a sliding window's
  ``max(0, past - W + 1)``) goes to TVM as a Max of dim values (``onnx_ops.minmax``);
* records in the model's metadata (``dim_bounds``) an upper bound on an input dim, or on
  a sum of them, that the graph itself imposes (``bounds``: MPT's ALiBi table of
  ``max_seq_len`` rows bounds ``T``, with a KV cache ``past + T``; a sliding window's
  cache of ``W - 1`` rows bounds ``past``), where a dim was decided under it.

Nothing is fixed to a size: batch and sequence axes stay dynamic.

Modules
-------
``shapes``    ``SHAPE_RULES``: symbolic output shapes per op (``shapes_spatial``: Conv, pools, Resize)
``dim_algebra`` equality, broadcasting and axes of symbolic dims
``symbolic``  ``_Sym``: shapes of every tensor, values of the small integer ones
``dimexpr``   ``DimEmitter``: a dim expression as importer-friendly ONNX nodes
``rewrite``   ``_Rewriter``: rebuilds operands, Ranges and Pads, folds constants
``bounds``    Min/Max decided; input-dim bounds a broadcast imposes; dims decided under them
``dims``      the graph inputs' dims as sympy symbols
``follow``    ``first_unfollowed``: the first node whose shape cannot be followed
``graph``     shape inference, dead-code removal, input-shape overrides
"""

from __future__ import annotations

import copy
import re

import onnx

from ..spec.dims import DimBound
from .graph import _dce, _infer, _set_input_shapes
from .rewrite import _Rewriter
from .symbolic import _Sym

__all__ = ["legalize", "blocking_nodes", "dim_bounds", "inline_decided_ifs"]


def legalize(
    model: onnx.ModelProto, *, input_shapes: dict[str, list[int | str]] | None = None,
    multiples: dict[str, int | tuple[int, int]] | None = None, pin_multiples: bool = False,
) -> onnx.ModelProto:
    """Rewrite ``model`` (a copy) so that TVM's Relax ONNX importer can follow its shapes.

    ``input_shapes`` optionally overrides graph input dims: ints fix a dim, strings
    name a symbolic dim (the same name in two inputs means the same size).
    ``multiples`` ({dim: m} or {dim: (m, patch)}): dims known to be multiples of m (an image
    side in whole windows), which decides shape arithmetic the dim alone leaves open (a
    window's padding); dim programs are written in the patch grid, H // patch. With
    ``pin_multiples`` an image whose multiple is coarser than its patch is restated as
    m * (H // m) ahead of its consumers and the dim programs are written in H // m, so that
    TVM sees a foreign Swin's tokens (H // 4 * (W // 4)) and its windows times their area
    (H // 8 * (W // 8) * 4) as one dim (``_Rewriter.pin_multiples``).
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
    bounds: dict = {}  # linear form of dims -> the largest value the graph runs at
    for _ in range(8):
        inferred = _infer(model)
        sym = _Sym(inferred.graph, multiples, pinned=pin_multiples)
        sym.run()
        for s, top in sym.bounds.items():  # once rewritten, the graph no longer shows them
            bounds[s] = min(top, bounds.get(s, top))
        changed = _Rewriter(model, sym).run()
        _dce(model.graph)
        if not changed:
            break
    if multiples and pin_multiples:
        sym = _Sym(_infer(model).graph, multiples, pinned=True)
        sym.run()
        _Rewriter(model, sym).pin_multiples()
    out = _infer(model)
    if bounds:
        set_dim_bounds(out, [_as_bound(form, top) for form, top in bounds.items()])
    return out


def inline_decided_ifs(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """(a copy of `model` with each If whose condition the dims decide replaced by the branch
    taken, how many were): legalize's own If rule (``_Rewriter.inline_if``) alone, for the
    simplify stage. TorchScript writes DINOv3's RoPE with Ifs on a rank
    (``Size(Shape(x)) - 2 > 0``); onnxsim folds neither them nor, then, the graph around them,
    so they must go before onnxsim runs."""
    if not any(node.op_type == "If" for node in model.graph.node):
        return model, 0
    model, inlined = copy.deepcopy(model), 0
    for _ in range(8):  # a branch may hold the next If
        sym = _Sym(_infer(model).graph)
        sym.run()
        done = _Rewriter(model, sym).run_only("If")
        if not done:
            break
        inlined += done
        _dce(model.graph)
    return model, inlined


DIM_BOUNDS_KEY = "portable_pe.dim_bounds"


def _as_bound(form, top: int) -> DimBound:
    """A linear form of dims (sympy, integer coefficients) <= top as a record; a constant
    term moves to the right side."""
    syms = sorted(form.free_symbols, key=str)
    constant = int(form.subs({s: 0 for s in syms}))
    return DimBound({str(s): int(form.coeff(s)) for s in syms}, int(top) - constant)


def set_dim_bounds(model: onnx.ModelProto, bounds: list[DimBound]) -> None:
    """Record the bounds in the model's metadata, so a legalized graph keeps them."""
    import json  # pylint: disable=import-outside-toplevel
    keep = [p for p in model.metadata_props if p.key != DIM_BOUNDS_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(keep)
    model.metadata_props.add(key=DIM_BOUNDS_KEY, value=json.dumps([b.to_json() for b in bounds]))


def dim_bounds(model: onnx.ModelProto) -> list[DimBound]:
    """The dim bounds legalize found ([] for most graphs)."""
    import json  # pylint: disable=import-outside-toplevel
    stored = next((json.loads(p.value) for p in model.metadata_props if p.key == DIM_BOUNDS_KEY), [])
    return [DimBound.from_json(b) for b in stored]


# --------------------------------------------------------------------------- #
# blocking nodes
# --------------------------------------------------------------------------- #
def blocking_nodes(model: onnx.ModelProto) -> list[dict]:
    """Nodes that TVM's ONNX import (with portable_pe's converters) would reject.

    Computed statically from the converter tables; nothing is compiled.
    """
    from .. import onnx_ops  # pylint: disable=import-outside-toplevel

    return onnx_ops.unsupported_nodes(model)
