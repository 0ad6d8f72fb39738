"""`portable-pe guide --vision`: what each 2D position encoding costs on this CPU, per image size.

    the shipped image graphs (graphs/vision/: a ViT per 2D encoding, the windowed Swin) and
    a no-position ViT of the same model (graphs/baselines/vit_none.toml)
      -> one llvm build each (cpu.build_bundles); every size runs from it
      -> per (batch, size): the graphs timed round-robin on one seeded image
         (bench.interleave); at batch 1 the position work from a per-kernel profile matched
         to the baseline's by structural hash (cpu.position_work), as in the text guide
      -> each build's parity against PyTorch at every size (run.parity.check_bundle)
      -> the article's future direction (CLAIM) given a verdict by RULE from these numbers
      -> guide_vision.json, guide_vision.md (rendered from the JSON only)

With `npu-ethos-u` among the targets, the same graphs also go through Vela at the NPU sizes
(vision_npu.py): placement, Vela's estimate and the position cost on Ethos-U85 and U55.

The video graphs (graphs/vision/video_mrope.toml: 3D M-RoPE over frames, rows and columns)
go the same way on llvm against their own no-position twin (graphs/baselines/video_none.toml)
at the video sizes (frames x H x W), and on Ethos-U at their own NPU sizes (Vela has no
CONV_3D: a video stem fixed to one size becomes a Conv2d over its frames). Not in this
section: RKNN (no time estimate; `scripts/npu_rknn_table.py --vision` is its table).
The Swin graph's attention is windowed, not only its encoding: its latency is shown, but no
position work (a profile against the global-attention baseline would charge the windows to
the encoding).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

BASELINE = "vit_none"
VIDEO_BASELINE = "video_none"
#: frames x H x W: 196 patches per 2-frame tubelet slice, 2, 4 and 8 slices
DEFAULT_VIDEO_SIZES = ("4x224x224", "8x224x224", "16x224x224")
#: whole 7-patch windows for the Swin graph (multiples of 112 pixels), as well as whole patches
DEFAULT_SIZES = ("224x224", "448x448", "672x672")
WINDOWED = "window_rel_bias_2d"
CLAIM = ("Multi-dimensional position encodings (the article's first future direction) can be "
         "first-class on CPUs: one build per encoding for every image or video size, at little cost over no positions")
#: the cost the claim calls little: latency within this fraction of the no-position twin's
LITTLE = 0.10
RULE = (f"holds when every 2D and 3D encoding's one build runs and matches PyTorch at every size and its "
        f"latency is within +{LITTLE:.0%} of its no-position twin's (the ViT's, the video ViT's) at every size "
        f"and batch; partly holds when all run and match but some cost more; does not hold when one does not "
        f"build, run or match")


def resolve(names: list[str] | None, *, video: bool = False) -> tuple[dict[str, str], str | None]:
    """(name -> source, the baseline's name) for the image graphs among `names` (default:
    every shipped image graph), or with `video` for the video graphs (default: every
    shipped one): the no-position graph first (vit_none / video_none unless one is given),
    then the others. ({}, None) when `names` holds none of that kind; a graph that is not a
    vision graph is refused."""
    from ..spec.graphs import VISION_GRAPHS, load_graph
    given = {}
    for source in names or list(VISION_GRAPHS):
        spec = load_graph(source)
        if spec.vision is None:
            raise ValueError(f"guide --vision times image and video graphs; {source!r} is not a vision graph")
        if spec.vision.video != video:
            continue
        if spec.name in given:
            raise ValueError(f"graph name {spec.name!r} is given twice; the guide needs one graph per name")
        given[spec.name] = (source, spec)
    if not given:
        return {}, None
    default = VIDEO_BASELINE if video else BASELINE
    baseline = next((n for n, (_, spec) in given.items() if spec.encoding == "none"), default)
    sources = {baseline: given[baseline][0] if baseline in given else default}
    sources.update({n: source for n, (source, _) in given.items() if n != baseline})
    return sources, baseline


def measure(sources: dict[str, str], *, baseline: str, unprofiled: set[str], sizes: tuple[str, ...],
            batches: tuple[int, ...], threads: int, repeat: int, work_dir: Path, log: Callable[[str], None]) -> dict:
    """Latency, position work (not for the graphs in `unprofiled`) and parity per graph and
    size (the module docstring)."""
    from ..bench.graph import interleave, summarize
    from ..run.local import InputError
    from ..run.parity import check_bundle, make_inputs, parse_sizes, pixel_roles
    from ..spec.io_names import dim_roles
    from ..threads import set_threads
    from .cpu import Runner, build_bundles, kernel_hashes, position_work, profile
    set_threads(threads)
    built = build_bundles(sources, work_dir=work_dir, log=log)
    bundles = {n: b["bundle"] for n, b in built.items()}
    runners = {n: Runner(b) for n, b in bundles.items()}
    hashes = {n: kernel_hashes(s) for n, s in sources.items() if n not in unprofiled}
    kernel_names = {h: k for n in hashes for k, h in hashes[n].items()}
    manifest = bundles[baseline].manifest
    latency, profiles, parity = [], [], []
    for text in sizes:
        size = parse_sizes(text, pixel_roles(manifest))
        for batch in batches:
            image = make_inputs(manifest["inputs"], sizes=size, batch=batch, dim_roles=dim_roles(manifest))
            args, refused = {}, {}
            for name, runner in runners.items():
                try:
                    args[name] = runner.vm_args(image)
                except InputError as err:
                    refused[name] = str(err)
            log(f"  llvm: B={batch} {text}: timing {len(args)} graph(s) round-robin"
                f"{' (refused: ' + ', '.join(refused) + ')' if refused else ''}")
            times = interleave({n: (lambda r=runners[n], a=args[n]: r.vm["main"](*a)) for n in args},
                               repeat=repeat, min_time_s=1.0, max_time_s=30.0, warmup=1)
            for name in runners:
                cell = {"graph": name, "batch": batch, "size": text}
                latency.append({**cell, "ok": False, "error": refused[name]} if name in refused
                               else {**cell, "ok": True, **summarize(times[name])})
            if batch == 1 and baseline in args:
                base = profile(runners[baseline].profile_vm, args[baseline], hashes[baseline], runs=3)
                for name in args:
                    if name in hashes:
                        kernels = base if name == baseline else profile(runners[name].profile_vm, args[name], hashes[name], runs=3)
                        profiles.append({"graph": name, "size": text, **position_work(kernels, base, kernel_names)})
    for name, bundle in bundles.items():
        takes = [parse_sizes(t, pixel_roles(manifest)) for t in sizes
                 if not any(r["graph"] == name and r["size"] == t and not r["ok"] for r in latency)]
        report = check_bundle(bundle, sizes=takes, candidates=("tvm",)) if takes else None
        parity.append({"graph": name, "ok": bool(report and report.ok),
                       "sizes": {str(r.length): {"max_abs": r.max_abs, "cosine": r.cosine, "ok": r.ok}
                                 for r in (report.rows if report else [])}})
        log(f"  parity {name}: {'ok' if report and report.ok else 'FAIL'} at {', '.join(map(str, (r.length for r in report.rows))) if report else 'no size'}")
    return {"builds": {n: {"build_s": b["build_s"]} for n, b in built.items()},
            "latency": latency, "profile": profiles, "parity": parity}


def _groups(result: dict) -> list[tuple[list[dict], str, dict, list[str]]]:
    """(graphs, baseline, llvm measurements, sizes) of the image part and the video part."""
    groups = []
    if "llvm" in result:
        groups.append((result["graphs"], result["baseline"], result["llvm"], result["settings"]["sizes"]))
    video = result.get("video")
    if video and "llvm" in video:
        groups.append((video["graphs"], video["baseline"], video["llvm"], video["sizes"]))
    return groups


def verdict(result: dict) -> dict:
    """The claim's row: what was measured and the verdict by RULE."""
    measured, failed, costly, encoders = {}, [], [], 0
    for graphs, base, llvm, sizes in _groups(result):
        rows = {(r["graph"], r["batch"], r["size"]): r for r in llvm["latency"]}
        parity = {p["graph"]: p for p in llvm["parity"]}
        for g in graphs:
            if g["name"] == base or g["encoding"] == WINDOWED:
                continue
            encoders += 1
            over = []
            for size in sizes:
                for batch in result["settings"]["batches"]:
                    mine, none = rows.get((g["name"], batch, size)), rows.get((base, batch, size))
                    if not (mine and mine["ok"] and none and none["ok"]):
                        failed.append(f"{g['name']} at {size} B={batch}")
                        continue
                    over.append(mine["median_ms"] / none["median_ms"] - 1)
            if not parity.get(g["name"], {}).get("ok"):
                failed.append(f"{g['name']}: parity")
            if over:
                worst = max(over)
                measured[g["name"]] = f"{100 * min(over):+.0f}% to {100 * worst:+.0f}% vs no positions"
                if worst > LITTLE:
                    costly.append(g["name"])
    if not encoders:
        return {"claim": CLAIM, "measured": measured, "verdict": "not measured", "rule": RULE}
    outcome = "does not hold" if failed else "partly holds" if costly else "holds"
    if failed:
        measured["failed"] = "; ".join(failed)
    return {"claim": CLAIM, "measured": measured, "verdict": outcome, "rule": RULE}


#: what --targets may name with --vision
VISION_TARGETS = ("llvm", "npu-ethos-u")


def run_vision_guide(*, graphs: list[str] | None = None, sizes: tuple[str, ...] = DEFAULT_SIZES,
                     batches: tuple[int, ...] = (1,), out: Path = Path("dist/guide"), threads: int = 2,
                     repeat: int = 5, targets: tuple[str, ...] = ("llvm",), npu_sizes: tuple[str, ...] | None = None,
                     video_sizes: tuple[str, ...] = DEFAULT_VIDEO_SIZES, video_npu_sizes: tuple[str, ...] | None = None,
                     command: str = "portable-pe guide --vision", log: Callable[[str], None] = print) -> dict:
    """Measure on `targets` (VISION_TARGETS); write out/guide_vision.json and
    out/guide_vision.md; return the result."""
    import shutil
    import tvm
    from .. import __version__
    from . import _atomic
    from ..host_cpu import cpu_summary
    from ..spec.graphs import load_graph
    from . import vision_npu
    unknown = [t for t in targets if t not in VISION_TARGETS]
    if unknown or not targets:
        raise ValueError(f"guide --vision --targets {','.join(targets)}: expected a comma-separated subset of "
                         f"{', '.join(VISION_TARGETS)} (RKNN's simulator gives no time: its vision table is "
                         f"scripts/npu_rknn_table.py --vision)")
    npu_sizes = tuple(npu_sizes or vision_npu.NPU_SIZES)
    video_npu_sizes = tuple(video_npu_sizes or vision_npu.VIDEO_NPU_SIZES)
    sources, baseline = resolve(graphs)
    video_sources, video_baseline = resolve(graphs, video=True)
    specs = {n: load_graph(s) for n, s in sources.items()}
    video_specs = {n: load_graph(s) for n, s in video_sources.items()}
    start = time.perf_counter()
    work = out / "work-vision"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    log(f"guide --vision: {len(sources)} image graphs ({', '.join(sources)}), sizes {', '.join(sizes)}; "
        f"{len(video_sources)} video graphs ({', '.join(video_sources)}), sizes {', '.join(video_sizes)}; "
        f"batches {', '.join(map(str, batches))} -> {out}")
    result = {"command": command, "baseline": baseline,
              "graphs": [{"name": n, "encoding": s.encoding, "tokens_before_patches": s.vision.prefix,
                          "description": s.description} for n, s in specs.items()],
              **({"video": {"baseline": video_baseline, "sizes": list(video_sizes),
                            **({"npu_sizes": list(video_npu_sizes)} if "npu-ethos-u" in targets else {}),
                            "graphs": [{"name": n, "encoding": s.encoding, "tokens_before_patches": s.vision.prefix,
                                        "description": s.description} for n, s in video_specs.items()]}}
                 if video_sources else {}),
              "settings": {"sizes": list(sizes), "batches": list(batches), "threads": threads, "repeat": repeat,
                           "targets": list(targets), "npu_sizes": list(npu_sizes), "machine": cpu_summary()},
              "versions": {"portable_pe": __version__, "tvm": tvm.__version__}}
    windowed = {n for n, s in specs.items() if s.encoding == WINDOWED}
    try:
        if "llvm" in targets and sources:
            result["llvm"] = measure(sources, baseline=baseline, sizes=sizes, batches=batches, threads=threads,
                                     unprofiled=windowed, repeat=repeat, work_dir=work, log=log)
        if "llvm" in targets and video_sources:
            result["video"]["llvm"] = measure(video_sources, baseline=video_baseline, sizes=video_sizes,
                                              batches=batches, threads=threads, unprofiled=set(), repeat=repeat,
                                              work_dir=work / "video", log=log)
        if "npu-ethos-u" in targets and sources:
            result["npu_ethos_u"] = vision_npu.measure(specs, baseline=baseline, unpriced=windowed, sizes=npu_sizes,
                                                       work_dir=work / "ethos-u", log=log)
        if "npu-ethos-u" in targets and video_sources:
            result["video"]["npu_ethos_u"] = vision_npu.measure(video_specs, baseline=video_baseline, unpriced=set(),
                                                                sizes=video_npu_sizes, work_dir=work / "ethos-u-video",
                                                                log=log)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["seconds"] = time.perf_counter() - start
    if _groups(result):
        result["claim"] = verdict(result)
    if "npu_ethos_u" in result or "npu_ethos_u" in result.get("video", {}):
        result["npu_claim"] = vision_npu.verdict(result, little=LITTLE, windowed=WINDOWED)
    result = json.loads(json.dumps(result))  # what guide_vision.json holds (lists, not tuples)
    out.mkdir(parents=True, exist_ok=True)
    _atomic(out / "guide_vision.json", json.dumps(result, indent=1))
    _atomic(out / "guide_vision.md", render(result))
    log(f"guide --vision: wrote {out / 'guide_vision.md'} ({result['seconds']:.0f} s)")
    return result


def render(result: dict) -> str:
    """guide_vision.md from the result alone."""
    from . import vision_npu
    from .report import claims_table
    s = result["settings"]
    lines = ["# portable-pe guide --vision", "",
             f"`{result['command']}` on {s['machine']}, {s['threads']} threads; portable-pe "
             f"{result['versions']['portable_pe']}, TVM {result['versions']['tvm']}. Every graph: d=256, 4 heads, "
             "4 layers, 16-pixel patches (video: 2-frame x 16 x 16 tubelets).", ""]
    if "claim" in result:
        c = result["claim"]
        lines += ["One llvm build per graph, run at every size.", "", "## The claim", ""]
        lines += claims_table([c]) + [f"Rule: {c['rule']}.", ""]
    if "llvm" in result:
        lines += _render_llvm(result["graphs"], result["baseline"], result["llvm"], s["sizes"], s["batches"],
                              twin="the no-position ViT's", title="")
    video = result.get("video")
    if video and "llvm" in video:
        lines += _render_llvm(video["graphs"], video["baseline"], video["llvm"], video["sizes"], s["batches"],
                              twin="the no-position video ViT's", title="video (frames x H x W), ")
    if "npu_claim" in result:
        lines += vision_npu.render(result)
    return "\n".join(lines)


def _render_llvm(graphs: list[dict], base: str, llvm: dict, sizes: list[str], batches: list[int], *,
                 twin: str, title: str) -> list[str]:
    from .report import _table, fmt_ms, fmt_pct
    rows = {(r["graph"], r["batch"], r["size"]): r for r in llvm["latency"]}
    lines = []
    for batch in batches:
        lines += [f"## llvm latency, {title}B={batch}", "",
                  f"Median ms per run, graphs timed round-robin on the same input; in brackets: / {twin} - 1. "
                  "Tokens: patches + CLS (+ registers).", ""]
        table = []
        for g in graphs:
            cells = []
            for size in sizes:
                r, none = rows.get((g["name"], batch, size)), rows.get((base, batch, size))
                if r is None or not r["ok"]:
                    cells.append(f"refused: {r['error']}" if r else "")
                    continue
                ratio = r["median_ms"] / none["median_ms"] - 1 if none and none["ok"] and g["name"] != base else None
                cells.append(fmt_ms(r["median_ms"]) + (f" ({fmt_pct(ratio)})" if ratio is not None else ""))
            table.append([f"{g['name']} ({g['encoding']})", *cells])
        lines += _table(["graph", *sizes], table)
    lines += [f"## llvm position work, {title}B=1", "",
              f"The kernels each graph adds or changes against {twin[:-2]} (matched by structural "
              "hash), minus those they replace, from a per-kernel profile: ms per run (share of the run)."
              + (" The windowed Swin is not profiled: its attention differs from the baseline's, not only its "
                 "encoding." if any(g["encoding"] == WINDOWED for g in graphs) else ""), ""]
    prof = {(p["graph"], p["size"]): p for p in llvm["profile"]}
    table = []
    for g in graphs:
        if g["name"] == base or g["encoding"] == WINDOWED:
            continue
        cells = []
        for size in sizes:
            p = prof.get((g["name"], size))
            cells.append(f"{fmt_ms(p['position_ms'])} ({fmt_pct(p['position_share'])})" if p else "n/a")
        table.append([g["name"], *cells])
    lines += _table(["graph", *sizes], table)
    lines += [f"## Parity against PyTorch (llvm, {title}every size from one build)", ""]
    table = [[p["graph"], "ok" if p["ok"] else "FAIL",
              ", ".join(f"{k}: {v['max_abs']:.1e}" for k, v in p["sizes"].items()) or "no size"]
             for p in llvm["parity"]]
    lines += _table(["graph", "verdict", "max abs per size"], table, "|---|---|---|")
    return lines
