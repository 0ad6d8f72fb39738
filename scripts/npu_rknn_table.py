"""The RKNN table: every shipped graph x T x dtype through RKNN-Toolkit2, in one run.

    python scripts/npu_rknn_table.py                       # graphs/*.toml x T 64,128,512 x int8,fp16
    python scripts/npu_rknn_table.py --graphs rope --lengths 128 --dtypes int8
    python scripts/npu_rknn_table.py --foreign             # also two Hugging Face encoders
    python scripts/npu_rknn_table.py --compare-qdq         # also: our QDQ graph vs float + calibration
    python scripts/npu_rknn_table.py --vision              # graphs/vision/*.toml at --image-size 224x224 x int8,fp16
    python scripts/npu_rknn_table.py --vision --hf-vision vit,dinov2,dinov3,swin   # also transformers' own vision encoders

A vision graph's cell is built at one static image size (--image-size HxW; a video graph
takes its temporal patch as the frame count, one patch deep, so 224x224 is 196 patches for
every graph); its T column is that size and the token count. A Hugging Face vision encoder
(--hf-vision: portable_pe.hf.vision's tiny configs, exported by TorchScript with H and W
dynamic, as a user's file) is pinned to that size with --shape pixel_values=1x3xHxW.

Each cell runs the compile pipeline's own stages (compile.pipeline.prepare through the
vendor stage: load, export, simplify, legalize for `--target npu --profile rknpu2`,
reference, vendor), so the numbers are the ones `portable-pe compile` records; only the
TVM host build, which the vendor does not use, is left out. A cell's numbers are
npu/rknn_stage.py's summary(), as the guide's RKNN column's are. Needs `bash scripts/npu_toolchain.sh rknn`.
Writes a Markdown table and the raw rows as JSON (--out, default dist/npu-rknn-table).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

COLUMNS = ("graph", "T", "dtype", "NPU ops", "CPU ops", "cosine", "max abs", ".rknn MB", "build s", "goal")
GOAL_COSINE = {"fp16": 0.999, "int8": 0.99}


def cell(source: str, *, seq_len: int | list[int], dtype: str, soc: str, shapes: dict | None = None,
         vendor_input: str = "float") -> dict:
    """One vendor build through the pipeline's stages; the row's numbers and the CPU ops.
    A vision graph's `seq_len` is its image size ([H, W], video [F, H, W])."""
    from portable_pe.compile.pipeline import prepare
    from portable_pe.npu.rknn_stage import summary
    if isinstance(seq_len, list):  # an image: a foreign file's size comes from its --shape
        size = {} if shapes else {"image_size": seq_len}
    else:
        size = {"seq_len": seq_len}
    options = {"profile": "rknpu2", **size, "npu_dtype": dtype, "soc": soc,
               "vendor_build": "skip" if vendor_input == "qdq" else "require"}
    t = time.perf_counter()
    st = prepare(source, target="npu", target_options=options, shapes=shapes, through="vendor", host_build=False,
                 log=lambda m: None)
    if vendor_input == "qdq":
        return _qdq_cell(st, seq_len=seq_len, soc=soc)
    s = summary(st.report["vendor"])
    if isinstance(seq_len, list):  # the image size and the tokens it makes
        seq_len = f"{'x'.join(map(str, seq_len))} ({st.io['outputs'][0]['dims'][1]} tokens)"
    return {"graph": st.name, "T": seq_len, "dtype": dtype, "soc": soc, "input": "float + calibration",
            "npu_ops": s["ops_npu"], "cpu_ops": s["ops_cpu"],
            "cpu": [f"{o['op']} {o['name']} {o['input_shape']} ({o['rw_kb']:g} KB through CPU memory): {o['why'][0]}"
                    for o in s["cpu_ops"]], "npu_cycles": s["npu_cycles"],
            "cosine": s["cosine"], "max_abs": s["max_abs"], "rknn_bytes": s["rknn_bytes"],
            "build_s": s["build_s"], "cell_s": round(time.perf_counter() - t, 1), "disagreements": s["disagreements"],
            "onnxruntime_vendor_graph": st.report["npu"]["accuracy"].get("onnxruntime_vendor_graph")}


def _qdq_cell(st, *, seq_len: int, soc: str) -> dict:
    """Our QDQ int8 graph (the bundle's model.onnx) handed to RKNN as a pre-quantized model
    (do_quantization=False; RKNN's default optimization level 3 segfaults on it, 2 builds)."""
    from portable_pe.backends.npu import accuracy
    from portable_pe.bundle.reference import find_case
    from portable_pe.npu import rknn
    from portable_pe.npu.toolchain import VendorError
    n = seq_len
    case = find_case(st.reference, n)
    row = {"graph": st.name, "T": n, "dtype": "int8", "soc": soc, "input": "our QDQ graph"}
    for level in (3, 2):
        try:
            built = rknn.build(rknn.vendor_graph(st.model), soc=soc, dtype="fp16", calibration=[],
                               simulate=[case.inputs], config={"optimization_level": level}, log=lambda m: None)
        except VendorError as err:
            row[f"level {level}"] = str(err).splitlines()[0]
            continue
        (name, got), = built.outputs[0].items()
        acc = accuracy(case.outputs[name], got)
        placed = built.report["placement"]
        return {**row, "optimization_level": level, "npu_ops": placed["ops_npu"], "cpu_ops": placed["ops_cpu"],
                "cosine": acc["cosine"], "max_abs": acc["max_abs"], "rknn_bytes": built.report["rknn_bytes"],
                "build_s": built.report["timings_s"]["build_s"]}
    return row


def foreign_models(out: Path) -> dict[str, tuple[Path, dict]]:
    """Two Hugging Face encoders from local configs, exported by torch.onnx (scripts/hf_encoders.py)."""
    from hf_encoders import export_encoders
    return export_encoders(out)


def vision_jobs(graphs: str | None, image_size: str, dtypes: list[str]) -> list[tuple]:
    """(graph, {}, image size, dtype) for each vision graph: a video graph one temporal patch deep."""
    from portable_pe.spec.graphs import VISION_GRAPHS, load_graph
    jobs = []
    for g in (graphs.split(",") if graphs else list(VISION_GRAPHS)):
        vision = load_graph(g).vision
        size = ([vision.temporal_patch] if vision.video else []) + [int(n) for n in image_size.split("x")]
        jobs += [(g, {}, size, d) for d in dtypes]
    return jobs


def hf_vision_jobs(archs: str, image_size: str, dtypes: list[str], out: Path) -> list[tuple]:
    """(exported file, its --shape, image size, dtype) for each transformers vision encoder."""
    from portable_pe.hf.vision import export_vision
    h, w = (int(n) for n in image_size.split("x"))
    out.mkdir(parents=True, exist_ok=True)
    jobs = []
    for arch in archs.split(","):
        _, path = export_vision(arch, out / f"hf_{arch}.onnx", exporter="torchscript")
        jobs += [(str(path), {"pixel_values": [1, 3, h, w]}, [h, w], d) for d in dtypes]
    return jobs


def markdown(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        if "cosine" not in r:
            lines.append(f"| {r['graph']} | {r['T']} | {r['dtype']} | failed: {r.get('error', r)} |")
            continue
        goal = r["cpu_ops"] == 0 and r["cosine"] >= GOAL_COSINE[r["dtype"]]
        lines.append(f"| {r['graph']} | {r['T']} | {r['dtype']} | {r['npu_ops']} | {r['cpu_ops']} | "
                     f"{r['cosine']:.6f} | {r['max_abs']:.3g} | {r['rknn_bytes'] / 1e6:.2f} | {r['build_s']:.1f} | "
                     f"{'met' if goal else 'MISSED'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    from portable_pe.spec.graphs import GRAPHS
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--graphs", default=",".join(GRAPHS))
    p.add_argument("--lengths", default="64,128,512")
    p.add_argument("--dtypes", default="int8,fp16")
    p.add_argument("--soc", default="rk3588")
    p.add_argument("--foreign", action="store_true", help="also BERT and RoFormer from transformers (local configs)")
    p.add_argument("--compare-qdq", action="store_true", help="also hand RKNN our QDQ graph (int8, T=128, every graph)")
    p.add_argument("--vision", action="store_true", help="graphs/vision/*.toml (or --graphs) at --image-size")
    p.add_argument("--hf-vision", default="", help="also these transformers vision encoders (e.g. vit,dinov2,dinov3,swin), "
                   "pinned to --image-size")
    p.add_argument("--image-size", default="224x224", help="--vision: the static image size HxW (default 224x224)")
    p.add_argument("--out", type=Path, default=ROOT / "dist" / "npu-rknn-table")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.vision:
        jobs = vision_jobs(args.graphs if "--graphs" in (argv or sys.argv) else None, args.image_size,
                           args.dtypes.split(","))
    else:
        jobs = [(g, {}, int(n), d) for g in args.graphs.split(",") if g for n in args.lengths.split(",")
                for d in args.dtypes.split(",")]
    if args.foreign:
        for name, (path, shapes) in foreign_models(args.out / "foreign").items():
            jobs += [(str(path), shapes, int(next(iter(shapes.values()))[1]), d) for d in args.dtypes.split(",")]
    if args.hf_vision:
        jobs += hf_vision_jobs(args.hf_vision, args.image_size, args.dtypes.split(","), args.out / "hf-vision")
    rows = []
    for source, shapes, n, dtype in jobs:
        print(f"[{len(rows) + 1}/{len(jobs)}] {Path(source).stem} {'T=' + str(n) if isinstance(n, int) else n} "
              f"{dtype} ...", flush=True)
        try:
            rows.append(cell(source, seq_len=n, dtype=dtype, soc=args.soc, shapes=shapes))
        except Exception as err:  # a failed cell is a row that says so, not a lost run
            rows.append({"graph": Path(source).stem, "T": n, "dtype": dtype, "error": str(err).splitlines()[0]})
        print("   ", json.dumps({k: v for k, v in rows[-1].items() if k not in ("cpu",)}), flush=True)
    qdq = []
    if args.compare_qdq:
        for g in args.graphs.split(","):
            for dtype_input in ("float", "qdq"):
                print(f"[qdq] {g} T=128 int8 {dtype_input} ...", flush=True)
                qdq.append(cell(g, seq_len=128, dtype="int8", soc=args.soc, vendor_input=dtype_input))
                print("   ", json.dumps({k: v for k, v in qdq[-1].items() if k not in ("cpu",)}), flush=True)
    text = f"RKNN-Toolkit2 on {args.soc}: simulator vs PyTorch\n\n" + markdown(rows)
    cpu = [f"- {r['graph']} T={r['T']} {r['dtype']}: {c}" for r in rows for c in r.get("cpu", [])]
    text += "\n\nOps on the CPU:\n" + ("\n".join(cpu) if cpu else "none")
    disagree = [f"- {r['graph']} T={r['T']} {r['dtype']}: {d}" for r in rows for d in r.get("disagreements", [])]
    text += "\n\nProfile vs vendor disagreements:\n" + ("\n".join(disagree) if disagree else "none")
    if qdq:
        text += "\n\nQDQ graph vs float graph + our calibration (int8, T=128):\n\n" + "\n".join(
            f"- {r['graph']} {r['input']}: " + ", ".join(f"{k} {v}" for k, v in r.items()
                                                         if k not in ("graph", "input", "cpu", "disagreements"))
            for r in qdq)
    (args.out / "table.md").write_text(text + "\n")
    (args.out / "table.json").write_text(json.dumps({"rows": rows, "qdq": qdq}, indent=2))
    print(text)
    print(f"(wrote {args.out / 'table.md'} and table.json)")
    return 0 if all("cosine" in r for r in rows) else 1


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    raise SystemExit(main())
