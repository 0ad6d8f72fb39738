"""RotaryEmbedding (ai.onnx, opset 23): interleaved or half-split, partial rotary, position_ids, 3-D/4-D."""

from __future__ import annotations

from tvm import relax, tirx
from tvm.relax.frontend.onnx import onnx_frontend as _fe

from .common import _dtype, _shape, _slice_last


class RotaryEmbedding(_fe.OnnxOpConverter):
    """Standard ONNX RotaryEmbedding-23.

    X: (B, S, hidden) with num_heads, or (B, H, S, head); cos/sin caches
    (max_pos, rd/2) gathered by position_ids (B, S), or (B, S, rd/2) without them.
    Attributes interleaved, num_heads, rotary_embedding_dim (0 = whole head).
    """

    @classmethod
    def _impl_v23(cls, bb, inputs, attr, params):
        x, cos, sin = inputs[0], inputs[1], inputs[2]
        pos = inputs[3] if len(inputs) > 3 else None
        interleaved = int(attr.get("interleaved", 0))
        num_heads = int(attr.get("num_heads", 0))
        rd = int(attr.get("rotary_embedding_dim", 0))
        shp = _shape(bb, x, "rope_x")
        if len(shp) == 4:
            b, h, s, hd = shp
            x4 = bb.normalize(relax.op.permute_dims(x, [0, 2, 1, 3]))  # B S H D
        elif len(shp) == 3:
            if num_heads <= 0:
                raise ValueError("RotaryEmbedding with 3-D input needs num_heads")
            b, s, hidden = shp
            if not isinstance(hidden, tirx.IntImm):
                raise ValueError("RotaryEmbedding: hidden size must be static")
            hd = int(hidden) // num_heads
            h = num_heads
            x4 = bb.normalize(relax.op.reshape(x, [b, s, num_heads, hd]))
        else:
            raise ValueError(f"RotaryEmbedding expects 3-D or 4-D input, got {len(shp)}-D")
        if not isinstance(hd, int | tirx.IntImm):
            raise ValueError("RotaryEmbedding: head size must be static")
        hd = int(hd)
        rd = rd or hd
        half = rd // 2
        if pos is not None:
            pos = relax.op.astype(pos, "int64") if _dtype(pos) != "int64" else pos
            cos = bb.normalize(relax.op.take(cos, pos, axis=0))
            sin = bb.normalize(relax.op.take(sin, pos, axis=0))
        cos = bb.normalize(relax.op.expand_dims(cos, axis=2))  # B S 1 rd/2
        sin = bb.normalize(relax.op.expand_dims(sin, axis=2))
        if _dtype(cos) != _dtype(x):
            cos = bb.normalize(relax.op.astype(cos, _dtype(x)))
            sin = bb.normalize(relax.op.astype(sin, _dtype(x)))
        x_rot = _slice_last(bb, x4, 0, rd) if rd < hd else x4
        if interleaved:
            x1 = _slice_last(bb, x_rot, 0, rd, 2)
            x2 = _slice_last(bb, x_rot, 1, rd, 2)
        else:
            x1 = _slice_last(bb, x_rot, 0, half)
            x2 = _slice_last(bb, x_rot, half, rd)
        real = bb.normalize(relax.op.subtract(cos * x1, sin * x2))
        imag = bb.normalize(relax.op.add(sin * x1, cos * x2))
        if interleaved:
            pair = relax.op.concat(
                [relax.op.expand_dims(real, -1), relax.op.expand_dims(imag, -1)], axis=-1
            )
            rot = bb.normalize(relax.op.reshape(pair, [b, s, h, rd]))
        else:
            rot = bb.normalize(relax.op.concat([real, imag], axis=-1))
        if rd < hd:
            rot = bb.normalize(relax.op.concat([rot, _slice_last(bb, x4, rd, hd)], axis=-1))
        if len(shp) == 4:
            return relax.op.permute_dims(rot, [0, 2, 1, 3])
        return relax.op.reshape(rot, shp)
