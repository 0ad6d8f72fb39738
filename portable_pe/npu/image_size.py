"""A vision graph's static image size on an NPU (--image-size, like --seq-len for a
sequence graph): checked against the spec's patch and max size, and the exported graph's
pixel input pinned to it, so that simplifying it folds the patch positions (the 2D/3D
grid, RoPE's cos/sin, a resized learned table, a relative-bias gather) to constants."""

from __future__ import annotations

import onnx

from ..spec.io_names import PIXELS


def image_size(spec, given: list[int] | None) -> list[int]:
    """The size to build: `given` ([H, W], video [F, H, W]) or the spec's export.example_size,
    refused unless each is a multiple of its patch and within export.max_size."""
    from ..spec.io_names import pixel_bounds
    from ..spec.schema import multiple_text
    vision = spec.vision
    axes = ["frames", "height", "width"] if vision.video else ["height", "width"]
    bounds = list(pixel_bounds(spec).values())  # per axis: its patch, or whole windows (window attention)
    patches = [b["multiple"] for b in bounds]
    size = list(given) if given is not None else list(spec.example_size)
    form = "x".join("FHW"[3 - len(axes) + i] for i in range(len(axes)))
    label = "x".join(map(str, size))
    if len(size) != len(axes):
        raise ValueError(f"--image-size {label}: graph {spec.name!r} takes {form} ({', '.join(axes)}); expected "
                         f"{len(axes)} sizes, e.g. --image-size {'x'.join(map(str, spec.example_size))}")
    for axis, n, patch, top in zip(axes, size, patches, spec.max_size):
        if n % patch:
            what = f"the temporal patch {patch}" if axis == "frames" else multiple_text(patch, vision.patch)
            raise ValueError(f"--image-size {label}: the {axis} {n} is not a multiple of {what}, as graph "
                             f"{spec.name!r} needs; expected {form}, e.g. {max(patch, n // patch * patch)}")
        if n > top:
            raise ValueError(f"--image-size {label}: the {axis} {n} exceeds graph {spec.name!r}'s max size "
                             f"{'x'.join(map(str, spec.max_size))} (export.max_size); expected at most {top}")
    return size


def pin_image(model: onnx.ModelProto, *, size: list[int], batch: int) -> onnx.ModelProto:
    """A copy of our vision export with pixel_values fixed to (batch, C, *size)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    (pixels,) = [vi for vi in model.graph.input if vi.name == PIXELS]
    dims = pixels.type.tensor_type.shape.dim
    for dim, n in zip(dims[:1] + dims[2:], [batch, *size]):
        dim.Clear()
        dim.dim_value = n
    return model
