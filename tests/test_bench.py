"""The benchmarks' plumbing on tiny sizes: every engine present, every output checked.
No timing assertions: these machines are shared and timings mean nothing here."""

from __future__ import annotations

import dataclasses
import functools
import json

import numpy as np
import pytest

from conftest import TINY_SPEC, assert_parity, fake_tuning_database, load_script
from portable_pe.bench import graph as bench
from portable_pe.bench.graph import ENGINES, NO_TUNING, Settings, bench_graph, time_in_blocks
from portable_pe.bench.engines import INT8_ENGINES
from portable_pe.host_cpu import KERNEL_FLAGS, cpu_flags

#: what tests/test_bf16.py's kernels ask of /proc/cpuinfo: AVX512-BF16 or AMX-BF16
HAS_BF16 = bool(cpu_flags() & {"avx512_bf16", "amx_bf16"})
TINY = Settings(lengths=(8,), batches=(1,), threads=1, repeat=2, min_time_s=0.0, warmup=1)


@pytest.fixture
def eager_compile(monkeypatch):
    """torch.compile with the eager backend: the plumbing without inductor's minute of
    C++ compiles (the slow tests run inductor itself)."""
    import torch
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))


@pytest.fixture(scope="module")
def rope_script():
    return load_script("bench_rope")


def _assert_well_formed(result, *, tuned: bool):
    assert [c.engine for c in result.cells] == list(ENGINES)
    for cell in result.cells:
        assert (cell.batch, cell.length) == (1, 8)
        if cell.engine == "tvm-tuned" and not tuned:
            assert cell.error == NO_TUNING and cell.median_ms is None
            continue
        if cell.engine == "tvm-bf16" and not HAS_BF16:
            # a CPU without bf16 instructions (AVX2-only x86, e.g. AMD Zen 3): the cell says why, the others still run
            assert cell.error.startswith("n/a (--precision bf16 needs") and cell.median_ms is None, cell.error
            continue
        assert not cell.error, f"{cell.engine}: {cell.error}"
        assert cell.max_abs is not None and cell.cosine is not None, f"{cell.engine} output not checked"
        # onnxruntime's and OpenVINO's int8 kernels round on CPUs without VNNI: not ours to judge
        assert cell.ok or cell.engine in ("onnxruntime-int8", "openvino-int8"), f"{cell.engine} output wrong"
        assert cell.runs >= TINY.repeat and cell.median_ms > 0 and cell.iqr_ms >= 0
        assert cell.ratio_vs_peer is not None
    peers = {c.engine: c.ratio_vs_peer for c in result.cells if c.engine in ("onnxruntime", "onnxruntime-int8")}
    assert peers == {"onnxruntime": 1.0, "onnxruntime-int8": 1.0}


def test_the_tuned_column_says_why_when_the_compile_would_leave_every_entry_out(tiny_bundle, tmp_path, monkeypatch):
    """A database whose recheck found main as fast at every tuned point: a tuned compile
    would build what the "tvm" column runs, so the bench compiles none and says so."""
    from portable_pe.bench.engines import NO_TUNED_ENTRY
    monkeypatch.setenv("PORTABLE_PE_TUNING_DIR", str(tmp_path / "db"))
    fake_tuning_database(tmp_path / "db", "tiny_rope", {"batch": 1, "seq": 8},
                         {"function": "main_b1_t8", "tuned_ms": 0.7, "main_ms": 0.6, "kept": False})
    lines = []
    result = bench_graph(str(TINY_SPEC), settings=dataclasses.replace(TINY, engines=("tvm", "tvm-tuned")),
                         bundle=tiny_bundle.path, out=tmp_path / "out", log=lines.append)
    cells = {c.engine: c for c in result.cells}
    assert cells["tvm-tuned"].error == NO_TUNED_ENTRY and cells["tvm-tuned"].median_ms is None
    assert not cells["tvm"].error and cells["tvm"].median_ms > 0
    assert not (tmp_path / "out" / "llvm-tuned").exists() and not any("compil" in line for line in lines), lines


def test_bench_graph_runs_every_engine_on_one_tiny_cell(tiny_bundle, tiny_int8_bundle, tmp_path, eager_compile):
    result = bench_graph(str(TINY_SPEC), settings=TINY, bundle=tiny_bundle.path, int8_bundle=tiny_int8_bundle.path,
                         out=tmp_path, log=lambda m: None)
    _assert_well_formed(result, tuned=False)
    text = result.to_markdown()
    assert "| 1 | 8 |" in text and NO_TUNING in text and "pools default (onnxruntime spinning" in text
    assert "| B | T | onnxruntime-int8 | openvino-int8 | tvm-int8 | tvm-int8 / tvm |" in text
    # the machine as results name it: the kernel-deciding flags this CPU has, and none it lacks
    named = result.environment["cpu_summary"].split("; ")[-1].split()
    have = [f for f in KERNEL_FLAGS if f in cpu_flags()]
    assert named == (have or ["none", "of", *KERNEL_FLAGS]), named
    # the bf16 table names what OpenVINO's default computed in, as the engine reported it
    assert f"its default: {'bf16' if HAS_BF16 else 'f32'} compute on this CPU" in text
    assert "int8 accuracy against PyTorch float32" in text
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["graph"] == "tiny_rope" and len(data["cells"]) == len(ENGINES)
    assert data["environment"]["threads"] == {"torch": 1, "tvm": 1, "onnxruntime": 1}
    assert data["environment"]["int8_bundle"] == str(tiny_int8_bundle.path)
    assert (tmp_path / "bench.png").read_bytes()[:4] == b"\x89PNG"


def test_bench_graph_tuned_column_and_a_failing_engine(tiny_bundle, monkeypatch, eager_compile):
    def broken(ctx):
        raise RuntimeError("inductor: no C++ compiler\nCppCompileError: g++ not found")
    monkeypatch.setitem(bench.ENGINES, "torch.compile", broken)
    settings = Settings(**{**TINY.__dict__, "engines": tuple(e for e in ENGINES if e not in INT8_ENGINES)})
    result = bench_graph(str(TINY_SPEC), settings=settings, bundle=tiny_bundle.path, tuned=tiny_bundle.path,
                         log=lambda m: None)
    cells = {c.engine: c for c in result.cells}
    assert cells["torch.compile"].error == "RuntimeError: CppCompileError: g++ not found"
    assert cells["tvm-tuned"].ok and cells["tvm-tuned"].runs >= TINY.repeat
    assert cells["tvm"].ok and cells["onnxruntime"].ok


def test_engines_are_timed_in_alternating_blocks():
    """Each engine runs alone for a block (so a spinning pool only competes with itself),
    and each round starts with the next engine."""
    log = []
    runs = {name: (lambda name=name: log.append(name)) for name in ("a", "b", "c")}
    times = time_in_blocks(runs, repeat=4, min_time_s=0.03, max_time_s=5.0, rounds=3)
    assert all(len(v) >= 4 for v in times.values())
    blocks = [name for i, name in enumerate(log) if i == 0 or log[i - 1] != name]
    assert len(blocks) == 9 and len(log) > len(blocks)  # 3 rounds x 3 engines, several runs per block
    assert blocks[:3] == ["a", "b", "c"] and blocks[3:6] == ["b", "c", "a"] and blocks[6:] == ["c", "a", "b"]


@pytest.mark.parametrize("pool,spin", [("default", True), ("passive", False)])
def test_onnxruntime_pool_mode(tiny_bundle, monkeypatch, pool, spin):
    """The default mode runs onnxruntime as its users do (spinning pool); passive turns spinning off."""
    from portable_pe.bench import engines as bench_engines
    from portable_pe.compile import simplify
    seen = {}
    real = simplify.ort_session
    monkeypatch.setattr(simplify, "ort_session", lambda model, **kw: seen.update(kw) or real(model, **kw))
    bench_engines.ort_engine({"bundle": tiny_bundle, "threads": 1, "pool": pool})
    assert seen == {"threads": 1, "spin": spin}


def test_bench_engine_subset(tiny_bundle):
    from dataclasses import replace
    result = bench_graph(str(TINY_SPEC), settings=replace(TINY, engines=("onnxruntime", "tvm")),
                         bundle=tiny_bundle.path, log=lambda m: None)
    assert [c.engine for c in result.cells] == ["onnxruntime", "tvm"] and all(c.ok for c in result.cells)
    assert "| B | T | onnxruntime | tvm |" in result.to_markdown() and "int8" not in result.to_markdown()
    with pytest.raises(ValueError, match=r"unknown engine\(s\) \['tflite'\]"):
        bench_graph(str(TINY_SPEC), settings=replace(TINY, engines=("tflite",)), bundle=tiny_bundle.path,
                    log=lambda m: None)


def test_bench_cli_defaults():
    from portable_pe.cli.main import build_parser
    from portable_pe.bench import engines as bench_engines
    from portable_pe.cli.parser import BENCH_ENGINES, BENCH_POOLS
    args = build_parser().parse_args(["bench", "rope"])
    assert (args.lengths, args.batch, args.threads, args.tuned, args.pool) == ([128, 512], [1, 8], 2, None, "default")
    assert BENCH_ENGINES == tuple(bench_engines.ENGINES) and BENCH_POOLS == bench_engines.POOLS
    assert args.engines.split(",") == list(ENGINES)


@pytest.mark.parametrize("shape", [(1, 2, 16, 8), (2, 3, 300, 16)], ids=["tiny", "tail-block"])
def test_rope_kernel_engines_match_float64_reference(rope_script, shape, eager_compile):
    runs, rows = rope_script.check_engines(rope_script.Shape(*shape), threads=1)
    assert set(rows) == set(rope_script.ENGINES)
    for name, row in rows.items():
        assert not row.error, f"{name}: {row.error}"
        assert name in runs
    # each engine's output, on inputs made here, against RoPE as a complex rotation of the
    # halves (x1 + i x2) * (cos + i sin), in float64: not the script's own reference
    b, h, t, d = shape
    rng = np.random.default_rng(7)
    x = rng.standard_normal(shape).astype(np.float32)
    angles = np.arange(t)[:, None] * 10000.0 ** (-np.arange(d // 2) / (d // 2))
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    z = (x[..., : d // 2] + 1j * x[..., d // 2:].astype(np.float64)) * (cos + 1j * sin.astype(np.float64))
    rope = np.concatenate([z.real, z.imag], axis=-1).astype(np.float32)
    for name, make in rope_script.ENGINES.items():
        run, fetch = make(rope_script.Shape(*shape), 1)(x, cos, sin)
        got = np.asarray(fetch(run()))
        # the script's ATOL (1e-4 absolute) is the float32_abs row
        assert_parity(x if name in rope_script.COPIES else rope, got, tolerance="float32_abs", name=name, length=t)


def test_rope_kernel_report_has_bandwidth_and_ratio(rope_script, eager_compile):
    result = rope_script.bench_rope(rope_script.Shape(1, 2, 16, 8), threads=1, repeat=2, min_time_s=0.0,
                                    warmup=0, log=lambda m: None)
    rows = {r["engine"]: r for r in result["rows"]}
    assert all(r["gbps"] > 0 and r["of_copy"] > 0 for r in rows.values())
    assert max(rows[c]["of_copy"] for c in rope_script.COPIES) == pytest.approx(1.0)
    assert result["tvm_over_ort_speed"] > 0 and "TVM (TIR) vs onnxruntime" in rope_script.to_markdown(result)


@pytest.mark.slow
def test_inductor_engines_for_real(tiny_bundle, rope_script):
    result = bench_graph(str(TINY_SPEC), settings=TINY, bundle=tiny_bundle.path, log=lambda m: None)
    cell = next(c for c in result.cells if c.engine == "torch.compile")
    assert cell.ok, cell.error
    runs, rows = rope_script.check_engines(rope_script.Shape(1, 2, 16, 8), threads=1,
                                           engines={"torch.compile": rope_script.ENGINES["torch.compile"]})
    assert "torch.compile" in runs and np.isfinite(rows["torch.compile"].max_abs_err)


def test_fp32_floor_counts_every_matmul_multiply_add():
    """PyTorch's count of the tiny encoder's matmul work equals the count from its shape:
    per layer the Q, K, V and output projections (4 d^2), the FFN (2 d d_ff) per token,
    and Q·Kᵀ and P·V (2 T^2 d per sequence); 2 FLOPs per multiply-add."""
    floor = load_script("fp32_floor")
    d, d_ff, layers = 64, 128, 2
    for batch, seq in ((1, 8), (3, 20)):
        tokens = batch * seq
        expected = 2 * layers * (tokens * (4 * d * d + 2 * d * d_ff) + batch * 2 * seq * seq * d)
        assert floor.matmul_gflop(str(TINY_SPEC), batch, seq) * 1e9 == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("mcpu, shape", [("skylake-avx512", (16, 12)), ("znver3", (8, 10)), ("haswell", (8, 10))])
def test_fp32_floor_peak_chains_are_the_cpus_vectors_and_fit_its_registers(mcpu, shape):
    """16-lane chains on an AVX2 CPU were split into twice the ymm accumulators and
    spilled: the peak read 117 GFLOP/s on a 2-core Zen 3 where 8-lane chains read 205."""
    import tvm
    from portable_pe.cpu_schedule.tir_util import _simd_registers
    floor = load_script("fp32_floor")
    target = tvm.target.Target({"kind": "llvm", "mcpu": mcpu})
    lanes, chains = floor._chain_shape(target)
    assert (lanes, chains) == shape and chains + 2 <= _simd_registers(target)


def test_fp32_floor_peak_kernel_does_its_multiply_adds():
    """The peak kernel's chains must really run (not be folded away), or the peak, and the
    floor with it, would be wrong: its outputs equal the recurrence a = a * 0.999999 + 1e-7
    run `steps` times from each chain's start value."""
    import tvm
    floor = load_script("fp32_floor")
    threads, steps = 2, 300
    kernel, lanes, chains = floor._fma_kernel(threads)
    out = tvm.runtime.tensor(np.zeros(threads * chains * lanes, np.float32))
    kernel(out, steps)
    got = out.numpy().reshape(threads, chains, lanes)
    for t in range(threads):
        for c in range(chains):
            a = float(np.float32(t + c) * np.float32(1e-3))
            for _ in range(steps):
                a = a * 0.999999 + 1e-7
            # float32 rounding over 300 steps drifts ~1e-5; one step fewer or more is 3e-3 off
            # (a count of the kernel's steps against a recurrence, not a parity tolerance)
            np.testing.assert_allclose(got[t, c], a, rtol=1e-4)
