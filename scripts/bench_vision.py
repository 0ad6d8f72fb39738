"""A vision graph's speed beside onnxruntime and OpenVINO on the same ONNX file, one run.

One llvm bundle of a shipped vision graph (default vit_rope_2d: d=256, 4 layers, 2D RoPE,
a CLS and 4 registers), run at each image size beside onnxruntime (its default spinning
pool), OpenVINO at its defaults (bf16 compute on CPUs with avx512_bf16) and OpenVINO asked
for f32 (the equal-precision peer), all at the same thread count, timed in alternating
blocks (bench.graph.time_in_blocks). Each engine's output is compared with PyTorch's.

    python scripts/bench_vision.py [--graph vit_rope_2d] [--sizes 224x224,384x384] [--batches 1,8] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ENGINES = ("tvm", "onnxruntime", "openvino", "openvino-f32")


def main(argv=None) -> int:
    from portable_pe.bench.engines import ENGINES as MAKERS
    from portable_pe.bench.graph import time_in_blocks
    from portable_pe.compile.pipeline import compile_graph
    from portable_pe.run.parity import make_inputs, parse_sizes, pixel_roles, torch_reference
    from portable_pe.spec.io_names import dim_roles
    from portable_pe.threads import set_threads
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graph", default="vit_rope_2d")
    parser.add_argument("--sizes", default="224x224,384x384")
    parser.add_argument("--batches", default="1", help="batch sizes, comma-separated (the graph's max_batch bounds them)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--min-time", type=float, default=6.0, help="seconds of timed runs per size (all engines)")
    args = parser.parse_args(argv)
    set_threads(args.threads, passive=False)  # each pool at its default; blocks keep them apart
    with tempfile.TemporaryDirectory() as tmp:
        bundle = compile_graph(args.graph, target="llvm", out=Path(tmp) / "b", log=lambda m: None)
        ctx = {"bundle": bundle, "threads": args.threads, "pool": "default"}
        makers = {name: MAKERS[name](ctx) for name in ENGINES}
        reference = torch_reference(bundle.manifest["graph"]["spec"])
        print(f"{args.graph} on llvm, {args.threads} threads; OpenVINO's default computes in "
              f"{ctx.get('compute_precision', {}).get('openvino', '?')}")
        print("| size | batch | engine | median ms | / tvm | max abs vs PyTorch |\n|---|---:|---|---:|---:|---:|")
        for text, batch in ((t, int(b)) for t in args.sizes.split(",") for b in args.batches.split(",")):
            sizes = parse_sizes(text, pixel_roles(bundle.manifest))
            inputs = make_inputs(bundle.manifest["inputs"], sizes=sizes, batch=batch, dim_roles=dim_roles(bundle.manifest))
            want = reference(inputs)["hidden"]
            prepared = {name: make(inputs) for name, make in makers.items()}
            errors = {name: float(np.abs(next(iter(fetch(run()).values())) - want).max())
                      for name, (run, fetch) in prepared.items()}
            times = time_in_blocks({name: run for name, (run, _) in prepared.items()}, repeat=10,
                                   min_time_s=args.min_time, max_time_s=4 * args.min_time, warmup=2)
            medians = {name: statistics.median(t) * 1e3 for name, t in times.items()}
            for name in ENGINES:
                print(f"| {text} | {batch} | {name} | {medians[name]:.2f} | {medians[name] / medians['tvm']:.2f} | "
                      f"{errors[name]:.1e} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
