"""The Vela table: shipped vision graphs through Arm's Vela for Ethos-U85 and U55, in one run.

    python scripts/npu_vela_table.py                                # graphs/vision/*.toml at 224x224
    python scripts/npu_vela_table.py --graphs vit_rope_2d --image-size 112x112 --accelerators ethos-u85
    python scripts/npu_vela_table.py --hf-vision vit,dinov2,dinov3,swin   # also transformers' own encoders

Each graph is exported at one static image size with its patch positions folded, converted
to full-int8 TFLite (litert-torch + ai-edge-quantizer, calibrated), run on LiteRT against
PyTorch fp32, and compiled by Vela for each accelerator (npu/vela.py's compile_jobs: a
worker process per model, two at a time). A video graph is one temporal patch deep.
--hf-vision adds transformers' own vision classes (portable_pe.hf.vision's tiny configs,
random weights, the learned table resized to the grid): Vela's path starts from the
PyTorch model (ONNX -> TFLite would need TensorFlow), so these go in as the PyTorch
models the RKNN table's .onnx files are exported from, not as those files.
Vela's own report gives the placement (ops on the NPU and on the CPU, with Vela's reasons)
and its performance estimate. Needs `bash scripts/npu_toolchain.sh ethos-u`.
Writes OUT/vela-vision.md and .json (default dist/npu-vela-table).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GOAL_COSINE = 0.99  # the int8 goal of the NPU table (issue 23)


def hf_vision_job(arch: str, hw: list[int]):
    """transformers' `arch` (tiny config) as a Vela job at H x W: pixel_values -> last_hidden_state."""
    import torch
    from portable_pe.hf.vision import last_hidden_state_model
    from portable_pe.npu.vela import ModelJob
    shape = (1, 3, *hw)
    with torch.no_grad():
        tokens = last_hidden_state_model(arch)(torch.zeros(shape)).shape[1]
    return ModelJob(f"hf_{arch}", lambda: last_hidden_state_model(arch), shape, int(tokens))


def main(argv=None) -> int:
    from portable_pe.npu.vela import VelaJob, compile_jobs, summarize
    from portable_pe.spec.graphs import VISION_GRAPHS, load_graph
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--graphs", default=",".join(VISION_GRAPHS))
    p.add_argument("--image-size", default="224x224", help="the static image size HxW")
    p.add_argument("--accelerators", default="ethos-u85,ethos-u55")
    p.add_argument("--hf-vision", default="", help="also these transformers vision encoders "
                   "(e.g. vit,dinov2,dinov3,swin) at --image-size")
    p.add_argument("--out", type=Path, default=ROOT / "dist" / "npu-vela-table")
    args = p.parse_args(argv)
    hw = [int(n) for n in args.image_size.split("x")]
    accelerators = args.accelerators.split(",")
    jobs = []
    for name in (n for n in args.graphs.split(",") if n):
        spec = load_graph(name)
        jobs.append(VelaJob.for_image(spec, ([spec.vision.temporal_patch] if spec.vision.video else []) + hw))
    jobs += [hf_vision_job(arch, hw) for arch in args.hf_vision.split(",") if arch]
    start = time.perf_counter()
    entries = compile_jobs(jobs, accelerators=accelerators, work_dir=args.out / "work")
    rows = []
    for job, entry in zip(jobs, entries):
        acc = entry.get("accuracy") or {}
        for accelerator in accelerators:
            s = summarize(entry, accelerator)
            rows.append({"graph": job.name, "image": "x".join(map(str, job.input_shape[2:])), "tokens": job.seq_len,
                         "accelerator": accelerator, "int8_cosine": acc.get("cosine"), "int8_max_abs": acc.get("max_abs"),
                         **s})
    lines = [f"Vela on {', '.join(accelerators)}, {args.image_size} ({time.perf_counter() - start:.0f} s): "
             "int8 TFLite on LiteRT vs PyTorch fp32, Vela's placement and estimate", "",
             "| graph | image (tokens) | accelerator | NPU ops | CPU ops | estimate ms | NPU cycles | int8 cosine (max abs) | goal |",
             "|---|---|---|---:|---:|---:|---:|---|---|"]
    for r in rows:
        if not r.get("ok"):
            lines.append(f"| {r['graph']} | {r['image']} ({r['tokens']}) | {r['accelerator']} | failed: "
                         f"{' '.join(str(r.get('error')).split())[:300]} | | | | | MISSED |")
            continue
        goal = r["cpu_ops"] == 0 and (r["int8_cosine"] or 0) >= GOAL_COSINE
        lines.append(f"| {r['graph']} | {r['image']} ({r['tokens']}) | {r['accelerator']} | {r['npu_ops']} | "
                     f"{r['cpu_ops']} | {r['inference_ms']:.2f} | {r['cycles_npu']:,} | {r['int8_cosine']:.5f} "
                     f"({r['int8_max_abs']:.3g}) | {'met' if goal else 'MISSED'} |")
    cpu = [f"- {r['graph']} {r['accelerator']}: {c['op']} {c['name']}: {c['reason']}"
           for r in rows for c in r.get("cpu_fallbacks") or []]
    text = "\n".join(lines) + "\n\nOps on the CPU (Vela's words):\n" + ("\n".join(cpu) if cpu else "none") + "\n"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "vela-vision.md").write_text(text)
    (args.out / "vela-vision.json").write_text(json.dumps(rows, indent=1, default=str))
    print(text)
    return 0 if all(r.get("ok") for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
