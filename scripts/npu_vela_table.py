"""The Vela table: shipped vision graphs through Arm's Vela for Ethos-U85 and U55, in one run.

    python scripts/npu_vela_table.py                                # graphs/vision/*.toml at 224x224
    python scripts/npu_vela_table.py --graphs vit_rope_2d --image-size 112x112 --accelerators ethos-u85

Each graph is exported at one static image size with its patch positions folded, converted
to full-int8 TFLite (litert-torch + ai-edge-quantizer, calibrated), run on LiteRT against
PyTorch fp32, and compiled by Vela for each accelerator (npu/vela.py's compile_jobs: one
worker run, the jobs shared between two workers). A video graph is one temporal patch deep.
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


def main(argv=None) -> int:
    from portable_pe.npu.vela import VelaJob, compile_jobs, summarize
    from portable_pe.spec.graphs import VISION_GRAPHS, load_graph
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--graphs", default=",".join(VISION_GRAPHS))
    p.add_argument("--image-size", default="224x224", help="the static image size HxW")
    p.add_argument("--accelerators", default="ethos-u85,ethos-u55")
    p.add_argument("--out", type=Path, default=ROOT / "dist" / "npu-vela-table")
    args = p.parse_args(argv)
    hw = [int(n) for n in args.image_size.split("x")]
    accelerators = args.accelerators.split(",")
    jobs = []
    for name in args.graphs.split(","):
        spec = load_graph(name)
        jobs.append(VelaJob.for_image(spec, ([spec.vision.temporal_patch] if spec.vision.video else []) + hw))
    start = time.perf_counter()
    entries = compile_jobs(jobs, accelerators=accelerators, work_dir=args.out / "work")
    rows = []
    for job, entry in zip(jobs, entries):
        acc = entry.get("accuracy") or {}
        for accelerator in accelerators:
            s = summarize(entry, accelerator)
            rows.append({"graph": job.spec.name, "image": "x".join(map(str, job.image)), "tokens": job.seq_len,
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
