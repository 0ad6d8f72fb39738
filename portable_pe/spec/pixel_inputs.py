"""A foreign graph's image (or video) input, found by what consumes it: a convolution.

Our own vision specs name their pixel dims (io_names.pixel_bounds). A Hugging Face export
names them however its exporter did ("H", "W"; torch.export's "8*h"), and the only thing
that says they are image sizes is the graph: the input, after at most a few elementwise
steps (a normalization, a cast), is the data operand of a Conv, and the Conv's stride is
the patch every size must be a whole number of. Without this, every symbolic dim is a
sequence length, and a 7-pixel "length" is what the simplify check fed a ViT.

A stem that is no Conv (Llama-4's vision model unfolds its patches: torch.export writes
Pad, Gather, Gather, Reshape) still takes an image: a float (N, C, H, W) input with a few
static channels and symbolic sides. Its step is then what torch.export named the side
("8*h", renamed "h_x8" at load: a multiple of 8), else one pixel.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import onnx

#: ops that keep a tensor's shape (and its meaning as pixels) between the input and the Conv
_PASS_THROUGH = {"Cast", "Identity", "Add", "Sub", "Mul", "Div", "Clip", "Relu"}
_MAX_STEPS = 4
#: the name prefix of the Reshape with which legalize restates an image in whole multiples
#: of its coarsest size (legalize.rewrite._Rewriter.pin_multiples): the same pixels
PINNED_IMAGE = "ppe_whole"
#: the largest foreign image side accepted (pixels)
FOREIGN_PIXEL_MAX = 4096


@dataclass(frozen=True)
class PixelAxis:
    patch: int     # the Conv's stride along the axis: sizes must be multiples of it
    least: int     # the Conv's kernel along the axis: the smallest size it takes


def image_inputs(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    """{input name: the Conv it reaches} for each float input of rank 4 (N, C, H, W) or 5
    (N, C, T, H, W) that reaches a Conv's data operand: the graph's images, sized or not."""
    inits = {i.name for i in model.graph.initializer}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    found = {}
    for vi in model.graph.input:
        if vi.name in inits or vi.type.tensor_type.elem_type not in _FLOATS:
            continue
        if len(vi.type.tensor_type.shape.dim) in (4, 5):
            conv = _conv_of(vi.name, consumers)
            if conv is not None:
                found[vi.name] = conv
    return found


def pixel_axes(model: onnx.ModelProto) -> dict[str, dict[int, PixelAxis]]:
    """{input name: {axis: PixelAxis}} for each image input (image_inputs) whose spatial
    axes are symbolic."""
    weights = {i.name: list(i.dims) for i in model.graph.initializer}
    shapes = {vi.name: vi.type.tensor_type.shape.dim for vi in model.graph.input}
    found = {}
    for name, conv in image_inputs(model).items():
        dims = shapes[name]
        if all(d.HasField("dim_value") for d in dims[2:]):
            continue
        strides, kernel = _conv_geometry(conv, weights, len(dims) - 2)
        found[name] = {2 + i: PixelAxis(stride, k) for i, (stride, k) in enumerate(zip(strides, kernel))
                       if not dims[2 + i].HasField("dim_value")}
    for name in _unfolded_images(model, skip=found):
        found[name] = {axis: PixelAxis(step, step) for axis, d in enumerate(shapes[name]) if axis >= 2
                       for step in [named_multiple(d.dim_param)]}
    return found


#: channels of an image input whose stem is no Conv (grey, RGB, RGBA)
_IMAGE_CHANNELS = range(1, 5)


def _unfolded_images(model: onnx.ModelProto, *, skip) -> list[str]:
    """Float (N, C, H, W) or (N, C, T, H, W) inputs with C static and small and every other
    axis after it symbolic, that reach no Conv: an image with a stem of another kind."""
    inits = {i.name for i in model.graph.initializer}
    found = []
    for vi in model.graph.input:
        dims = vi.type.tensor_type.shape.dim
        if vi.name in inits or vi.name in skip or vi.type.tensor_type.elem_type not in _FLOATS:
            continue
        if (len(dims) in (4, 5) and dims[1].HasField("dim_value") and dims[1].dim_value in _IMAGE_CHANNELS
                and all(d.HasField("dim_param") for d in dims[2:])):
            found.append(vi.name)
    return found


def named_multiple(dim_param: str) -> int:
    """The step torch.export wrote into a dim's name: 8 for "8*h" (or "h_x8", the
    identifier compile.frontend renames it to), else 1."""
    named = re.fullmatch(r"\s*(\d+)\s*\*\s*[A-Za-z_]\w*\s*|[A-Za-z_]\w*?_x(\d+)", dim_param)
    return int(named[1] or named[2]) if named else 1


_FLOATS = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE}


def _conv_of(name: str, consumers) -> onnx.NodeProto | None:
    """The first Conv whose data operand `name` becomes through shape-keeping ops."""
    frontier = [name]
    for _ in range(_MAX_STEPS):
        following = []
        for tensor in frontier:
            for node in consumers.get(tensor, []):
                if node.op_type == "Conv" and node.input[0] == tensor:
                    return node
                if node.op_type in _PASS_THROUGH or (node.op_type == "Reshape" and node.name.startswith(PINNED_IMAGE)):
                    following.extend(node.output)
        frontier = following
    return None


def _conv_geometry(conv: onnx.NodeProto, weights: dict, spatial: int) -> tuple[list[int], list[int]]:
    attrs = {a.name: list(a.ints) for a in conv.attribute if a.ints}
    kernel = attrs.get("kernel_shape") or (weights.get(conv.input[1], [])[2:] or [1] * spatial)
    strides = attrs.get("strides") or [1] * spatial
    return strides, kernel
