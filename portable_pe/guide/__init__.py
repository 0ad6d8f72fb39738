"""`portable-pe guide`: what each position encoding costs, measured on each target and length.

    graphs (same model, only the encoding differs, plus the no-position baseline)
      -> llvm   cpu.py      built for this CPU, timed round-robin per (batch, length); run
                            memory; position work from a per-kernel profile
                tables.py   fp32 against int8 position tables
                lengths.py  beyond the export example and past the table: run or refuse
      -> npu-*  npu.py      each vendor's compiler (npu/vendors.py): placement, accuracy, time
                            estimate; position work = estimate - the baseline's estimate
      -> claims.py          the article's selection guide, one row per claim, with a verdict
      -> report.py          guide.json (every number), guide.md and PNG plots from it

Measured, never asserted: the run writes what it saw; tests check that the report is the
run's (its numbers come from guide.json), not what the numbers are.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Callable

from ..host_cpu import cpu_summary
from ..npu.vendors import VENDORS

DEFAULT_LENGTHS = (128, 512, 2048, 4096)
DEFAULT_BATCHES = (1, 8)
BASELINE = "none"
#: the guide's targets: the host CPU, and one per NPU vendor (npu/vendors.py VENDORS)
GUIDE_TARGETS: dict[str, str] = {"llvm": "this CPU through TVM (measured)",
                                 **{f"npu-{k}": v.description for k, v in VENDORS.items()}}


def resolve_graphs(names: list[str] | None) -> tuple[dict[str, str], dict, str]:
    """(name -> source, name -> GraphSpec, baseline name): the shipped graphs by default;
    all of one model; the no-position graph first (added when none is given)."""
    from ..spec.graphs import GRAPHS, load_graph
    sources = list(names) if names else [*GRAPHS]
    specs = {}
    for source in sources:
        spec = load_graph(source)
        if spec.name in specs:
            raise ValueError(f"graph name {spec.name!r} is given twice; the guide needs one graph per name")
        specs[spec.name] = (source, spec)
    if not any(s.encoding == BASELINE for _, s in specs.values()):
        specs = {BASELINE: (BASELINE, load_graph(BASELINE)), **specs}
    models = {s.name: s.model for _, s in specs.values()}
    if len(set(models.values())) > 1:
        raise ValueError("the guide compares encodings of one model, but the graphs differ in [model]: "
                         + "; ".join(f"{k}: {v}" for k, v in models.items())
                         + f" (give a no-position graph of the same model: encoding name = \"{BASELINE}\")")
    baseline = next(n for n, (_, s) in specs.items() if s.encoding == BASELINE)
    order = [baseline, *(n for n in specs if n != baseline)]
    return {n: specs[n][0] for n in order}, {n: specs[n][1] for n in order}, baseline


def run_guide(*, graphs: list[str] | None = None, targets: tuple[str, ...] = tuple(GUIDE_TARGETS),
              lengths: tuple[int, ...] = DEFAULT_LENGTHS, batches: tuple[int, ...] = DEFAULT_BATCHES,
              out: Path = Path("dist/guide"), threads: int = 2, repeat: int = 5, keep_work: bool = False,
              command: str = "portable-pe guide", log: Callable[[str], None] = print) -> dict:
    """Measure, write out/guide.json, out/guide.md and out/guide-*.png; return the result."""
    import torch
    import tvm
    from .. import __version__
    from . import claims
    unknown = [t for t in targets if t not in GUIDE_TARGETS]
    if unknown:
        raise ValueError(f"unknown guide target(s) {unknown}; valid: {', '.join(GUIDE_TARGETS)}")
    sources, specs, baseline = resolve_graphs(graphs)
    start = time.perf_counter()
    work = out / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    first = next(iter(specs.values())).model
    result = {"command": command, "baseline": baseline,
              "reference_graph": next((n for n, s in specs.items() if s.encoding == "sinusoidal"), None),
              "model": f"{first.n_layers} layers, d_model {first.d_model}, {first.n_heads} heads, d_ff {first.d_ff}",
              "graphs": [{"name": n, "encoding": s.encoding, "max_length": s.max_length,
                          "example_length": s.example_length, "description": s.description} for n, s in specs.items()],
              "settings": {"targets": list(targets), "lengths": list(lengths), "batches": list(batches),
                           "threads": threads, "repeat": repeat, "machine": cpu_summary()},
              "versions": {"portable_pe": __version__, "torch": torch.__version__.split("+")[0], "tvm": tvm.__version__},
              "timings_s": {}, "npu": {}}
    log(f"guide: {len(specs)} encoders ({', '.join(specs)}), targets {', '.join(targets)}, "
        f"lengths {', '.join(map(str, lengths))}, batches {', '.join(map(str, batches))} -> {out}")
    try:
        _measure(result, sources, specs, baseline, targets=targets, work=work, log=log)
    finally:
        if not keep_work:  # bundles and vendor builds: gigabytes at T=4096
            shutil.rmtree(work, ignore_errors=True)
    result["timings_s"]["total"] = time.perf_counter() - start
    result["claims"] = claims.evaluate(result)
    write_report(result, out)
    log(f"guide: wrote {out / 'guide.md'}, {out / 'guide.json'} ({result['timings_s']['total']:.0f} s)")
    return result


def _measure(result: dict, sources: dict, specs: dict, baseline: str, *, targets, work: Path,
             log: Callable[[str], None]) -> None:
    from . import cpu, lengths as length_checks, tables
    from ..npu.report import NpuJob
    from .npu import run_vendor
    s = result["settings"]
    lengths, batches, threads = tuple(s["lengths"]), tuple(s["batches"]), s["threads"]
    if "llvm" in targets:
        settings = cpu.CpuSettings(batches=batches, lengths=lengths, threads=threads, repeat=s["repeat"])
        s.update(profile_batch=settings.profile_batch, profile_runs=settings.profile_runs)
        t = time.perf_counter()
        result["llvm"] = cpu.measure(sources, baseline=baseline, settings=settings, work_dir=work / "llvm", log=log)
        result["timings_s"]["llvm"] = time.perf_counter() - t
        t = time.perf_counter()
        result["lengths"] = length_checks.check(specs, result["llvm"]["bundles"])
        result["tables"] = {"materialized": tables.materialized(specs, lengths),
                            "builds": tables.compare_builds(specs, sources, result["llvm"]["bundles"],
                                                            lengths=tuple(n for n in lengths if n <= 512) or lengths[:1],
                                                            threads=threads, work_dir=work / "llvm", log=log)}
        result["timings_s"]["lengths_and_tables"] = time.perf_counter() - t
    for target in targets:
        if target == "llvm":
            continue
        vendor = target[len("npu-"):]
        t = time.perf_counter()
        jobs = [NpuJob(spec, n) for spec in specs.values() for n in lengths]
        result["npu"][vendor] = run_vendor(vendor, jobs, work_dir=work / vendor, log=log)
        _add_position_work(result["npu"][vendor], baseline)
        result["timings_s"][target] = time.perf_counter() - t
        for versions in _vendor_versions(work / vendor):
            result["versions"].update(versions)


def _add_position_work(vendor_result: dict, baseline: str) -> None:
    """Each report's position work: its time estimate minus the baseline's, same column and length."""
    for reports in vendor_result["reports"].values():
        base = {r["seq_len"]: r["time_ms"] for r in reports if r["graph"] == baseline and r["ok"]}
        for r in reports:
            known = r["ok"] and r["time_ms"] is not None and base.get(r["seq_len"]) is not None
            r["position_ms"] = r["time_ms"] - base[r["seq_len"]] if known else None
            r["position_share"] = r["position_ms"] / r["time_ms"] if known and r["time_ms"] else None


def _vendor_versions(folder: Path):
    """The versions a vendor's workers report (npu/toolchain.py's result.json files)."""
    for result in sorted(folder.rglob("result.json")):
        yield dict(json.loads(result.read_text()).get("versions", {}))


def write_report(result: dict, out: Path) -> None:
    """guide.json, then the plots and guide.md rendered from it; each file written atomically."""
    from . import report
    out.mkdir(parents=True, exist_ok=True)
    _atomic(out / "guide.json", json.dumps(result, indent=1, default=str))
    plots = report.plot(result, out)
    _atomic(out / "guide.md", report.render(result, plots=plots))


def render_from(json_path: Path, out: Path | None = None) -> Path:
    """Render guide.md (and plots) again from a guide.json; the claims' verdicts are derived
    again from its numbers (the rules may have changed since the run), and saved with it."""
    from . import claims
    result = json.loads(Path(json_path).read_text())
    result["claims"] = claims.evaluate(result)
    write_report(result, out or Path(json_path).parent)
    return (out or Path(json_path).parent) / "guide.md"


def _atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
