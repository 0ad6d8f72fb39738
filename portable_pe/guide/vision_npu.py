"""`portable-pe guide --vision --targets ...,npu-ethos-u`: the vision graphs on Arm's Ethos-U.

    each image graph (and the no-position ViT) at each NPU size, each video graph (and the
    no-position video ViT) at each video NPU size
      -> Vela's own build (npu/vela.py compile_jobs: the `--target npu --profile ethos-u85`
         path: pixels in, patch positions folded for the size, full-int8 TFLite, Vela for
         each accelerator)
      -> per (graph, size, accelerator): ops on the NPU and the CPU (Vela's placement and
         reasons), Vela's time estimate, the int8 model's cosine against PyTorch fp32
      -> position cost = the graph's estimate - its no-position twin's, same size and
         accelerator (the windowed Swin gets none: its attention differs, not only its
         encoding, as in the llvm part)

The NPU sizes are their own (NPU_SIZES): every Vela build is static, one per size, and the
llvm part's largest default (672x672, 1765 tokens) is a build of many minutes per graph on
Vela for a size edge NPUs do not run. RKNN is not a column here: its simulator gives no
time, and `scripts/npu_rknn_table.py --vision` is its placement and accuracy table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

#: whole 7-patch Swin windows at 16-pixel patches: 49, 196 and 441 patches
NPU_SIZES = ("112x112", "224x224", "336x336")
#: frames x H x W for the video graphs: one and two 2-frame tubelet slices of 196 patches
#: (a video stem fixed to one size is a Conv2d over its frames: Vela has no CONV_3D)
VIDEO_NPU_SIZES = ("2x224x224", "4x224x224")
ACCELERATORS = ("ethos-u85", "ethos-u55")


def measure(specs: dict, *, baseline: str, unpriced: set[str], sizes: tuple[str, ...], work_dir: Path,
            log: Callable[[str], None], accelerators: tuple[str, ...] = ACCELERATORS) -> dict:
    """{"rows": one per (graph, size, accelerator), "ran": False and "error" when Vela's
    toolchain is missing}. A size a graph cannot take (not whole windows) is a row with
    the refusal, as `compile --target npu --image-size` words it."""
    from ..npu.image_size import image_size
    from ..npu.toolchain import missing_message, toolchain_python
    from ..npu.vela import TOOLCHAIN, VelaJob, compile_jobs, summarize
    if toolchain_python(TOOLCHAIN) is None:
        return {"ran": False, "error": missing_message(TOOLCHAIN), "rows": []}
    jobs, refused = [], {}
    for size in sizes:
        hw = [int(n) for n in size.split("x")]
        for name, spec in specs.items():
            try:
                jobs.append((name, size, VelaJob.for_image(spec, image_size(spec, hw))))
            except ValueError as err:
                refused[(name, size)] = str(err)
    log(f"ethos-u: {len(jobs)} Vela build(s) ({', '.join(accelerators)}), sizes {', '.join(sizes)}")
    entries = compile_jobs([job for _, _, job in jobs], accelerators=list(accelerators), work_dir=work_dir, log=log)
    rows = []
    for (name, size, job), entry in zip(jobs, entries):
        accuracy = entry.get("accuracy") or {}
        for accelerator in accelerators:
            s = summarize(entry, accelerator)
            rows.append({"graph": name, "size": size, "tokens": job.seq_len, "accelerator": accelerator,
                         "ok": s["ok"], "error": s.get("error"), "npu_ops": s.get("npu_ops"),
                         "cpu_ops": s.get("cpu_ops"), "estimate_ms": s.get("inference_ms"),
                         "cpu_fallbacks": s.get("cpu_fallbacks", []), "cosine": accuracy.get("cosine"),
                         "max_abs": accuracy.get("max_abs")})
    for (name, size), why in refused.items():
        rows += [{"graph": name, "size": size, "accelerator": a, "ok": False, "error": why} for a in accelerators]
    base = {(r["size"], r["accelerator"]): r for r in rows if r["graph"] == baseline and r["ok"]}
    for r in rows:
        other = base.get((r["size"], r["accelerator"]))
        r["position_ms"] = (r["estimate_ms"] - other["estimate_ms"]
                            if r["ok"] and other and r["graph"] != baseline and r["graph"] not in unpriced else None)
    return {"ran": True, "error": None, "rows": rows}


CLAIM = ("Multi-dimensional position encodings can be first-class on edge NPUs too: each built by the "
         "vendor's compiler with every op on the NPU at every size, accurate in int8, at little cost over no positions")
#: int8 cosine against PyTorch fp32 that counts as accurate (the NPU goal of issue 23)
MIN_COSINE = 0.99


def _parts(result: dict):
    """(Vela's part, its graphs, its no-position baseline, its sizes, its heading): the image
    graphs', then the video graphs'."""
    video = result.get("video") or {}
    image_sizes = result.get("settings", {}).get("npu_sizes", [])
    for holder, sizes, title in ((result, image_sizes, ""), (video, video.get("npu_sizes", []), "video (frames x H x W), ")):
        if "npu_ethos_u" in holder:
            yield holder["npu_ethos_u"], holder.get("graphs", []), holder.get("baseline"), sizes, title


def verdict(result: dict, *, little: float, windowed: str) -> dict:
    """The NPU claim's row: holds when every 2D and 3D encoding builds at every size and
    accelerator with 0 CPU ops, cosine >= MIN_COSINE and an estimate within +little of
    its no-position twin's (the ViT's, the video ViT's); partly holds when all build on
    the NPU alone and accurate but some cost more; does not hold otherwise."""
    rule = (f"holds when every 2D and 3D encoding builds at every NPU size with 0 ops on the CPU, int8 cosine >= "
            f"{MIN_COSINE} and Vela's estimate within +{little:.0%} of its no-position twin's (the ViT's, the video "
            f"ViT's); partly holds when all build on the NPU alone and accurate but some cost more; does not hold "
            f"otherwise")
    measured, failed, costly = {}, set(), False
    for part, graphs, baseline, _, _ in _parts(result):
        if not part["ran"]:
            continue
        encoders = [g["name"] for g in graphs if g["name"] != baseline and g["encoding"] != windowed]
        rows = [r for r in part["rows"] if r["graph"] in encoders]
        failed |= {f"{r['graph']} {r['size']} {r['accelerator']}: " + (
            "not built" if not r["ok"] else f"{r['cpu_ops']} op(s) on the CPU" if r["cpu_ops"]
            else f"cosine {r['cosine']:.4f}") for r in rows
            if not r["ok"] or r["cpu_ops"] or (r["cosine"] or 0) < MIN_COSINE}
        base = {(r["size"], r["accelerator"]): r["estimate_ms"] for r in part["rows"] if r["graph"] == baseline and r["ok"]}
        for name in encoders:
            over = [r["estimate_ms"] / base[(r["size"], r["accelerator"])] - 1 for r in rows
                    if r["graph"] == name and r["ok"] and (r["size"], r["accelerator"]) in base]
            if over:
                measured[name] = f"{100 * min(over):+.0f}% to {100 * max(over):+.0f}% vs no positions (Vela's estimate)"
                costly |= max(over) > little
    if not measured and not failed:
        return {"claim": CLAIM, "measured": {}, "verdict": "not measured", "rule": rule}
    if failed:
        measured["missed"] = "; ".join(sorted(failed))
    outcome = "does not hold" if failed else "partly holds" if costly else "holds"
    return {"claim": CLAIM, "measured": measured, "verdict": outcome, "rule": rule}


def render(result: dict) -> list[str]:
    """guide_vision.md's Ethos-U part, from the result alone."""
    from .report import claims_table
    parts = list(_parts(result))
    lines = ["## Ethos-U (Vela's build and estimate)", ""]
    if not any(part["ran"] for part, *_ in parts):
        return lines + [f"Not run: {parts[0][0]['error']}", ""]
    c = result["npu_claim"]
    lines += claims_table([c]) + [f"Rule: {c['rule']}.", ""]
    lines += ["Vela's estimate in ms per image or clip (not a measurement: no board here); in brackets: the "
              "position cost, the estimate minus the no-position twin's at the same size; then ops on the NPU / "
              "on the CPU and the int8 model's cosine against PyTorch fp32 (LiteRT, at build time).", ""]
    for part, graphs, _, sizes, title in parts:
        lines += _tables(part, graphs, sizes, title)
    cpu = sorted({f"{r['graph']} {r['size']} {r['accelerator']}: {c['op']}: {c['reason']}"
                  for part, *_ in parts for r in part["rows"] if r["ok"] for c in r["cpu_fallbacks"]})
    lines += ["Ops Vela left to the CPU (its words): " + ("none" if not cpu else ""), "", *[f"- {c}" for c in cpu], ""]
    return lines


def _tables(part: dict, graphs: list[dict], sizes: list[str], title: str) -> list[str]:
    """One table per accelerator: graphs x sizes."""
    from .report import _table, fmt_ms
    if not part["ran"]:
        return [f"### {title}not run: {part['error']}", ""]
    lines = []
    cells = {(r["graph"], r["size"], r["accelerator"]): r for r in part["rows"]}
    for accelerator in sorted({r["accelerator"] for r in part["rows"]}):
        table = []
        for g in graphs:
            row = [f"{g['name']} ({g['encoding']})"]
            for size in sizes:
                r = cells.get((g["name"], size, accelerator))
                if r is None:
                    row.append("")
                elif not r["ok"]:
                    row.append("refused: " + " ".join(str(r["error"]).split())[:160])
                else:
                    cost = f" ({r['position_ms']:+.2f})" if r["position_ms"] is not None else ""
                    row.append(f"{fmt_ms(r['estimate_ms'])}{cost}; {r['npu_ops']}/{r['cpu_ops']} ops; "
                               f"{r['cosine']:.4f}")
            table.append(row)
        lines += [f"### {title}{accelerator}", ""]
        lines += _table(["graph", *sizes], table)
    return lines

