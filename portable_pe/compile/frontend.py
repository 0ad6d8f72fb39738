"""Import: ONNX -> Relax with portable_pe's converters (RotaryEmbedding-23, Attention-23/24)
registered, refusing ops nothing can import with the op, node and opset named; and the input
dims `--shape` pins before the import."""

from __future__ import annotations

import onnx


class UnsupportedOpError(ValueError):
    """The graph holds ops neither TVM's importer nor our converters can take."""


def blocking_nodes(model: onnx.ModelProto) -> list[dict]:
    """Nodes that would block the import, found from the converter tables alone."""
    from ..legalize import blocking_nodes as find
    return find(model)


def describe_blocking(nodes: list[dict]) -> str:
    return "; ".join(f"{n['op']} (node {n['node']}, {n['domain'] or 'ai.onnx'} opset {n['opset']}: {n['reason']})"
                     for n in nodes)


def import_onnx(model: onnx.ModelProto, *, shape_dict: dict | None = None):
    from ..onnx_ops import UnsupportedOnnxOps, import_onnx as convert
    try:  # convert() checks every node before converting any
        return convert(model, shape_dict=shape_dict)
    except UnsupportedOnnxOps as err:
        raise UnsupportedOpError(f"the import cannot take {len(err.nodes)} node(s): "
                                 f"{describe_blocking(err.nodes)}") from None


def fix_input_shapes(model: onnx.ModelProto, shapes: dict[str, list[int]]) -> None:
    """--shape name=1x128: pin an input's symbolic dims (the rest of the graph is re-inferred
    later); a dim the graph fixes may be given only as that value."""
    inputs = {vi.name: vi for vi in model.graph.input}
    for name, dims in shapes.items():
        if name not in inputs:
            raise ValueError(f"--shape names input {name!r}, which the graph does not have; expected one of "
                             f"its inputs: {', '.join(sorted(inputs))}")
        shape = inputs[name].type.tensor_type.shape
        if len(shape.dim) != len(dims):
            raise ValueError(f"--shape {name}={'x'.join(map(str, dims))} gives {len(dims)} sizes; expected "
                             f"{len(shape.dim)} (input {name!r} has rank {len(shape.dim)})")
        for axis, (dim, size) in enumerate(zip(shape.dim, dims)):
            if dim.WhichOneof("value") == "dim_value" and dim.dim_value != size:
                given = "x".join(map(str, dims))
                fixed = "x".join(str(d.dim_value) if d.WhichOneof("value") == "dim_value" else str(n)
                                 for d, n in zip(shape.dim, dims))
                raise ValueError(f"--shape {name}={given}: axis {axis} of input {name!r} is fixed to {dim.dim_value} "
                                 f"by the graph; --shape pins symbolic dims only (give {dim.dim_value} there: "
                                 f"--shape {name}={fixed})")
        for dim, size in zip(shape.dim, dims):
            dim.Clear()
            dim.dim_value = size


def name_dim_expressions(model: onnx.ModelProto) -> dict[str, str]:
    """Input dims that torch.export named by an expression ("8*h": a multiple of the patch)
    renamed to identifiers ("h_x8"), everywhere the graph writes them. TVM's importer turns
    such a name into the expression itself, a shape it can match an input against but not
    solve ("PrimExpr T.int64(8) * h is not computed" when the VM binds the input).
    Returns {old: new}."""
    renamed = {}
    for vi in model.graph.input:
        for dim in vi.type.tensor_type.shape.dim:
            if dim.HasField("dim_param") and not dim.dim_param.isidentifier():
                renamed.setdefault(dim.dim_param, _identifier(dim.dim_param))
    _rename_dims(model, renamed)
    return renamed


def _rename_dims(model: onnx.ModelProto, names: dict[str, str]) -> None:
    """Each dim_param in `names` ({old: new}) renamed wherever the graph writes it."""
    if not names:
        return
    for vi in [*model.graph.input, *model.graph.output, *model.graph.value_info]:
        for dim in vi.type.tensor_type.shape.dim:
            if dim.HasField("dim_param") and dim.dim_param in names:
                dim.dim_param = names[dim.dim_param]


def _identifier(expr: str) -> str:
    import re
    multiple = re.fullmatch(r"\s*(\d+)\s*\*\s*([A-Za-z_]\w*)\s*", expr)
    if multiple:
        return f"{multiple[2]}_x{multiple[1]}"
    return "dim_" + re.sub(r"\W+", "_", expr).strip("_")


def tie_input_dims(model: onnx.ModelProto, relations) -> None:
    """Write each relation (spec.dims.DimRelation) into the graph's input dims: a dim equal to
    another takes its name, a dim that is a sum becomes that expression ("s70 + s15"), which
    legalize follows and TVM's importer binds once its terms are bound by other inputs. Without
    this, TVM sees unrelated dims where the graph meets them (a mask over past + T against
    the keys) and cannot match the shapes. The manifest keeps the original names, and the
    runtime checks the relation (run.local.check_inputs)."""
    _rename_dims(model, {r.dim: " + ".join(d if c == 1 else f"{c}*{d}" for d, c in r.terms.items())
                         for r in relations})
