"""Every shipped graph, float32 and int8, every engine, from one run: the tables the README
shows, the goals they are judged by, and per-kernel profiles of the slowest int8 cells.

    python scripts/bench_all.py [--graphs rope,alibi] [--pool default|passive] [--out dist/bench-all]

Per graph this is `portable-pe bench GRAPH` (bench.json, bench.md, bench.png in
OUT/GRAPH/); then OUT/tables.md gathers the float32 and int8 tables, a goals table per
cell (int8 TVM / onnxruntime int8, int8 TVM / float32 TVM, int8 cosine against PyTorch
float32 for TVM and onnxruntime, float32 TVM / best of onnxruntime and OpenVINO), and the
kernel profiles (scripts/kernel_profile.py) of the int8 cells furthest from their goal.
Each number is a ratio within one cell of one run; nothing is compared across runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: the issue's goals: (what, limit, better when lower)
GOALS = {"int8 tvm / ort int8": 0.8, "int8 tvm / fp32 tvm": 0.6, "fp32 tvm / best peer": 0.85,
         "fp32 tvm / best f32 peer": 0.85, "int8 cosine": 0.999}


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def goal_rows(result, fp32_floor_ms=None) -> list[dict]:
    """Per cell: the ratios and cosines the goals are about (None where an engine is missing).

    ``fp32_floor_ms(b, t)``: the least time any float32 engine could take for the cell
    (scripts/fp32_floor.py); its ratio to the best peer says whether a float32 goal is
    reachable at all."""
    def ms(engine, b, t):
        cell = result.cell(engine, b, t)
        return cell.median_ms if cell is not None and cell.median_ms else None

    def ratio(a, b):
        return a / b if a and b else None

    rows = []
    for b in result.settings["batches"]:
        for t in result.settings["lengths"]:
            floor = fp32_floor_ms(b, t) if fp32_floor_ms else None
            peers = [v for v in (ms("onnxruntime", b, t), ms("openvino", b, t)) if v]
            # OpenVINO's default computes in bf16 on bf16 CPUs; its f32 run is the equal-precision peer
            f32_peers = [v for v in (ms("onnxruntime", b, t), ms("openvino-f32", b, t)) if v]
            tvm8, ort8 = result.cell("tvm-int8", b, t), result.cell("onnxruntime-int8", b, t)
            rows.append({"graph": result.graph, "B": b, "T": t, "int8_bundle": result.environment.get("int8_bundle"),
                         "int8 tvm / ort int8": ratio(ms("tvm-int8", b, t), ms("onnxruntime-int8", b, t)),
                         "int8 tvm / fp32 tvm": ratio(ms("tvm-int8", b, t), ms("tvm", b, t)),
                         "fp32 tvm / best peer": ratio(ms("tvm", b, t), min(peers) if peers else None),
                         "fp32 tvm / best f32 peer": ratio(ms("tvm", b, t), min(f32_peers) if f32_peers else None),
                         "fp32 floor / best peer": ratio(floor, min(peers) if peers else None),
                         "fp32 floor / best f32 peer": ratio(floor, min(f32_peers) if f32_peers else None),
                         "int8 cosine": tvm8.cosine if tvm8 else None,
                         "ort int8 cosine": ort8.cosine if ort8 else None})
    return rows


def goals_markdown(rows: list[dict]) -> str:
    def mark(key, value):
        if value is None:
            return "n/a"
        met = value >= GOALS[key] if key == "int8 cosine" else value <= GOALS[key]
        return f"{value:.6f}" if key == "int8 cosine" else f"{value:.2f}" + ("" if met else " (miss)")

    def floor(value):
        return "n/a" if value is None else f"{value:.2f}"

    lines = ["| graph | B | T | int8 TVM / onnxruntime int8 (<= 0.8) | int8 TVM / fp32 TVM (<= 0.6) | "
             "fp32 TVM / best of onnxruntime, OpenVINO default (<= 0.85) | float32 floor / same | "
             "fp32 TVM / best of onnxruntime, OpenVINO f32 | float32 floor / same | "
             "int8 cosine TVM (>= 0.999) | int8 cosine onnxruntime | TVM - onnxruntime |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        cos = mark("int8 cosine", r["int8 cosine"])
        both = r["int8 cosine"] is not None and r["ort int8 cosine"] is not None
        if r["int8 cosine"] is not None and (r["int8 cosine"] < GOALS["int8 cosine"] or
                                             (both and r["int8 cosine"] < r["ort int8 cosine"])):
            cos += " (miss)"
        lines.append(f"| {r['graph']} | {r['B']} | {r['T']} | {mark('int8 tvm / ort int8', r['int8 tvm / ort int8'])} | "
                     f"{mark('int8 tvm / fp32 tvm', r['int8 tvm / fp32 tvm'])} | {mark('fp32 tvm / best peer', r['fp32 tvm / best peer'])} | "
                     f"{floor(r.get('fp32 floor / best peer'))} | "
                     f"{mark('fp32 tvm / best f32 peer', r['fp32 tvm / best f32 peer'])} | "
                     f"{floor(r.get('fp32 floor / best f32 peer'))} | "
                     f"{cos} | {'n/a' if r['ort int8 cosine'] is None else format(r['ort int8 cosine'], '.6f')} | "
                     f"{format(r['int8 cosine'] - r['ort int8 cosine'], '+.1e') if both else 'n/a'} |")
    return "\n".join(lines)


FLOOR_NOTE = ("\"float32 floor\" is the cell's matmul FLOPs (PyTorch's FlopCounterMode) at this CPU's measured "
              "float32 FMA peak ({peak:.0f} GFLOP/s on {threads} threads; scripts/fp32_floor.py): no float32 engine "
              "can be faster. Where floor / peer is above 0.85, the 0.85 goal is out of reach of any float32 build.")


def main() -> int:
    from portable_pe.bench.graph import Settings, bench_graph
    from portable_pe.bench.engines import ENGINES, POOLS
    from portable_pe.spec.graphs import GRAPHS
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--graphs", default=",".join(GRAPHS), help="comma-separated (default: every shipped graph)")
    parser.add_argument("--lengths", default="128,512")
    parser.add_argument("--batch", default="1,8")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--pool", choices=POOLS, default=POOLS[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--min-time", type=float, default=2.0)
    parser.add_argument("--profiles", type=int, default=3, help="int8 cells to profile kernel by kernel (0: none)")
    parser.add_argument("--out", type=Path, default=ROOT / "dist" / "bench-all")
    args = parser.parse_args()
    settings = Settings(lengths=tuple(int(v) for v in args.lengths.split(",")),
                        batches=tuple(int(v) for v in args.batch.split(",")), threads=args.threads,
                        repeat=args.repeat, min_time_s=args.min_time, engines=tuple(args.engines.split(",")),
                        pool=args.pool)
    results = [bench_graph(graph, settings=settings, out=args.out / Path(graph).stem, log=lambda m: print(m, flush=True))
               for graph in args.graphs.split(",")]
    # after the benches: their thread pools are made with the bench's settings, and the
    # peak kernel runs with every engine idle
    fp32_floor = _script("fp32_floor")
    peak = fp32_floor.fma_peak_gflops(args.threads)
    print(f"float32 FMA peak: {peak:.0f} GFLOP/s on {args.threads} threads", flush=True)
    rows = []
    for graph, result in zip(args.graphs.split(","), results):
        rows += goal_rows(result, lambda b, t, g=graph: fp32_floor.matmul_gflop(g, b, t) / peak * 1e3)
    parts = [f"## Bench: {len(results)} graph(s), {args.threads} threads, pools {args.pool}, one run", "",
             "Goals per cell (ratios of medians within the cell):", "", goals_markdown(rows), "",
             FLOOR_NOTE.format(peak=peak, threads=args.threads)]
    for result in results:
        parts += ["", result.to_markdown()]
    ranked = sorted((r for r in rows if r["int8 tvm / ort int8"] is not None),
                    key=lambda r: -max(r["int8 tvm / ort int8"] / GOALS["int8 tvm / ort int8"],
                                       (r["int8 tvm / fp32 tvm"] or 0) / GOALS["int8 tvm / fp32 tvm"]))
    if args.profiles and ranked:
        profile = _script("kernel_profile").profile_kernels
        parts += ["", "## Kernel profiles of the int8 cells furthest from their goals"]
        for r in ranked[:args.profiles]:
            bundle = r["int8_bundle"]
            print(f"profiling {bundle} B={r['B']} T={r['T']}", flush=True)
            parts += ["", profile(bundle, batch=r["B"], seq=r["T"], threads=args.threads, runs=10)]
    text = "\n".join(parts) + "\n"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tables.md").write_text(text)
    (args.out / "goals.json").write_text(json.dumps(rows, indent=2))
    print(text)
    print(f"(wrote {args.out / 'tables.md'}, goals.json and one folder per graph)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
