"""Compile every shipped graph for the npu target under every NPU profile and tabulate:
disallowed nodes before/after rewriting, NPU coverage, accuracy vs fp32 PyTorch (through
onnxruntime and the TVM build), and model size fp32 vs int8.

    python scripts/npu_report.py [--seq-len 128] [--out dist/npu-report] [GRAPH ...]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from portable_pe.compile.pipeline import compile_graph
from portable_pe.spec.graphs import GRAPHS
from portable_pe.npu.profiles import PROFILES_DIR


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--out", type=Path, default=Path("dist/npu-report"))
    parser.add_argument("graphs", nargs="*", default=list(GRAPHS))
    args = parser.parse_args()
    profiles = sorted(p.stem for p in PROFILES_DIR.glob("*.toml"))
    print("| graph | profile | disallowed before -> after | NPU nodes | NPU MACs | ORT cosine / max abs "
          "| TVM cosine / max abs | MB fp32 -> int8 |")
    print("|---|---|---|---|---:|---|---|---|")
    rows = []
    for graph in args.graphs:
        for profile in profiles:
            try:
                bundle = compile_graph(graph, target="npu", out=args.out / f"{graph}-{profile}", log=lambda m: None,
                                       target_options={"profile": profile, "seq_len": args.seq_len})
            except Exception as err:  # a profile that blocks the graph is a row, with its reasons
                rows.append({"graph": graph, "profile": profile, "error": str(err)})
                print(f"| {graph} | {profile} | blocked: {str(err)[:300]} | | | | | |", flush=True)
                continue
            npu = bundle.manifest["npu"]
            ort, tvm = npu["accuracy"]["onnxruntime_int8"], npu["accuracy"].get("tvm_int8", {})
            cov, size = npu["coverage"], npu["size_bytes"]
            rows.append({"graph": graph, "profile": profile, **npu})
            print(f"| {graph} | {profile} | {npu['disallowed_before_rewrite']} -> {npu['disallowed_after_rewrite']} | "
                  f"{cov['nodes_npu']}/{cov['nodes_total']} | {cov['mac_coverage']:.0%} | "
                  f"{ort['cosine']:.5f} / {ort['max_abs']:.3f} | {tvm.get('cosine', float('nan')):.5f} / "
                  f"{tvm.get('max_abs', float('nan')):.3f} | {size['fp32'] / 1e6:.1f} -> {size['int8'] / 1e6:.1f} |",
                  flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "npu.json").write_text(json.dumps(rows, indent=2, default=str))
    return 0 if all("error" not in r for r in rows if r["profile"] == "generic_int8") else 1


if __name__ == "__main__":
    raise SystemExit(main())
