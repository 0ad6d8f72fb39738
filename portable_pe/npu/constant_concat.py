"""A concatenation with a constant part, written as zero-padded parts that are added, in
the program the Ethos-U path converts to TFLite.

    cat([c, x], dim)  ->  pad(c, after: len(x)) + pad(x, before: len(c))

Each part is padded with zeros to the full length on `dim`, at its own offset, and the
padded parts are summed: every element is one part's value plus zeros, so the result is
exact.

Why: transformers' ViT, DINOv2 and DINOv3 prepend their CLS (and register) tokens with
`torch.cat([cls.expand(B, 1, D), patches], 1)`; after constant folding that is a CONCAT
with a constant input, and ai-edge-quantizer 0.10.0 (the full-int8 step before Vela)
fails on it while giving the constant the concatenation's output parameters:
"ValueError: Ranks of scales (4) and zps (4) must be the same as the tensor rank (3)."
Written as PAD and ADD, each with its own int8 rules, the three models convert, quantize
and compile with every op on the Ethos-U85 (scripts/npu_vela_table.py --hf-vision).
portable-pe's own vision graphs already write their prefix tokens this way
(spec/vision.py), so the rewrite finds nothing there.
"""

from __future__ import annotations

from .fx_constants import folded_constant


def pad_constant_concats(gm) -> int:
    """Rewrite, in the torch.fx GraphModule `gm` (after const_fold), each aten.cat that has
    a constant part (a get_attr, or an item of const_fold's folded list); returns how many."""
    import torch
    rewritten = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in (torch.ops.aten.cat.default, torch.cat):
            continue
        parts = list(node.args[0])
        if not any(folded_constant(gm, part) is not None for part in parts):
            continue
        shapes = [_shape(gm, part) for part in parts]
        if None in shapes:  # a part without a recorded shape: leave the concatenation as it is
            continue
        rank = len(shapes[0])
        dim = (node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)) % rank
        total = sum(shape[dim] for shape in shapes)
        start, summed = 0, None
        with gm.graph.inserting_before(node):
            for part, shape in zip(parts, shapes):
                # aten.constant_pad_nd takes (before, after) pairs from the last dim backwards
                pad = [0, 0] * (rank - 1 - dim) + [start, total - start - shape[dim]]
                padded = gm.graph.call_function(torch.ops.aten.constant_pad_nd.default, (part, pad, 0.0))
                summed = padded if summed is None else gm.graph.call_function(torch.ops.aten.add.Tensor,
                                                                               (summed, padded))
                start += shape[dim]
        node.replace_all_uses_with(summed)
        gm.graph.erase_node(node)
        rewritten += 1
    if rewritten:
        gm.graph.lint()
        gm.recompile()
    return rewritten


def _shape(gm, node) -> tuple[int, ...] | None:
    value = folded_constant(gm, node)
    if value is None:
        value = node.meta.get("val")
    return tuple(int(n) for n in value.shape) if value is not None else None

