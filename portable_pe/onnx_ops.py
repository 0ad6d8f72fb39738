"""Extra ONNX converters for TVM 0.27's Relax ONNX frontend, and an importer that uses them.

TVM 0.27 looks converters up by ``op_type`` alone, in the dict returned by the module
function ``tvm.relax.frontend.onnx.onnx_frontend._get_convert_map`` (called afresh by
the unsupported-op check and by every node conversion).  ``import_onnx`` swaps that
function for one that adds our converters for the duration of one ``from_onnx`` call
and restores it afterwards (not thread-safe: do not import two models concurrently).

Because lookup ignores the domain, and TVM's "Attention" entry is the com.microsoft
contrib op, the standard-domain ``Attention``/``RotaryEmbedding`` nodes are renamed in a
private copy of the model (``PPE_Attention``, ``PPE_RotaryEmbedding``) before import;
com.microsoft nodes keep going to TVM's own converters.
"""

from __future__ import annotations

import contextlib
import copy
import math
import warnings

import numpy as np
import onnx
import tvm
from tvm import relax, tirx
from tvm.relax.frontend import onnx as relax_onnx
from tvm.relax.frontend.onnx import onnx_frontend as _fe

__all__ = ["custom_converters", "import_onnx", "unsupported_nodes", "UnsupportedOnnxOps"]

_STD_DOMAINS = ("", "ai.onnx")
_PREFIX = "PPE_"


class UnsupportedOnnxOps(tvm.error.OpNotImplemented):
    """Raised by import_onnx when some nodes have no converter."""

    def __init__(self, nodes: list[dict]):
        self.nodes = nodes
        lines = [
            f"  node {n['node']!r}: op {n['op']} (domain {n['domain'] or 'ai.onnx'!r}, "
            f"opset {n['opset']}): {n['reason']}"
            for n in nodes
        ]
        super().__init__("ONNX model has operators TVM cannot import:\n" + "\n".join(lines))


# --------------------------------------------------------------------------- #
# helpers
# --------------------------------------------------------------------------- #
def _shape(bb: relax.BlockBuilder, x: relax.Expr, what: str) -> list:
    """Static-or-symbolic shape of x as a list of PrimExpr; match_casts if unknown."""
    ty = x.ty
    if not isinstance(ty, relax.TensorType) or ty.ndim < 0:
        raise ValueError(f"{what}: input rank must be known")
    if isinstance(ty.shape, relax.ShapeExpr):
        return list(ty.shape.values)
    dims = [tirx.Var(f"{what}_d{i}", "int64") for i in range(ty.ndim)]
    bb.match_cast(x, relax.TensorType(dims, ty.dtype))
    return dims


def _c(value, dtype):
    return relax.const(np.asarray(value, dtype=dtype), dtype)


def _dtype(x) -> str:
    return str(x.ty.dtype)


def _slice_last(bb, x, begin, end, stride=1):
    return bb.normalize(
        relax.op.strided_slice(x, axes=[len(x.ty.shape.values) - 1], begin=[begin], end=[end], strides=[stride])
    )


# --------------------------------------------------------------------------- #
# RotaryEmbedding (ai.onnx, opset 23)
# --------------------------------------------------------------------------- #
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


# --------------------------------------------------------------------------- #
# Attention (ai.onnx, opsets 23 and 24)
# --------------------------------------------------------------------------- #
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


# --------------------------------------------------------------------------- #
# registry / import
# --------------------------------------------------------------------------- #
_OUR_OPS = {  # op_type -> (converter, lowest opset version, highest opset version)
    "RotaryEmbedding": (RotaryEmbedding, 23, 23),
    "Attention": (Attention, 23, 24),
}


class Clip(_fe.Clip):
    """TVM's Clip, with Relax maximum/minimum ops where TVM emits TE helper PrimFuncs.

    TVM 0.27 converts Clip with ``bb.emit_te(topi.maximum, ...)``: a PrimFunc written for
    the symbolic shape that main calls directly. A tuned compile binds batch and seq in a
    copy of main (tune.specialize), but such a helper keeps its symbolic buffers, and
    FuseTIR then stops ("Inconsistent buffers compute and A mapped to the same relax
    var"): that is what kept t5_bias and hybrid (T5 bucketing clips the relative
    distance) from being tuned. As Relax ops they are legalized after the binding."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        x = inputs[0]
        dtype = _dtype(x)
        x = bb.emit(relax.op.maximum(x, relax.const(float(attr.get("min", -np.inf)), dtype)))
        return bb.emit(relax.op.minimum(x, relax.const(float(attr.get("max", np.inf)), dtype)))

    @classmethod
    def _impl_v13(cls, bb, inputs, attr, params):
        x = inputs[0]
        if inputs[1] is not None:
            x = bb.emit(relax.op.maximum(x, cls._sanitize_nan_clip_bound(bb, inputs[1], for_min=True)))
        if inputs[2] is not None:
            x = bb.emit(relax.op.minimum(x, cls._sanitize_nan_clip_bound(bb, inputs[2], for_min=False)))
        return x


# TVM converters replaced while importing (same op_type, so no renaming)
_REPLACED_OPS = {"Clip": Clip}


def custom_converters() -> dict[str, type]:
    """op_type -> OnnxOpConverter subclass for standard-domain ops TVM 0.27 lacks."""
    return {name: conv for name, (conv, _, _) in _OUR_OPS.items()}


def _since_version(op: str, domain: str, opset: int) -> int | None:
    try:
        return onnx.defs.get_schema(op, opset, domain).since_version
    except Exception:  # pylint: disable=broad-except
        return None


def _iter_nodes(graph: onnx.GraphProto):
    for node in graph.node:
        yield node
        for a in node.attribute:
            for sg in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                yield from _iter_nodes(sg)


def unsupported_nodes(model: onnx.ModelProto) -> list[dict]:
    """Nodes that import_onnx would reject; no conversion is attempted."""
    opsets = {o.domain: o.version for o in model.opset_import}
    std_opset = opsets.get("", opsets.get("ai.onnx", 1))
    tvm_map = _fe._get_convert_map()  # pylint: disable=protected-access
    local_funcs = {(f.domain, f.name) for f in model.functions}
    res = []
    for node in _iter_nodes(model.graph):
        dom = node.domain
        opset = std_opset if dom in _STD_DOMAINS else opsets.get(dom)
        reason = None
        if (dom, node.op_type) in local_funcs:
            reason = "model-local function (legalize() inlines these)"
        elif dom in _STD_DOMAINS:
            if node.op_type in _OUR_OPS:
                _, lo, hi = _OUR_OPS[node.op_type]
                ver = _since_version(node.op_type, "", opset) or opset
                if not lo <= ver <= hi:
                    reason = (
                        f"{node.op_type}-{ver} semantics not implemented "
                        f"(portable_pe handles versions {lo}..{hi})"
                    )
            elif node.op_type not in tvm_map and node.op_type not in ("If", "Constant"):
                reason = "no converter in TVM's Relax ONNX frontend"
        elif dom == "com.microsoft":
            if node.op_type not in tvm_map or node.op_type in ("RotaryEmbedding",):
                reason = "com.microsoft contrib op without a TVM converter"
        else:
            reason = f"custom domain {dom!r} has no converters"
        if reason:
            res.append(
                {
                    "node": node.name or (node.output[0] if node.output else ""),
                    "op": node.op_type,
                    "domain": dom,
                    "opset": opset,
                    "reason": reason,
                }
            )
    return res


@contextlib.contextmanager
def registered_converters(extra: dict[str, type]):
    """Context manager: TVM's ONNX frontend sees ``extra`` converters while inside."""
    orig = _fe._get_convert_map  # pylint: disable=protected-access

    def patched():
        table = orig()
        table.update(extra)
        return table

    _fe._get_convert_map = patched  # pylint: disable=protected-access
    try:
        yield
    finally:
        _fe._get_convert_map = orig  # pylint: disable=protected-access


def _rename_standard_ops(model: onnx.ModelProto) -> onnx.ModelProto:
    model = copy.deepcopy(model)
    for node in _iter_nodes(model.graph):
        if node.domain in _STD_DOMAINS and node.op_type in _OUR_OPS:
            node.op_type = _PREFIX + node.op_type
    return model


def import_onnx(model: onnx.ModelProto, *, shape_dict=None, **kwargs) -> tvm.IRModule:
    """``relax_onnx.from_onnx`` with portable_pe's converters registered.

    Raises UnsupportedOnnxOps (a tvm.error.OpNotImplemented) naming op, node,
    domain and opset of every node without a converter, before converting anything.
    """
    bad = unsupported_nodes(model)
    if bad:
        raise UnsupportedOnnxOps(bad)
    renamed = _rename_standard_ops(model)
    extra = {**_REPLACED_OPS, **{_PREFIX + name: conv for name, (conv, _, _) in _OUR_OPS.items()}}
    with registered_converters(extra), warnings.catch_warnings():
        # the checker inside from_onnx rejects the renamed ops; it only warns
        warnings.filterwarnings("ignore", message=".*No Op registered for PPE_.*")
        kwargs.setdefault("keep_params_in_input", False)
        return relax_onnx.from_onnx(renamed, shape_dict=shape_dict, **kwargs)
