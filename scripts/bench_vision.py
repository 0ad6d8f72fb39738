"""A vision graph's speed beside onnxruntime and OpenVINO on the same ONNX file, one run.

One llvm bundle of a shipped vision graph (default vit_rope_2d: d=256, 4 layers, 2D RoPE,
a CLS and 4 registers), run at each image size beside onnxruntime (its default spinning
pool), OpenVINO at its defaults (bf16 compute on CPUs with avx512_bf16) and OpenVINO asked
for f32 (the equal-precision peer), all at the same thread count, timed in alternating
blocks (bench.graph.time_in_blocks). Each engine's output is compared with PyTorch's.

    python scripts/bench_vision.py [--graph vit_rope_2d] [--sizes 224x224,384x384] [--batches 1,8] [--threads 2]
    python scripts/bench_vision.py --hf dinov3 --sizes 224x224 --batches 1,8

--hf NAME times transformers' own class instead, at its full default size (random weights,
seed 0; DINOv3: ViT-S/16, d=384, 12 layers, 6 heads, and 4 register tokens as the released
ViT-S has), exported by TorchScript with the batch and the image size dynamic and compiled
with `compile MODEL.onnx` like any foreign file; its outputs are compared with the PyTorch
model's.
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
#: --hf: the class defaults updated by these (the released model's sizes where they differ)
HF_OVERRIDES = {"dinov3": {"num_register_tokens": 4}}


def main(argv=None) -> int:
    from portable_pe.bench.engines import ENGINES as MAKERS
    from portable_pe.bench.graph import time_in_blocks
    from portable_pe.compile.pipeline import compile_graph
    from portable_pe.run.parity import make_inputs, parse_sizes, pixel_roles, torch_reference
    from portable_pe.spec.io_names import dim_roles
    from portable_pe.threads import set_threads
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graph", default="vit_rope_2d")
    parser.add_argument("--hf", choices=sorted(HF_OVERRIDES), help="transformers' own model instead of --graph")
    parser.add_argument("--sizes", default="224x224,384x384")
    parser.add_argument("--batches", default="1", help="batch sizes, comma-separated (the graph's max_batch bounds them)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--min-time", type=float, default=6.0, help="seconds of timed runs per size (all engines)")
    parser.add_argument("--pin", action="store_true",
                        help="with --hf: one build per (size, batch), pinned with --shape, instead of one dynamic build")
    args = parser.parse_args(argv)
    if args.pin and not args.hf:
        parser.error("--pin is for --hf (a shipped graph's bundle is built once, dynamic)")
    set_threads(args.threads, passive=False)  # each pool at its default; blocks keep them apart
    with tempfile.TemporaryDirectory() as tmp:
        if args.hf:
            source, reference = _hf_export(args.hf, Path(tmp))
        else:
            source, reference = args.graph, None

        def build(shape=None):
            """(bundle, engines): one llvm build, dynamic or pinned to `shape`, and every
            engine on it (the peers on its model.onnx)."""
            out = Path(tmp) / ("b" if shape is None else "b-" + "x".join(map(str, shape)))
            bundle = compile_graph(source, target="llvm", out=out, log=lambda m: None,
                                   shapes={"pixel_values": shape} if shape else None)
            ctx = {"bundle": bundle, "threads": args.threads, "pool": "default"}
            return bundle, ctx, {name: MAKERS[name](ctx) for name in ENGINES}
        dynamic = None if args.pin else build()
        if reference is None:
            reference = torch_reference(dynamic[0].manifest["graph"]["spec"])
        print(f"{args.hf or args.graph} on llvm ({'one build per size, pinned' if args.pin else 'one dynamic build'}), "
              f"{args.threads} threads")
        print("| size | batch | engine | median ms | / tvm | max abs vs PyTorch |\n|---|---:|---|---:|---:|---:|")
        for text, batch in ((t, int(b)) for t in args.sizes.split(",") for b in args.batches.split(",")):
            if args.pin:
                bundle, ctx, makers = build([batch, 3, *map(int, text.split("x"))])
                inputs = make_inputs(bundle.manifest["inputs"])  # its one static shape
            else:
                bundle, ctx, makers = dynamic
                sizes = parse_sizes(text, pixel_roles(bundle.manifest))
                inputs = make_inputs(bundle.manifest["inputs"], sizes=sizes, batch=batch,
                                     dim_roles=dim_roles(bundle.manifest))
            want = next(iter(reference(inputs).values()))
            prepared = {name: make(inputs) for name, make in makers.items()}
            errors = {name: float(np.abs(next(iter(fetch(run()).values())) - want).max())
                      for name, (run, fetch) in prepared.items()}
            times = time_in_blocks({name: run for name, (run, _) in prepared.items()}, repeat=10,
                                   min_time_s=args.min_time, max_time_s=4 * args.min_time, warmup=2)
            medians = {name: statistics.median(t) * 1e3 for name, t in times.items()}
            for name in ENGINES:
                print(f"| {text} | {batch} | {name} | {medians[name]:.2f} | {medians[name] / medians['tvm']:.2f} | "
                      f"{errors[name]:.1e} |", flush=True)
        print(f"OpenVINO's default computes in {ctx.get('compute_precision', {}).get('openvino', '?')}")
    return 0


def _hf_export(name: str, folder: Path):
    """(the exported file, a reference {output: array} from the PyTorch model)."""
    import torch
    from portable_pe.hf.vision import export_vision
    module, path = export_vision(name, folder / f"{name}.onnx", overrides=HF_OVERRIDES[name], batch=True)

    def reference(inputs: dict) -> dict:
        with torch.no_grad():
            return {"last_hidden_state": module(torch.from_numpy(inputs["pixel_values"])).numpy()}
    return str(path), reference


if __name__ == "__main__":
    sys.exit(main())
