"""Symbolic output shapes of the ops of an image model's spatial axes (shapes.py's rules
for the rest): a patch stem's Conv, pooling and Resize, so that H / 16 and W / 16 stay
expressions of the input's H and W."""

from __future__ import annotations

import sympy

from .dim_algebra import _vals, rule_registry

SPATIAL_RULES, _rule = rule_registry()


@_rule("Conv", "MaxPool", "AveragePool", "LpPool")
def _conv(attrs, shapes, values, n_out):
    """Each spatial dim floor((d + pads - dilation * (k - 1) - 1) / stride) + 1 (ceil with
    ceil_mode): a patch stem's H / 16 stays an expression of H, which a dynamic image size
    needs. auto_pad SAME is left to ONNX's inference."""
    x = shapes[0]
    if x is None or len(x) < 3:
        return [None] * n_out
    spatial = len(x) - 2
    weight = shapes[1] if len(shapes) > 1 else None
    kernel = attrs.get("kernel_shape") or (weight[2:] if weight is not None else None)
    auto_pad = attrs.get("auto_pad", b"NOTSET")
    if kernel is None or None in kernel or (auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad) \
            not in ("NOTSET", "VALID"):
        return [None] * n_out
    strides = attrs.get("strides") or [1] * spatial
    dilations = attrs.get("dilations") or [1] * spatial
    pads = attrs.get("pads") or [0] * (2 * spatial)
    round_ = sympy.ceiling if attrs.get("ceil_mode", 0) else sympy.floor
    out = [x[0], weight[0] if weight is not None else x[1]]  # a Conv's filters; a pool keeps the channels
    for i in range(spatial):
        d = x[2 + i]
        span = None if d is None else d + pads[i] + pads[i + spatial] - dilations[i] * (sympy.sympify(kernel[i]) - 1) - 1
        out.append(None if span is None else sympy.simplify(round_(span / strides[i]) + 1))
    return [out] + [None] * (n_out - 1)


@_rule("Resize")
def _resize(attrs, shapes, values, n_out):
    """The output is `sizes` where given (input 3), else each dim times its scale."""
    x = shapes[0]
    sizes = _vals(values[3]) if len(values) > 3 and values[3] is not None else None
    if sizes is not None:
        return [[sympy.sympify(s) for s in sizes]]
    scales = _vals(values[2]) if len(values) > 2 and values[2] is not None else None
    if x is None or scales is None or len(scales) != len(x):
        return [None]
    return [[None if d is None else sympy.floor(d * sympy.nsimplify(float(s))) for d, s in zip(x, scales)]]
