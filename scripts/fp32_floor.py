"""The fastest any float32 engine could run a graph on this CPU: its multiply-add work at
the CPU's measured float32 FMA peak.

Every float32 engine has to do each multiply-add of the graph's matmuls (the dense layers,
Q·Kᵀ and P·V) on the float32 FMA units, so ``matmul FLOPs / FMA peak`` is a lower bound on
its latency, with norms, softmax, data movement and threading all for free. If that floor
is above a latency goal, no float32 implementation meets the goal; only lower precision
(bf16, int8) can.

- FLOPs are counted by PyTorch's FlopCounterMode on the graph's own model at (B, T): a
  count independent of our compiler.
- The peak is measured, not taken from a data sheet: a TVM kernel of independent FMA
  chains of the CPU's widest vector (16 lanes with AVX-512, 8 with AVX2) held in registers
  (12 per thread with 32 vector registers, 10 with 16: more than the FMA latency times the
  FMA ports), one chain set per thread, on `threads` threads. The script also prints the peak
  as GFLOP/s so it can be checked against the best GEMM rate seen on the machine.

    python scripts/fp32_floor.py [--graphs rope,alibi] [--threads 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

def _chain_shape(target) -> tuple[int, int]:
    """(lanes, chains) of the FMA kernel for `target`: its widest float32 vector, and as
    many independent accumulators as fit its vector registers beside the two operands.
    FMA latency (4 cycles) x 2 ports = 8 in flight is enough; 12 of the 32 zmm registers
    leave margin, and with 16 registers (AVX2) 10 do: 12 double-width (16-lane) chains on
    AVX2 were split into 24 ymm accumulators that spilled, and read 117 GFLOP/s on a 2-core
    Zen 3 where 8-lane chains read more (scripts/results/bench-all-stop51-amd.md)."""
    from portable_pe.cpu_schedule.tir_util import _simd_registers, _vector_lanes
    return _vector_lanes(target), (12 if _simd_registers(target) >= 32 else 10)


def _fma_kernel(threads: int):
    import tvm
    from tvm.script import tirx as T
    from portable_pe.backends.llvm import tvm_target
    from portable_pe.backends.targets import load_target

    target = tvm_target(load_target("llvm"))
    lanes, chains = _chain_shape(target)
    vec = f"float32x{lanes}"

    @T.prim_func
    def fma_peak(out: T.Buffer((threads * chains * lanes,), "float32"), steps: T.int32):
        T.func_attr({"global_symbol": "fma_peak", "tirx.noalias": True})
        for t in T.parallel(threads):
            acc = T.alloc_buffer((chains * lanes,), "float32", scope="local")
            for c in T.unroll(chains):
                acc[T.ramp(c * lanes, 1, lanes)] = T.Broadcast(T.Cast("float32", t + c) * T.float32(1e-3), lanes)
            for _ in range(steps):
                for c in T.unroll(chains):
                    acc[T.ramp(c * lanes, 1, lanes)] = T.call_llvm_pure_intrin(
                        vec, f"llvm.fma.v{lanes}f32", acc[T.ramp(c * lanes, 1, lanes)],
                        T.Broadcast(T.float32(0.999999), lanes), T.Broadcast(T.float32(1e-7), lanes))
            for c in T.unroll(chains):
                out[T.ramp((t * chains + c) * lanes, 1, lanes)] = acc[T.ramp(c * lanes, 1, lanes)]

    return tvm.compile(fma_peak, target=target)["fma_peak"], lanes, chains


def fma_peak_gflops(threads: int, *, seconds: float = 1.0) -> float:
    """The best of several timed runs of the FMA kernel, in GFLOP/s (2 FLOPs per lane).
    The pool's idle policy is left as it is (the kernel keeps every worker busy)."""
    from portable_pe.threads import set_threads
    set_threads(threads, passive=False)
    import numpy as np
    import tvm
    kernel, lanes, chains = _fma_kernel(threads)
    out = tvm.runtime.tensor(np.zeros(threads * chains * lanes, np.float32))
    steps = 1 << 16
    kernel(out, steps)  # pool start-up and page faults outside the timing
    best = 0.0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        kernel(out, steps)
        elapsed = time.perf_counter() - start
        best = max(best, threads * chains * lanes * 2 * steps / elapsed / 1e9)
    return best


def matmul_gflop(graph: str, batch: int, seq: int) -> float:
    """The graph's matmul work at (batch, seq), GFLOP per run, counted by PyTorch."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from portable_pe.compile.export import example_inputs
    from portable_pe.spec.graphs import load_graph
    spec = load_graph(graph)
    model = spec.build().eval()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(*example_inputs(spec, batch=batch, length=seq))
    return counter.get_total_flops() / 1e9


def main() -> int:
    from portable_pe.spec.graphs import GRAPHS
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--graphs", default=",".join(GRAPHS))
    parser.add_argument("--lengths", default="128,512")
    parser.add_argument("--batch", default="1,8")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    peak = fma_peak_gflops(args.threads)
    print(f"float32 FMA peak, {args.threads} threads: {peak:.0f} GFLOP/s\n")
    print("| graph | B | T | matmul GFLOP | floor ms |\n|---|---:|---:|---:|---:|")
    for graph in args.graphs.split(","):
        for b in (int(v) for v in args.batch.split(",")):
            for t in (int(v) for v in args.lengths.split(",")):
                gflop = matmul_gflop(graph, b, t)
                print(f"| {graph} | {b} | {t} | {gflop:.3f} | {gflop / peak * 1e3:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
