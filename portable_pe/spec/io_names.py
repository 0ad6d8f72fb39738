"""The encoder's inputs, outputs and dim roles: decided here, used everywhere.

    x          float32 (batch, seq, d_model)   token embeddings
    positions  int64 (seq,)                    each token's position (like position_ids)
    hidden     float32 (batch, seq, d_model)   the encoder's output

A vision graph (a spec with [vision]) takes pixels, and computes its patches' positions:

    pixel_values  float32 (batch, C, height, width), video (batch, C, frames, height, width)
    hidden        float32 (batch, tokens, d_model)   prefix (CLS, registers) + patch tokens

whose height, width and frames are dims of their own, each a multiple of its patch size
(height and width of whole windows, for window attention).

A foreign ONNX graph keeps its own names: its position input is recognized by name
(`is_position_input`) and each symbolic dim gets a role by where it sits (`dim_role`).
The export, the manifest (`describe_io`), input generation, the reference runner and the
NPU folding all read these, so a rename happens in one place.
"""

from __future__ import annotations

import re
from dataclasses import asdict

from .schema import patch_window, pixel_multiples

X, POSITIONS, HIDDEN = "x", "positions", "hidden"
INPUT_NAMES, OUTPUT_NAMES = (X, POSITIONS), (HIDDEN,)
PIXELS = "pixel_values"
BATCH, SEQ = "batch", "seq"
FRAMES, HEIGHT, WIDTH = "frames", "height", "width"
ROLES = (BATCH, SEQ, FRAMES, HEIGHT, WIDTH)
#: the roles of a vision graph's pixel sizes, in the order of their axes
PIXEL_ROLES = (FRAMES, HEIGHT, WIDTH)
#: input -> {axis: role} of our own exports; the dim_params are the role names
DYNAMIC_AXES = {X: {0: BATCH, 1: SEQ}, POSITIONS: {0: SEQ}}


def vision_axes(spec) -> dict[str, dict[int, str]]:
    """DYNAMIC_AXES of a vision spec's export: the batch and each pixel axis, and the
    output's token count (prefix + patches)."""
    roles = PIXEL_ROLES if spec.vision.video else PIXEL_ROLES[1:]
    return {PIXELS: {0: BATCH, **{2 + i: role for i, role in enumerate(roles)}}, HIDDEN: {0: BATCH, 1: "tokens"}}


def pixel_bounds(spec) -> dict[str, dict]:
    """The manifest's dims of a vision spec's pixel axes: min one multiple, max max_size, and
    what each must be a multiple of: its patch, or whole windows of patches (window attention,
    the stem's patch then kept as `patch`)."""
    roles = PIXEL_ROLES if spec.vision.video else PIXEL_ROLES[1:]
    window = patch_window({"name": spec.encoding, **spec.encoding_options})
    multiples = pixel_multiples(asdict(spec.vision), window)
    return {role: {"role": role, "min": m, "max": top, "multiple": m,
                   **({"patch": spec.vision.patch} if window > 1 and role != FRAMES else {})}
            for role, m, top in zip(roles, multiples, spec.max_size)}
#: the bounds of a foreign graph's symbolic dims (ours come from the spec's export bounds)
FOREIGN_DIM_MAX = 4096


def is_position_input(name: str) -> bool:
    """`positions`, `position_ids`, `pos`, `input_pos`...: a word of the name is pos*."""
    words = re.split(r"[^a-z0-9]+", name.lower())
    return any(w == "pos" or w.startswith("position") for w in words)


def dim_role(axis: int, rank: int) -> str:
    """A foreign graph's symbolic dim: axis 0 of a rank >= 2 input is the batch, others the sequence."""
    return BATCH if axis == 0 and rank >= 2 else SEQ


def dim_roles(manifest: dict) -> dict[str, str]:
    """dim name -> role, from a manifest's (or describe_io's) `dims`."""
    return {name: info.get("role", SEQ) for name, info in manifest.get("dims", {}).items()}


def describe_io(model, spec) -> dict:
    """Inputs/outputs with dtype and dims; symbolic dims with a role (batch/seq) and bounds;
    for a learned position table, the values `positions` may take. `spec`: the GraphSpec
    the model was exported from, or None for a foreign ONNX graph."""
    initializers = {i.name for i in model.graph.initializer}
    inputs = [_value_info(vi) for vi in model.graph.input if vi.name not in initializers]
    outputs = [_value_info(vi) for vi in model.graph.output]
    dims = {}
    for io in inputs:
        for axis, d in enumerate(io["dims"]):
            if isinstance(d, str) and d not in dims:
                dims[d] = {"role": dim_role(axis, len(io["dims"])), "min": 1, "max": FOREIGN_DIM_MAX}
    for d in past_dims(inputs, outputs):  # a KV cache's past length: 0 at the prefill
        dims[d].update(min=0, past=True)
    if spec is None:  # an image input's sizes: found by the Conv that takes it
        dims.update(foreign_pixel_dims(model))
    if spec is not None:
        dims = {BATCH: {"role": BATCH, "min": 1, "max": spec.max_batch},
                **(pixel_bounds(spec) if spec.vision is not None else {SEQ: {"role": SEQ, "min": 1, "max": spec.max_length}})}
    desc = {"inputs": inputs, "outputs": outputs, "dims": dims}
    if spec is not None and spec.build().pe.max_length is not None:
        why = f"learned position table of {spec.max_length} rows"
        dims[SEQ]["why"] = f"({why})"
        desc["value_limits"] = {POSITIONS: {"min": 0, "max": spec.max_length - 1, "why": why}}
    if not dims:
        desc["static_length"] = next((d[1] for d in (i["dims"] for i in inputs) if len(d) >= 2), 0)
    return desc


def foreign_pixel_dims(model) -> dict[str, dict]:
    """The manifest's dims of a foreign graph's image axes (spec.pixel_inputs): at least the
    patch stem's kernel, at most FOREIGN_PIXEL_MAX, a multiple of its stride."""
    from .pixel_inputs import FOREIGN_PIXEL_MAX, pixel_axes
    dims = {}
    for name, axes in pixel_axes(model).items():
        shape = next(vi.type.tensor_type.shape.dim for vi in model.graph.input if vi.name == name)
        roles = PIXEL_ROLES[3 - (len(shape) - 2):]  # (N, C, H, W): height, width; (N, C, T, H, W): all three
        for axis, pixel in axes.items():
            # one name on two axes (an export traced square-only): the first axis's role
            dims.setdefault(shape[axis].dim_param or f"{name}_dim{axis}", {
                "role": roles[axis - 2], "min": pixel.least, "max": FOREIGN_PIXEL_MAX, "multiple": pixel.patch,
                "patch": pixel.patch})
    return dims


def _value_info(vi) -> dict:
    import onnx
    # an unnamed dynamic dim gets the name legalize() gives it
    dims = [d.dim_param or d.dim_value or f"{vi.name}_dim{axis}"
            for axis, d in enumerate(vi.type.tensor_type.shape.dim)]
    try:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
    except (KeyError, ValueError):
        raise ValueError(f"graph input/output {vi.name!r} is not a tensor of a numeric type "
                         f"(ONNX elem_type {vi.type.tensor_type.elem_type}); portable-pe compiles "
                         "graphs of numeric tensors") from None
    return {"name": vi.name, "dtype": str(dtype), "dims": dims}


# A KV cache, as transformers exports it: past_key_values.N.key/value in, present.N.key/value out
_PAST = re.compile(r"^(?:past_key_values|past)[._](\d+)[._](key|value)$")
_PRESENT = re.compile(r"^(?:present|present_key_values)[._](\d+)[._](key|value)$")


def cache_pairs(inputs: list[dict], outputs: list[dict]) -> dict[str, str]:
    """{past input name: present output name} for the layers that have both."""
    present = {m.groups(): o["name"] for o in outputs if (m := _PRESENT.match(o["name"]))}
    return {i["name"]: present[m.groups()] for i in inputs
            if (m := _PAST.match(i["name"])) and m.groups() in present}


def past_dims(inputs: list[dict], outputs: list[dict]) -> set[str]:
    """Symbolic dims that only cache inputs have: the past length, which is 0 at prefill."""
    cached = set(cache_pairs(inputs, outputs))
    in_cache = {d for i in inputs if i["name"] in cached for d in i["dims"] if isinstance(d, str)}
    elsewhere = {d for i in inputs if i["name"] not in cached for d in i["dims"] if isinstance(d, str)}
    return in_cache - elsewhere
