"""The float32 attention kernel reads Q where the projection wrote it and writes the
merged heads (cpu_schedule/head_layouts.py), after a split projection's biases moved
into its dense (cpu_schedule/split_bias.py): no head split of Q, no merge kernel, and
the same numbers as a float64 numpy oracle."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, tirx

from portable_pe.cpu_schedule import cpu_pipeline
from portable_pe.cpu_schedule.pipeline import fusion_passes
from portable_pe.cpu_schedule.work_claims import cpu_tir_pipeline

HOST = tvm.target.Target({"kind": "llvm", "num-cores": 2})
K, H, D = 24, 2, 16  # model width, heads, head dim
W = H * D
SCALE = 0.25


def _weights(rng):
    return {"qkv": rng.standard_normal((K, 3 * W)).astype("float32") * 0.3,
            "bias": rng.standard_normal(3 * W).astype("float32"),
            "out": rng.standard_normal((W, K)).astype("float32") * 0.3}


def _encoder_attention(w, *, biased=(True, True, True), v_read_twice=False, sliced=False, noop_reshape=False):
    """y = merge(softmax(q·kᵀ·SCALE)·v) @ W_out over one split q/k/v projection of x
    [batch, seq, K], each part's bias added after the split (as the shipped encoders
    export it). ``biased``: which parts get their bias; ``v_read_twice``: V's part, before
    its bias, is also added to the output (a second reader of the split's part).
    ``sliced``: the parts are column slices in the order k, q, v (Q at an offset) instead
    of a split's parts. ``noop_reshape``: the attention's result is reshaped to its own
    shape before the merge (DINOv3's export)."""
    x = relax.Var("x", relax.TensorType([tirx.Var("batch", "int64"), tirx.Var("seq", "int64"), K], "float32"))
    batch, seq, _ = x.ty.shape.values
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            qkv = bb.emit(relax.op.matmul(x, relax.const(w["qkv"])))
            parts = bb.emit(relax.op.split(qkv, [W, 2 * W], axis=-1))
            heads = []
            for i in range(3):
                if sliced:  # columns of q, k, v: W.., 0.., 2W..
                    begin = (W, 0, 2 * W)[i]
                    part = bb.emit(relax.op.strided_slice(qkv, axes=[2], begin=[begin], end=[begin + W]))
                else:
                    part = bb.emit(relax.TupleGetItem(parts, i))
                if i == 2:
                    v_part = part  # before its bias
                if biased[i]:
                    part = bb.emit(relax.op.add(relax.const(w["bias"][i * W:(i + 1) * W]), part))
                heads.append(part)
            q, k, v = (bb.emit(relax.op.reshape(p, [batch, seq, H, D])) for p in heads)
            q, v = (bb.emit(relax.op.permute_dims(p, [0, 2, 1, 3])) for p in (q, v))
            kt = bb.emit(relax.op.permute_dims(k, [0, 2, 3, 1]))
            s = bb.emit(relax.op.multiply(relax.op.matmul(q, kt), relax.const(SCALE, "float32")))
            o = bb.emit(relax.op.matmul(relax.op.nn.softmax(s, axis=-1), v))
            if noop_reshape:
                o = bb.emit(relax.op.reshape(o, [batch, H, seq, D]))
            merged = bb.emit(relax.op.reshape(relax.op.permute_dims(o, [0, 2, 1, 3]), [batch, seq, W]))
            if v_read_twice:
                merged = bb.emit(relax.op.add(merged, v_part))
            y = bb.emit_output(relax.op.matmul(merged, relax.const(w["out"])))
        bb.emit_func_output(y)
    return bb.get()


def _reference(x, w, *, biased=(True, True, True), v_read_twice=False, sliced=False, noop_reshape=False):
    qkv = x.astype(np.float64) @ w["qkv"]
    begins = (W, 0, 2 * W) if sliced else (0, W, 2 * W)
    parts = [qkv[..., b:b + W] + (w["bias"][i * W:(i + 1) * W] if biased[i] else 0) for i, b in enumerate(begins)]
    b, t, _ = x.shape
    q, k, v = (p.reshape(b, t, H, D).transpose(0, 2, 1, 3) for p in parts)
    s = q @ k.transpose(0, 1, 3, 2) * SCALE
    e = np.exp(s - s.max(-1, keepdims=True))
    merged = ((e / e.sum(-1, keepdims=True)) @ v).transpose(0, 2, 1, 3).reshape(b, t, W)
    if v_read_twice:
        merged = merged + qkv[..., 2 * W:]
    return merged @ w["out"]


def _kernels(mod):
    with HOST:
        fused = tvm.transform.Sequential(fusion_passes())(mod)
    return {gv.name_hint: f for gv, f in fused.functions_items() if isinstance(f, tirx.PrimFunc)}


def _check_numbers(mod, w, **form):
    vm = relax.VirtualMachine(tvm.compile(mod, target=HOST, relax_pipeline=cpu_pipeline(HOST),
                                          tir_pipeline=cpu_tir_pipeline(HOST)), tvm.cpu())
    rng = np.random.default_rng(1)
    for b, t in [(1, 1), (2, 5), (1, 77), (3, 40)]:  # 77: ragged row blocks and column tails
        x = rng.standard_normal((b, t, K)).astype("float32")
        got = vm["main"](tvm.runtime.tensor(x, tvm.cpu())).numpy()
        np.testing.assert_allclose(got, _reference(x, w, **form), rtol=1e-5, atol=2e-5)


def test_attention_reads_q_in_the_projection_and_writes_merged_heads():
    w = _weights(np.random.default_rng(0))
    mod = _encoder_attention(w)
    kernels = _kernels(mod)
    attention = [f for name, f in kernels.items() if name.startswith("fused_attention")]
    assert len(attention) == 1, sorted(kernels)
    q, kt, v, _bias, o = attention[0].params  # TVM 0.27: a PrimFunc's params are its buffers
    # Q is the projection itself ([batch, seq, 3W]); the output is [batch, seq, W]
    assert [len(b.shape) for b in (q, kt, v, o)] == [3, 4, 4, 3], (q.shape, kt.shape, v.shape, o.shape)
    assert int(q.shape[-1]) == 3 * W and int(o.shape[-1]) == W
    # the biases are in the projection's kernel
    assert [n for n in kernels if n.startswith("fused_matmul_add")], sorted(kernels)
    _check_numbers(mod, w)


def test_a_reshape_of_the_result_to_its_own_shape_still_gets_merged_heads():
    """DINOv3's export reshapes P·V's result to [B, H, T, D] again before the merge: the
    kernel still writes [batch, seq, W] and no merge kernel is left."""
    w = _weights(np.random.default_rng(5))
    mod = _encoder_attention(w, noop_reshape=True)
    kernels = _kernels(mod)
    attention = [f for name, f in kernels.items() if name.startswith("fused_attention")]
    assert len(attention) == 1, sorted(kernels)
    o = attention[0].params[-1]
    assert len(o.shape) == 3 and int(o.shape[-1]) == W, o.shape
    # the same kernels as without the reshape: no merge, no copy for the reshape
    assert sorted(kernels) == sorted(_kernels(_encoder_attention(w))), sorted(kernels)
    _check_numbers(mod, w, noop_reshape=True)


def test_kt_and_v_are_the_head_layout_copies_left():
    kernels = _kernels(_encoder_attention(_weights(np.random.default_rng(0))))
    copies = [n for n in kernels if "split_heads" in n or "transpose" in n or "merge" in n]
    assert len(copies) == 2, sorted(kernels)  # Kᵀ's and V's (head_layouts.py says why)


@pytest.mark.parametrize("form", [{"biased": (False, True, True)}, {"v_read_twice": True}],
                         ids=["q-part-without-bias", "v-part-read-twice"])
def test_a_split_the_bias_rule_leaves_alone_still_computes_the_graph(form):
    """No bias on one part, or a part read by something besides its add: the biases stay
    after the split (the rule's conditions); attention still reads Q in place."""
    w = _weights(np.random.default_rng(2))
    mod = _encoder_attention(w, **form)
    kernels = _kernels(mod)
    assert not [n for n in kernels if n.startswith("fused_matmul_add")], sorted(kernels)
    assert len([n for n in kernels if n.startswith("fused_attention")]) == 1, sorted(kernels)
    _check_numbers(mod, w, **form)


def test_q_sliced_out_of_the_projection_is_read_at_its_offset():
    """Q as a slice of the projection's columns (W onward, after K's), not a split's part."""
    w = _weights(np.random.default_rng(4))
    form = {"biased": (False, False, False), "sliced": True}
    mod = _encoder_attention(w, **form)
    kernels = _kernels(mod)
    attention = [f for name, f in kernels.items() if name.startswith("fused_attention")]
    assert len(attention) == 1, sorted(kernels)
    q = attention[0].params[0]
    assert len(q.shape) == 3 and int(q.shape[-1]) == 3 * W, q.shape
    _check_numbers(mod, w, **form)
