"""Compile every shipped graph for a target and tabulate: ONNX nodes before/after simplify,
compile seconds per stage, and the worst parity error vs PyTorch (onnxruntime and TVM).

    python scripts/graph_report.py [--target llvm] [--out dist/report]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from portable_pe.compile.pipeline import compile_graph
from portable_pe.spec.graphs import GRAPHS
from portable_pe.run.parity import DEFAULT_LENGTHS, check_bundle


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="llvm")
    parser.add_argument("--out", type=Path, default=Path("dist/report"))
    parser.add_argument("graphs", nargs="*", default=list(GRAPHS))
    args = parser.parse_args()
    rows = []
    print("| graph | nodes before -> after simplify | export s | compile s (import+build) | total s "
          "| max abs err ORT | max abs err TVM | parity |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for name in args.graphs:
        bundle = compile_graph(name, target=args.target, out=args.out / f"{name}-{args.target}", log=lambda m: None)
        report = check_bundle(bundle, lengths=DEFAULT_LENGTHS)
        m, t = bundle.manifest, bundle.manifest["timings_s"]
        row = {"graph": name, "nodes_before": m["simplify"]["nodes_before"], "nodes_after": m["simplify"]["nodes_after"],
               "export_s": t["export"], "compile_s": t["import"] + t["build"], "total_s": t["total"],
               "ort_max_abs": report.worst("onnxruntime"), "tvm_max_abs": report.worst("tvm"), "ok": report.ok}
        rows.append(row)
        print(f"| {name} | {row['nodes_before']} -> {row['nodes_after']} | {row['export_s']:.1f} | "
              f"{row['compile_s']:.1f} | {row['total_s']:.1f} | {row['ort_max_abs']:.2e} | "
              f"{row['tvm_max_abs']:.2e} | {'PASS' if row['ok'] else 'FAIL'} |", flush=True)
    (args.out / "graphs.json").write_text(json.dumps(rows, indent=2))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
