"""Attention (ai.onnx, opsets 23 and 24), not the com.microsoft contrib op."""

from __future__ import annotations

import math

import numpy as np
from tvm import relax, tirx
from tvm.relax.frontend.onnx import onnx_frontend as _fe

from .common import _c, _dtype, _shape


class Attention(_fe.OnnxOpConverter):
    """Standard ONNX Attention-23/24 (not com.microsoft Attention).

    Q/K/V 3-D (with q_num_heads/kv_num_heads) or 4-D; GQA; attn_mask bool or float
    (bias such as relative position or ALiBi) broadcastable to (B, Hq, Sq, Skv);
    is_causal (aligned after past_key); scale; softcap; past_key/past_value;
    nonpad_kv_seqlen (24); qk_matmul_output_mode 0-3.
    """

    @classmethod
    def _heads(cls, bb, t, n, what):
        shp = _shape(bb, t, what)
        if len(shp) == 4:
            return t, shp
        if not n:
            raise ValueError(f"Attention with 3-D {what} needs q_num_heads/kv_num_heads")
        b, s, hidden = shp
        t = bb.normalize(relax.op.reshape(t, [b, s, n, int(hidden) // n]))
        t = bb.normalize(relax.op.permute_dims(t, [0, 2, 1, 3]))
        return t, _shape(bb, t, what)

    @classmethod
    def _impl_v23(cls, bb, inputs, attr, params):
        q, k, v = inputs[0], inputs[1], inputs[2]
        mask = inputs[3] if len(inputs) > 3 else None
        past_k = inputs[4] if len(inputs) > 4 else None
        past_v = inputs[5] if len(inputs) > 5 else None
        nonpad = inputs[6] if len(inputs) > 6 else None
        n_out = attr["tvm_custom"]["num_outputs"]
        is_causal = int(attr.get("is_causal", 0))
        qh, kvh = int(attr.get("q_num_heads", 0)), int(attr.get("kv_num_heads", 0))
        softcap = float(attr.get("softcap", 0.0))
        mode = int(attr.get("qk_matmul_output_mode", 0))
        dt = _dtype(q)
        rank3 = len(_shape(bb, q, "q")) == 3

        q, qs = cls._heads(bb, q, qh, "q")
        k, _ = cls._heads(bb, k, kvh, "k")
        v, _ = cls._heads(bb, v, kvh, "v")
        if past_k is not None:
            k = bb.normalize(relax.op.concat([past_k, k], axis=2))
            v = bb.normalize(relax.op.concat([past_v, v], axis=2))
        present_k, present_v = k, v
        ks = _shape(bb, k, "k")
        b, hq, sq, hd = qs
        hk, skv = ks[1], ks[2]
        scale = attr.get("scale", None)
        scale = float(scale) if scale is not None else 1.0 / math.sqrt(int(hd))

        if int(hq) != int(hk):  # GQA / MQA
            if int(hq) % int(hk):
                raise ValueError(f"Attention: q heads {hq} not a multiple of kv heads {hk}")
            reps = int(hq) // int(hk)
            k = bb.normalize(relax.op.repeat(k, reps, axis=1))
            v = bb.normalize(relax.op.repeat(v, reps, axis=1))

        scores = relax.op.matmul(q, relax.op.permute_dims(k, [0, 1, 3, 2]))
        scores = bb.normalize(relax.op.multiply(scores, _c(scale, dt)))
        if softcap > 0:
            scores = bb.normalize(
                relax.op.tanh(relax.op.divide(scores, _c(softcap, dt))) * _c(softcap, dt)
            )
        qk_raw = scores

        neg_inf = _c(-np.inf, dt)
        zero = _c(0.0, dt)
        bias = None
        may_mask_rows = False
        if mask is not None:
            if _dtype(mask) == "bool":
                bias = bb.normalize(relax.op.where(mask, zero, neg_inf))
                may_mask_rows = True
            else:
                bias = mask if _dtype(mask) == dt else bb.normalize(relax.op.astype(mask, dt))
            mshape = _shape(bb, bias, "mask")
            last = mshape[-1]
            if isinstance(last, tirx.IntImm) and isinstance(skv, tirx.IntImm):
                if int(last) < int(skv):
                    pad = [(0, 0)] * (len(mshape) - 1) + [(0, int(skv) - int(last))]
                    bias = bb.normalize(
                        relax.op.nn.pad(bias, [p for pr in pad for p in pr], pad_value=-np.inf)
                    )
                    may_mask_rows = True
        if is_causal:
            i = relax.op.expand_dims(relax.op.arange(0, sq, 1, "int64"), 1)
            j = relax.op.expand_dims(relax.op.arange(0, skv, 1, "int64"), 0)
            if past_k is not None:
                off = _shape(bb, past_k, "past_k")[2]
                i = relax.op.add(i, relax.op.full((), relax.PrimValue(off), "int64"))
            causal = bb.normalize(relax.op.where(relax.op.less_equal(j, i), zero, neg_inf))
            bias = causal if bias is None else bb.normalize(relax.op.add(bias, causal))
            may_mask_rows = True
        if nonpad is not None:
            j = relax.op.arange(0, skv, 1, "int64")
            keep = relax.op.less(
                relax.op.expand_dims(j, 0),
                relax.op.expand_dims(relax.op.astype(nonpad, "int64"), 1),
            )
            pm = relax.op.where(keep, zero, neg_inf)
            pm = bb.normalize(relax.op.reshape(pm, [b, 1, 1, skv]))
            bias = pm if bias is None else bb.normalize(relax.op.add(bias, pm))
            may_mask_rows = True

        scores = bb.normalize(relax.op.add(scores, bias)) if bias is not None else scores
        qk_bias = scores
        probs = bb.normalize(relax.op.nn.softmax(scores, axis=-1))
        if may_mask_rows:
            full = bb.normalize(
                relax.op.add(bias, relax.op.zeros_like(scores)) if bias is not None else scores
            )
            dead = relax.op.equal(relax.op.max(full, axis=-1, keepdims=True), neg_inf)
            probs = bb.normalize(relax.op.where(dead, zero, probs))
        out = bb.normalize(relax.op.matmul(probs, v))
        if rank3:
            out = bb.normalize(relax.op.permute_dims(out, [0, 2, 1, 3]))
            out = bb.normalize(relax.op.reshape(out, [b, sq, int(hq) * int(_shape(bb, v, "v")[3])]))
        if n_out == 1:
            return out
        qk_out = {0: qk_raw, 1: qk_raw, 2: qk_bias, 3: probs}.get(mode, qk_raw)
        return relax.Tuple([out, present_k, present_v, qk_out][:n_out])

    @classmethod
    def _impl_v24(cls, bb, inputs, attr, params):
        return cls._impl_v23(bb, inputs, attr, params)
