"""bf16_rounding: 16-lane roundings to bf16 as vcvtneps2bf16 where the target has it."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import te

from portable_pe.cpu_schedule.bf16_linear import bf16_bits, bf16_bits_expr
from portable_pe.cpu_schedule.work_claims import cpu_tir_pipeline
from portable_pe.host_cpu import cpu_flags

BF16_CPU = tvm.target.Target({"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 2})
NO_BF16 = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2})


def _rounding(target, n: int = 64):
    """bits[i] = bf16_bits(x[i]), vectorized 16 lanes at a time, built for `target`."""
    x = te.placeholder((n,), "float32", name="x")
    bits = te.compute((n,), lambda i: bf16_bits_expr(x[i]), name="bits")
    func = te.create_prim_func([x, bits])
    sch = tvm.s_tir.Schedule(func)
    _, inner = sch.split(sch.get_loops(sch.get_sblock("bits"))[0], [None, 16])
    sch.vectorize(inner)
    return tvm.compile(sch.mod, target=target, tir_pipeline=cpu_tir_pipeline(target))


def _asm(lib) -> str:
    return "\n".join(m.inspect_source("s") for m in [lib.mod, *lib.mod.imports] if m.kind == "llvm")


def test_a_target_with_avx512bf16_rounds_in_one_instruction_and_one_without_keeps_the_integer_code():
    assert "vcvtneps2bf16" in _asm(_rounding(BF16_CPU))
    no_bf16 = _asm(_rounding(NO_BF16))
    assert "vcvtneps2bf16" not in no_bf16 and "vpsrld" in no_bf16


@pytest.mark.skipif("avx512_bf16" not in cpu_flags(), reason="this CPU has no AVX512-BF16")
def test_the_instruction_rounds_as_the_integer_code_does():
    """Ties to even both ways, values that round up to the next binade and to infinity,
    infinities, and random values; NaN stays NaN (its bits are the instruction's)."""
    ties = np.array([0x3F808000, 0x3F818000, 0x3F7F8000, 0xBF808000, 0x3F80FFFF, 0x3F807FFF, 0x7F7F8000,
                     0x7F800000, 0xFF800000, 0x00000000, 0x80000000, 0x3FFFFFFF], dtype=np.uint32).view(np.float32)
    rng = np.random.default_rng(0)
    x = np.concatenate([ties, rng.standard_normal(64 - ties.size - 1).astype(np.float32) * 1e3, [np.nan]])
    x = x.astype(np.float32)
    out = tvm.runtime.empty((64,), "uint16")
    _rounding(BF16_CPU)(tvm.runtime.tensor(x), out)
    got = out.numpy()
    np.testing.assert_array_equal(got[:-1], bf16_bits(x[:-1]))
    assert np.isnan(np.array([np.uint32(got[-1]) << 16], dtype=np.uint32).view(np.float32)[0])
