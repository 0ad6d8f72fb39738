"""bf16_pack_k: K packed for the AMX attention straight from its rows is bit for bit the
pack of Kᵀ (bf16_attention.pack_kt), from each source the fuser finds; and the fuser takes
the route the graph allows."""

from __future__ import annotations

import numpy as np
import pytest

from portable_pe.host_cpu import cpu_flags
from portable_pe.cpu_schedule.work_claims import cpu_tir_pipeline

CPU_FLAGS = cpu_flags()
AMX = ["+avx512bf16", "+amx-tile", "+amx-bf16"]
needs_bf16 = pytest.mark.skipif("avx512_bf16" not in CPU_FLAGS, reason="this CPU has no avx512_bf16 (vcvtneps2bf16)")
needs_amx = pytest.mark.skipif(not {"amx_tile", "amx_bf16"} <= CPU_FLAGS, reason="this CPU has no AMX-BF16")


def _target():
    import tvm
    return tvm.target.Target({"kind": "llvm", "mcpu": "rocketlake", "mattr": AMX, "num-cores": 2})


def _reference(kt: np.ndarray) -> np.ndarray:
    """pack_kt of Kᵀ [B, H, D, S], built and run by TVM."""
    import tvm
    from tvm import te
    from portable_pe.cpu_schedule.bf16_attention import pack_kt
    placeholder = te.placeholder(kt.shape, "float32", name="kt")
    packed = pack_kt(placeholder)
    module = tvm.compile(tvm.IRModule({"main": te.create_prim_func([placeholder, packed])}), target=_target())
    out = tvm.runtime.tensor(np.zeros([int(n) for n in packed.shape], "uint32"))
    module["main"](tvm.runtime.tensor(kt), out)
    return out.numpy()


@needs_bf16
@pytest.mark.parametrize("layout", ["bshd", "bhsd", "qkv"])
@pytest.mark.parametrize("batch,keys", [(1, 1), (2, 7), (1, 32), (2, 45), (1, 64)])
def test_packed_rows_are_the_pack_of_k_transposed_bit_for_bit(layout, batch, keys):
    """Whole panels go through the register transpose, the last one (keys past S zero,
    S rounded up to 32) through a copy; K has values that round both ways, and the qkv
    source adds its bias before rounding, as the graph's add does."""
    import tvm
    from portable_pe.cpu_schedule.bf16_pack_k import pack_k_kernel, packed_keys
    heads, d = 2, 64
    rng = np.random.default_rng(keys)
    bias = rng.standard_normal(heads * d).astype(np.float32)
    if layout == "qkv":
        qkv = rng.standard_normal((batch, keys, 3 * heads * d)).astype(np.float32)
        k = (qkv[:, :, heads * d:2 * heads * d] + bias).reshape(batch, keys, heads, d).transpose(0, 2, 1, 3)
        args = [qkv, bias]
    else:
        k = rng.standard_normal((batch, heads, keys, d)).astype(np.float32)
        args = [np.ascontiguousarray(k.transpose(0, 2, 1, 3)) if layout == "bshd" else k]
    func = pack_k_kernel(heads=heads, head_dim=d, layout=layout, width=3 * heads * d, offset=heads * d)
    module = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=_target())
    panels = int(tvm.sym.Analyzer().simplify(packed_keys(tvm.tirx.IntImm("int64", keys))))
    out = tvm.runtime.tensor(np.zeros((batch, heads, panels, d // 2, 16), "uint32"))
    module["main"](*(tvm.runtime.tensor(np.ascontiguousarray(a)) for a in args), out)
    expected = _reference(np.ascontiguousarray(k.transpose(0, 1, 3, 2)))
    assert out.numpy().shape == expected.shape
    assert np.array_equal(out.numpy(), expected)


def test_pack_k_refuses_an_unknown_layout():
    from portable_pe.cpu_schedule.bf16_pack_k import pack_k_kernel
    with pytest.raises(ValueError, match="layout must be one of bshd, bhsd or qkv, got 'sbhd'"):
        pack_k_kernel(heads=2, head_dim=64, layout="sbhd")


BIASES = [np.random.default_rng(i).standard_normal(2 * 64).astype(np.float32) for i in range(3)]


def _projected_attention(heads: int = 2, d: int = 64):
    """softmax(Q·Kᵀ·0.125) @ V with q, k, v the thirds of one projection x [b, t, 3HD] plus
    BIASES, split into heads: K transposed straight from its split ([0, 2, 3, 1]), as the
    shipped text graphs export it."""
    from tvm import relax, tirx
    b, t = tirx.Var("b", "int64"), tirx.Var("t", "int64")
    x = relax.Var("x", relax.TensorType([b, t, 3 * heads * d], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            parts = bb.emit(relax.op.split(x, 3, axis=-1))
            q, k, v = (bb.emit(relax.op.reshape(bb.emit(relax.op.add(
                bb.emit(relax.TupleGetItem(parts, i)), relax.const(BIASES[i]))),
                [b, t, heads, d])) for i in range(3))
            q, v = (bb.emit(relax.op.permute_dims(a, [0, 2, 1, 3])) for a in (q, v))
            kt = bb.emit(relax.op.permute_dims(k, [0, 2, 3, 1]))
            s = bb.emit(relax.op.multiply(relax.op.matmul(q, kt), relax.const(0.125, "float32")))
            out = bb.emit_output(relax.op.matmul(bb.emit(relax.op.nn.softmax(s, axis=-1)), v))
        bb.emit_func_output(out)
    return bb.get()


def test_the_fuser_packs_k_from_the_projection_it_is_a_slice_of():
    """No transposed Kᵀ and no pack_kt: one pack_k kernel reads the projection and the bias."""
    from tvm import tirx
    from portable_pe.cpu_schedule.attention import FuseAttention
    with _target():
        fused = FuseAttention(bf16=True)(_projected_attention())
    kernels = {gv.name_hint: f for gv, f in fused.functions_items() if isinstance(f, tirx.PrimFunc)}
    assert "pack_kt" not in kernels and "pack_k" in kernels, sorted(kernels)
    assert len(kernels["pack_k"].params) == 3  # projection, bias, packed K


@needs_amx
def test_attention_over_a_fused_projection_matches_float64():
    """The whole route on the AMX kernel, against float64 with bf16-rounded operands."""
    import tvm
    from tvm import relax
    from portable_pe.cpu_schedule import cpu_pipeline
    from conftest import assert_parity
    heads, d = 2, 64
    mod = _projected_attention(heads, d)
    target = _target()
    vm = relax.VirtualMachine(tvm.compile(mod, target=target, relax_pipeline=cpu_pipeline(target, precision="bf16"),
                                          tir_pipeline=cpu_tir_pipeline(target)),
                              tvm.cpu())
    for b, t in ((1, 1), (2, 45), (1, 128)):
        x = np.random.default_rng(t).standard_normal((b, t, 3 * heads * d)).astype(np.float32)
        got = vm["main"](tvm.runtime.tensor(x)).numpy()
        q, k, v = (np.ascontiguousarray((x[:, :, i * heads * d:(i + 1) * heads * d] + BIASES[i])
                                        .reshape(b, t, heads, d).transpose(0, 2, 1, 3)) for i in range(3))
        logits = q.astype(np.float64) @ k.astype(np.float64).transpose(0, 1, 3, 2) * 0.125
        p = np.exp(logits - logits.max(-1, keepdims=True))
        expected = ((p / p.sum(-1, keepdims=True)) @ v).astype(np.float32)
        assert_parity(expected, got, tolerance="bf16_linear", name=f"b={b} t={t}")

