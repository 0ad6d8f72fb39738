"""--precision int8 on AVX2 without VNNI: attention's Q·Kᵀ in int8 (int8_attention.py) from
INT8_MIN_KEYS keys on, float32 scores below (one kernel, a run-time test).

The kernels are held, element by element, to a numpy model of the same quantization (keys
to 7 bits and queries to 8 bits per row, float32 scales as the kernels compute them, the
integer scores exact), so a wrong packing, offset or scale shows as a mismatch far above
float rounding; how close the quantized attention stays to float32 attention is the
bundle's parity (and the cosine against onnxruntime's int8, whose attention is float32).
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from portable_pe.cpu_schedule import cpu_pipeline, fusion_passes
from portable_pe.cpu_schedule.attention import FuseAttention
from portable_pe.cpu_schedule.int8_attention import INT8_MIN_KEYS, K_MAX, Q_MAX, pack_k_kernel
from portable_pe.cpu_schedule.work_claims import cpu_tir_pipeline
from portable_pe.host_cpu import cpu_flags

from test_attention_kernel import (BIASES, H, SCALE, _attention, _inputs, _masked_causally, _reference, _run,
                                   _sdpa_decomposition)

# AVX2 without VNNI: the CPUs whose int8 kernel is avx2-u8s7, and a subset of every AVX2 CPU
HASWELL = tvm.target.Target({"kind": "llvm", "mcpu": "haswell", "num-cores": 2})
D = 16
needs_avx2 = pytest.mark.skipif("avx2" not in cpu_flags(), reason="this CPU has no AVX2")


def _quantized_keys(k):
    """(kq, ks) per key row as pack_k_kernel computes them, in float32."""
    top = np.abs(k).max(-1, keepdims=True)
    with np.errstate(divide="ignore"):
        inv = np.where(top > 0, np.float32(K_MAX) / top, np.float32(0)).astype(np.float32)
    return np.round(k * inv), top * np.float32(1.0 / K_MAX)


def _quantized_reference(q, k, v, bias=None):
    """softmax(Q·Kᵀ·SCALE + bias)·V with the scores from int8 operands, as the kernel has them."""
    kq, ks = _quantized_keys(k)
    top = np.abs(q).max(-1, keepdims=True)
    with np.errstate(divide="ignore"):
        inv = np.where(top > 0, np.float32(Q_MAX) / top, np.float32(0)).astype(np.float32)
    qq, q_mul = np.round(q * inv), top * np.float32(SCALE / Q_MAX)
    factor = (q_mul * np.swapaxes(ks, -1, -2)).astype(np.float32)  # [b, h, t, 1] x [b, h, 1, s], in float32
    s = (qq.astype(np.float64) @ np.swapaxes(kq, -1, -2).astype(np.float64)) * factor
    if bias is not None:
        s = s + bias
    with np.errstate(invalid="ignore"):
        e = np.exp(s - s.max(-1, keepdims=True))
        return (e / e.sum(-1, keepdims=True)) @ v.astype(np.float64)


def _fused_names(module, target, precision):
    with target:
        fused = tvm.transform.Sequential(fusion_passes(precision=precision))(module)
    return {gv.name_hint for gv, f in fused.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}


def _vm(module, target=HASWELL):
    return relax.VirtualMachine(tvm.compile(module, target=target, relax_pipeline=cpu_pipeline(target, precision="int8"),
                                            tir_pipeline=cpu_tir_pipeline(target)), tvm.cpu())


def _packed(lib, kt):
    """(kp, ks, kc) from the packing kernel, each filled with 7s before the call."""
    b, _, _, s = kt.shape
    blocks = (s + 7) // 8
    out = [tvm.runtime.tensor(np.full(shape, 7, dtype), tvm.cpu()) for shape, dtype in
           [((b, H, blocks, D // 4, 32), "int8"), ((b, H, blocks * 8), "float32"), ((b, H, blocks * 8), "int32")]]
    lib["pack"](tvm.runtime.tensor(kt, tvm.cpu()), *out)
    return [o.numpy() for o in out]


@needs_avx2
def test_keys_are_packed_as_the_numpy_model_quantizes_them():
    """8 keys by 4 elements per 32-byte vector, 7-bit values, their scales and 128 x their
    sums; a key of zeros gets scale 0, and the last, partial block (333 = 41 x 8 + 5) zeros
    past the end. Under INT8_MIN_KEYS keys the kernel writes nothing."""
    func = pack_k_kernel(heads=H, qk_dim=D).with_attr("global_symbol", "pack")
    lib = tvm.compile(tvm.IRModule({"pack": func}), target=HASWELL, tir_pipeline=cpu_tir_pipeline(HASWELL))
    rng = np.random.default_rng(0)
    assert all((o == 7).all() for o in _packed(lib, rng.standard_normal((2, H, D, INT8_MIN_KEYS - 1), dtype=np.float32)))
    b, s = 2, 333
    kt = rng.standard_normal((b, H, D, s), dtype=np.float32) * 3
    kt[1, 0, :, 10] = 0.0
    blocks = (s + 7) // 8
    kp, ks, kc = _packed(lib, kt)
    want_q, want_s = _quantized_keys(np.swapaxes(kt, -1, -2))  # per key row [b, H, s, D]
    got_q = kp.reshape(b, H, blocks, D // 4, 8, 4).transpose(0, 1, 2, 4, 3, 5).reshape(b, H, blocks * 8, D)
    assert np.abs(want_q).max() == K_MAX and np.array_equal(got_q[:, :, :s], want_q.astype(np.int8))
    assert not got_q[:, :, s:].any() and not ks[:, :, s:].any() and not kc[:, :, s:].any()
    assert np.array_equal(ks[:, :, :s], want_s[..., 0]) and ks[1, 0, 10] == 0
    assert np.array_equal(kc[:, :, :s], 128 * want_q.sum(-1).astype(np.int32))


@needs_avx2
@pytest.mark.parametrize("form", ["no-bias", "head-bias", "batch-bias"])
def test_int8_scores_match_their_quantized_model(form):
    """From INT8_MIN_KEYS keys on (256, and 300 and 333 with ragged key tails and row
    blocks) the quantized model, under it (one query, 5, 77, 255) float32 attention; batch 2;
    the scores' vpmaddubsw in the kernel."""
    bias_dims, bias_first = BIASES[form]
    module = _attention(bias_dims, bias_first=bias_first, head_dim=D)
    assert {"fused_attention_int8", "pack_k_int8"} <= _fused_names(module, HASWELL, "int8")
    executable = tvm.compile(module, target=HASWELL, relax_pipeline=cpu_pipeline(HASWELL, precision="int8"),
                             tir_pipeline=cpu_tir_pipeline(HASWELL))
    assert "vpmaddubsw" in executable.mod.imports[0].inspect_source("asm")
    vm = relax.VirtualMachine(executable, tvm.cpu())
    rng = np.random.default_rng(1)
    for b, t in [(1, 1), (2, 5), (1, 77), (1, INT8_MIN_KEYS - 1), (1, INT8_MIN_KEYS), (2, 300), (1, 333)]:
        q, k, v, bias = _inputs(rng, b, t, bias_dims)
        got = _run(vm, q, k, v, bias)
        want = (_quantized_reference if t >= INT8_MIN_KEYS else _reference)(q, k, v, bias)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6, err_msg=f"b={b} t={t}")


@needs_avx2
def test_int8_scores_zero_fully_masked_rows():
    """torch's SDPA decomposition (a -inf mask, where(isnan(p), 0, p)) with int8 scores,
    and with float32 ones under INT8_MIN_KEYS."""
    vm = _vm(_sdpa_decomposition())
    rng = np.random.default_rng(2)
    for b, t in [(2, 9), (1, 260)]:
        q, k, v, _ = _inputs(rng, b, t, None)
        mask = _masked_causally(b, t)
        got = _run(vm, q, k, v, mask)
        with np.errstate(invalid="ignore"):
            want = np.nan_to_num((_quantized_reference if t >= INT8_MIN_KEYS else _reference)(q, k, v, mask), nan=0.0)
        assert np.isfinite(got).all() and not got[0, :, t // 2].any()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("target,precision,int8", [
    ({"mcpu": "haswell"}, "int8", True),
    ({"mcpu": "znver3"}, "int8", True),
    ({"mcpu": "haswell"}, "fp32", False),               # only int8 builds quantize attention
    ({"mcpu": "skylake-avx512"}, "int8", False),        # avx512bw: no kernel for it yet
    ({"mcpu": "cascadelake"}, "int8", False),           # VNNI: its 8-bit weights, float32 attention
    ({"mcpu": "alderlake"}, "int8", False),             # AVX-VNNI
    ({"mtriple": "aarch64-linux-gnu", "mattr": ["+neon", "+dotprod"]}, "int8", False),
], ids=["haswell", "znver3", "haswell-fp32", "avx512bw", "avx512-vnni", "avx-vnni", "aarch64"])
def test_which_builds_take_int8_scores(target, precision, int8):
    names = _fused_names(_attention(None, head_dim=D), tvm.target.Target({"kind": "llvm", **target}), precision)
    assert ("fused_attention_int8" in names) == int8 and ("pack_k_int8" in names) == int8, names
    assert int8 or "fused_attention" in names or "fused_attention_bf16" in names, names


def test_the_pass_alone_leaves_float32_builds_alone():
    with HASWELL:
        mod = FuseAttention(int8=False)(_attention(None, head_dim=D))
    assert {gv.name_hint for gv, _ in mod.functions_items()} == {"main", "fused_attention"}


@needs_avx2
def test_int8_bundle_with_int8_scores_is_no_less_accurate_than_onnxruntime_int8(tiny_int8_bundle):
    """Where the host's int8 kernel is avx2-u8s7, the tiny int8 bundle's two attentions take
    int8 scores (the manifest says so) and its output stays as close to PyTorch float32 as
    onnxruntime's int8 of the same QDQ graph (whose attention is float32)."""
    from portable_pe.cpu_schedule.int8_isa import int8_isa
    from portable_pe.run.parity import check_bundle
    host = tvm.target.Target({"kind": "llvm", "mcpu": tvm.target.codegen.llvm_get_system_cpu()})
    section = tiny_int8_bundle.manifest["int8"]
    if int8_isa(host).name != "avx2-u8s7":
        assert "attentions_int8_scores" not in section, section
        pytest.skip(f"this CPU's int8 kernel is {int8_isa(host).name}: attention stays float32 (or bf16 on AMX)")
    assert section["attentions_int8_scores"] == 2 and section["attentions_float32"] == 0, section
    report = check_bundle(tiny_int8_bundle, lengths=(1, 33, 300), batch=2)
    assert report.ok, report.to_markdown()
    rows = {(r.candidate, r.length): r for r in report.rows}
    for t in (1, 33, 300):
        assert rows[("tvm", t)].cosine >= rows[("onnxruntime", t)].cosine - 1e-6, report.to_markdown()
