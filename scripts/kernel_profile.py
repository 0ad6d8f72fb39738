"""Where an llvm bundle's time goes: milliseconds per kernel, slowest first.

Every kernel call of the entry the runtime would pick is timed through the Relax VM's
instrument hook (the timing `portable-pe tune --recheck` uses). Per kernel: the median
over the runs of its calls' sum. The hook itself costs a few microseconds per call, so the
kernels add up to a bit more than an uninstrumented run; onnxruntime's whole-graph median,
timed after TVM's runs, is printed for scale.

`--pool passive` (the default) lets idle workers sleep, so every kernel call also pays a
thread wake-up: small kernels read up to 4x slower than they run under `portable-pe bench`
(rope fp32 B1 T512: its layer norms 0.73 ms passive, 0.32 spinning; its head merges 0.22 and
0.05). `--pool default` leaves the pools spinning, as bench times them, for the kernels'
own times.

    python scripts/kernel_profile.py dist/rope-llvm [--batch 1] [--seq 128] [--runs 30] [--pool default]
    python scripts/kernel_profile.py dist/vit_rope_2d-llvm --size 224x224     # a vision bundle
"""

from __future__ import annotations

import argparse
import time
from collections import Counter, defaultdict

import numpy as np


def profile_kernels(bundle_path, *, batch: int = 1, seq: int = 128, runs: int = 30, threads: int = 2,
                    top: int = 12, size: str | None = None, pool: str = "passive") -> str:
    """The Markdown table of ms per kernel (slowest first) for one (batch, seq) cell.
    ``pool`` "passive": idle workers sleep (each kernel call pays a wake-up); "default":
    the pools spin as `portable-pe bench` leaves them (see the module doc)."""
    from portable_pe.threads import set_threads
    set_threads(threads, passive=pool == "passive")
    import tvm
    from portable_pe.bundle.artifact import load_bundle
    from portable_pe.run.parity import dim_roles, make_inputs
    from portable_pe.run.local import LocalRunner, entry_for
    from portable_pe.compile.simplify import ort_session
    from portable_pe.tune.judge import timed_kernel_calls

    bundle = load_bundle(bundle_path)
    runner = LocalRunner(bundle)
    from portable_pe.run.parity import parse_sizes, pixel_roles
    sizes = parse_sizes(size, pixel_roles(bundle.manifest)) if size else None  # a vision bundle's image
    inputs = make_inputs(bundle.manifest["inputs"], length=seq, batch=batch, dim_roles=dim_roles(bundle.manifest),
                         sizes=sizes)
    entry = entry_for(bundle.manifest, inputs)
    tensors = [tvm.runtime.tensor(np.ascontiguousarray(inputs[s["name"]]), device=runner.device)
               for s in bundle.manifest["inputs"]]
    session = ort_session(bundle.file("model.onnx"), threads=threads, spin=pool == "default")
    names = [o.name for o in session.get_outputs()]
    for _ in range(3):
        runner.vm[entry](*tensors)
        session.run(names, inputs)
    per_kernel: dict[str, list[float]] = defaultdict(list)
    calls: Counter = Counter()
    totals, ort = [], []
    for _ in range(runs):
        run = timed_kernel_calls(runner.vm, entry, tensors)
        summed: dict[str, float] = defaultdict(float)
        for symbol, seconds in run:
            summed[symbol] += seconds
        calls = Counter(symbol for symbol, _ in run)
        for symbol, seconds in summed.items():
            per_kernel[symbol].append(seconds)
        totals.append(sum(summed.values()))
    for _ in range(runs):  # after TVM's runs: a spinning onnxruntime pool would take a core from TVM's
        start = time.perf_counter()
        session.run(names, inputs)
        ort.append(time.perf_counter() - start)
    ms = {k: 1000 * float(np.median(v)) for k, v in per_kernel.items()}
    total = 1000 * float(np.median(totals))
    cell = f"B={batch} {size}" if size else f"B={batch} T={seq}"
    lines = [f"{bundle.name} ({bundle.manifest.get('precision', 'fp32')}), entry {entry}, {cell}, "
             f"{threads} threads, {pool} pools, {runs} runs: kernels {total:.2f} ms in all, onnxruntime {1000 * float(np.median(ort)):.2f} ms "
             f"(whole graph, same model.onnx)", "", "| kernel | calls | ms per run | share |", "|---|---:|---:|---:|"]
    ranked = sorted(ms.items(), key=lambda kv: -kv[1])
    for symbol, value in ranked[:top]:
        lines.append(f"| {symbol[:70]} | {calls.get(symbol, 0)} | {value:.3f} | {100 * value / total:.0f}% |")
    rest = sum(v for _, v in ranked[top:])
    if rest:
        lines.append(f"| {len(ranked) - top} other kernels | | {rest:.3f} | {100 * rest / total:.0f}% |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("bundle")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--size", help="a vision bundle's image size, HxW (or FxHxW), instead of --seq")
    parser.add_argument("--pool", choices=("passive", "default"), default="passive",
                        help="passive: idle workers sleep (each kernel pays a wake-up); default: the pools spin, "
                             "as portable-pe bench times them")
    args = parser.parse_args()
    print(profile_kernels(args.bundle, batch=args.batch, seq=args.seq, runs=args.runs, threads=args.threads,
                          top=args.top, size=args.size, pool=args.pool))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
