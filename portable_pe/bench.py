"""Benchmark one graph on PyTorch eager, torch.compile, onnxruntime and TVM, side by side.

    engines x (batch, length) cells -> median and IQR per cell -> Markdown, bench.json, bench.png

Every cell feeds the same seeded inputs to every engine, checks each engine's output
against PyTorch eager (the parity tolerance table), then times the engines round-robin,
run by run, so that drift (thermal, other processes) lands on all of them alike.
Thread counts are set equal for all engines. Ratios are latency / onnxruntime's (the peer).
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from .io_names import HIDDEN
from .parity import compare, dim_roles, make_inputs, torch_reference, usable_lengths
from .threads import DEFAULT_THREADS, set_threads
from .tuning_db import database_dir, tuned_points

PEER = "onnxruntime"
NO_TUNING = "n/a (no tuning database)"


@dataclass(frozen=True)
class Settings:
    lengths: tuple[int, ...] = (128, 512)
    batches: tuple[int, ...] = (1, 8)
    threads: int = DEFAULT_THREADS
    repeat: int = 20          # at least this many timed runs per engine and cell ...
    min_time_s: float = 2.0   # ... and at least this long per cell
    max_time_s: float = 60.0  # a slow cell stops here once it has 3 runs
    warmup: int = 3
    seed: int = 0
    engines: tuple[str, ...] = ("torch", "torch.compile", "onnxruntime", "tvm", "tvm-tuned")


# ----------------------------------------------------------------------------- timing
def interleave(runs: dict[str, Callable[[], object]], *, repeat: int, min_time_s: float,
               max_time_s: float, warmup: int = 0) -> dict[str, list[float]]:
    """Seconds per run of each callable, timed round-robin; each round starts one engine
    later so no engine always follows the same neighbour."""
    names = list(runs)
    for _ in range(warmup):
        for name in names:
            runs[name]()
    times = {name: [] for name in names}
    start, rounds = time.perf_counter(), 0
    while names:
        for name in names[rounds % len(names):] + names[:rounds % len(names)]:
            t = time.perf_counter()
            runs[name]()
            times[name].append(time.perf_counter() - t)
        rounds += 1
        elapsed = time.perf_counter() - start
        if (rounds >= repeat and elapsed >= min_time_s) or (rounds >= 3 and elapsed >= max_time_s):
            break
    return times


def summarize(seconds: list[float]) -> dict[str, float]:
    ms = np.asarray(seconds) * 1e3
    q1, med, q3 = np.percentile(ms, [25, 50, 75])
    return {"median_ms": float(med), "iqr_ms": float(q3 - q1), "runs": len(ms)}


# ----------------------------------------------------------------------------- engines
# An engine is built once per bench (`make(ctx)`), then per cell `prepare(inputs)` gives
# (run, fetch): run() is what gets timed, fetch(result) turns its result into numpy.

def torch_engine(ctx: dict, *, compiled: bool):
    import torch
    from .graphs import GraphSpec
    spec = ctx["bundle"].manifest["graph"]["spec"]
    if spec is None:
        raise ValueError("the graph came as an ONNX file: there is no PyTorch model to run")
    model = GraphSpec.from_dict(spec, source="bundle manifest").build().eval()
    if compiled:  # static shapes: inductor's best case, one compile per cell (in warm-up)
        model = torch.compile(model, dynamic=False)

    def prepare(inputs):
        feeds = {k: torch.from_numpy(v) for k, v in inputs.items()}

        def run():
            with torch.inference_mode():
                return model(**feeds)
        return run, lambda out: {HIDDEN: out.numpy()}
    return prepare


def ort_engine(ctx: dict):
    from .simplify import ort_session
    session = ort_session(ctx["bundle"].file("model.onnx"), threads=ctx["threads"], spin=False)
    names = [o.name for o in session.get_outputs()]

    def prepare(inputs):
        return (lambda: session.run(names, inputs)), (lambda out: dict(zip(names, out)))
    return prepare


def tvm_engine(ctx: dict, *, tuned: bool):
    import tvm
    from .runtime import LocalRunner, entry_for
    bundle = ctx["tuned"] if tuned else ctx["bundle"]
    if bundle is None:
        raise LookupError(NO_TUNING)
    runner = LocalRunner(bundle)
    inputs_order = [spec["name"] for spec in bundle.manifest["inputs"]]
    outputs = [o["name"] for o in bundle.manifest["outputs"]]

    def prepare(inputs):
        # the tuned entry for exactly these shapes if the bundle has one (what run() would pick)
        main = runner.vm[entry_for(bundle.manifest, inputs)]
        args = [tvm.runtime.tensor(np.ascontiguousarray(inputs[n]), device=runner.device) for n in inputs_order]

        def fetch(out):
            values = [out] if hasattr(out, "numpy") else list(out)
            return {name: v.numpy() for name, v in zip(outputs, values)}
        return (lambda: main(*args)), fetch
    return prepare


ENGINES = {
    "torch": lambda ctx: torch_engine(ctx, compiled=False),
    "torch.compile": lambda ctx: torch_engine(ctx, compiled=True),
    "onnxruntime": ort_engine,
    "tvm": lambda ctx: tvm_engine(ctx, tuned=False),
    "tvm-tuned": lambda ctx: tvm_engine(ctx, tuned=True),
}


def _why(err: Exception) -> str:
    if isinstance(err, LookupError) and str(err) == NO_TUNING:
        return NO_TUNING
    lines = [ln for ln in str(err).strip().splitlines() if ln.strip()]
    return f"{type(err).__name__}: {lines[-1] if lines else ''}"[:200]


# ----------------------------------------------------------------------------- results
@dataclass
class Cell:
    engine: str
    batch: int
    length: int
    median_ms: float | None = None
    iqr_ms: float | None = None
    runs: int = 0
    ratio_vs_peer: float | None = None
    max_abs: float | None = None
    ok: bool | None = None
    first_run_s: float | None = None  # includes torch.compile's compile
    error: str = ""

    def text(self) -> str:
        if self.error:
            return self.error
        ratio = f" ({self.ratio_vs_peer:.2f}x)" if self.ratio_vs_peer is not None else ""
        return f"{_ms(self.median_ms)} ± {_ms(self.iqr_ms)}{ratio}{'' if self.ok else ' MISMATCH'}"


def _ms(value: float) -> str:
    return f"{value:.3f}" if value < 1 else f"{value:.2f}" if value < 100 else f"{value:.0f}"


@dataclass
class BenchResult:
    graph: str
    settings: dict
    environment: dict
    cells: list[Cell] = field(default_factory=list)

    def to_markdown(self) -> str:
        engines = [e for e in ENGINES if e in self.settings.get("engines", ENGINES)]
        lines = [f"### bench: {self.graph}, {self.settings['threads']} thread(s); median ms ± IQR "
                 f"(latency / {PEER})", "",
                 "| B | T | " + " | ".join(engines) + " |", "|---:|---:|" + "---|" * len(engines)]
        for b in self.settings["batches"]:
            for t in self.settings["lengths"]:
                row = {c.engine: c.text() for c in self.cells if c.batch == b and c.length == t}
                lines.append(f"| {b} | {t} | " + " | ".join(row.get(e, "") for e in engines) + " |")
        return "\n".join(lines)

    def to_json(self) -> str:
        return json.dumps({"graph": self.graph, "settings": self.settings, "environment": self.environment,
                           "cells": [asdict(c) for c in self.cells]}, indent=2)

    def plot(self, path: Path) -> None:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        batches = self.settings["batches"]
        fig, axes = plt.subplots(1, len(batches), figsize=(5 * len(batches), 4), squeeze=False)
        for ax, b in zip(axes[0], batches):
            for engine in ENGINES:
                pts = sorted((c.length, c.median_ms, c.iqr_ms) for c in self.cells
                             if c.engine == engine and c.batch == b and c.median_ms is not None)
                if pts:
                    t, med, iqr = zip(*pts)
                    ax.errorbar(t, med, yerr=np.asarray(iqr) / 2, marker="o", capsize=3, label=engine)
            ax.set(xscale="log", yscale="log", xlabel="sequence length T", ylabel="latency (ms)",
                   title=f"{self.graph}, batch {b}, {self.settings['threads']} thread(s)")
            ax.set_xticks(self.settings["lengths"], [str(t) for t in self.settings["lengths"]])
            ax.minorticks_off()
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)


# ----------------------------------------------------------------------------- the bench
def bench_graph(graph: str, *, settings: Settings = Settings(), tuned: str | Path | None = None,
                bundle: str | Path | None = None, out: str | Path | None = None,
                log: Callable[[str], None] = print) -> BenchResult:
    """Time every engine in ENGINES on `graph` at each (batch, length) of `settings`.

    `bundle`: an untuned llvm bundle of the graph to reuse (default: compile one into `out`,
    ignoring any tuning database).
    `tuned`: a tuned bundle folder for the "tvm-tuned" column (default: compile one when the
    graph has a tuning database under targets/tuning/llvm/, else the column reads n/a).
    `out`: where bench.json, bench.md and bench.png go (nothing written when None).
    """
    from .artifact import load_bundle
    from .compile import compile_graph
    out = Path(out) if out else None
    threads = set_threads(settings.threads)
    if bundle is None:
        dest = (out or Path("dist")) / f"{Path(graph).stem}-llvm"
        log(f"compiling {graph} (untuned: default llvm schedules, no tuning database) -> {dest}")
        bundle = compile_graph(graph, target="llvm", out=dest, tuning=False, log=lambda m: None)
    else:
        bundle = load_bundle(bundle)
    if tuned is None and tuned_points(database_dir("llvm", bundle.name)):
        tuned = (out or Path("dist")) / f"{Path(graph).stem}-llvm-tuned"
        log(f"compiling {graph} with its tuning database -> {tuned}")
        compile_graph(graph, target="llvm", out=tuned, log=lambda m: None)
    tuned_bundle = load_bundle(tuned) if tuned else None
    if tuned_bundle is not None and tuned_bundle.name != bundle.name:
        raise ValueError(f"--tuned bundle {tuned} is for graph {tuned_bundle.name!r}, not {bundle.name!r}")
    manifest = bundle.manifest
    bad = sorted(set(settings.lengths) - set(usable_lengths(manifest, settings.lengths)))
    if bad:
        raise ValueError(f"lengths {bad} are outside what {bundle.name} accepts ({manifest['dims']})")
    max_batch = manifest.get("dims", {}).get("batch", {}).get("max")
    if max_batch and max(settings.batches) > max_batch:
        raise ValueError(f"batch {max(settings.batches)} is above the graph's max_batch {max_batch}")

    env = {"machine": platform.machine(), "processor": platform.processor() or platform.machine(),
           "cpu_count": os.cpu_count(), "threads": threads, "untuned_bundle": str(bundle.path),
           "tuned_bundle": str(tuned_bundle.path) if tuned_bundle else None,
           "tuning_database": tuned_bundle.manifest.get("tuning", {}).get("database") if tuned_bundle else None,
           "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
           "versions": manifest["versions"]}
    result = BenchResult(bundle.name, {**asdict(settings), "lengths": list(settings.lengths),
                                       "batches": list(settings.batches)}, env)
    log(f"bench {bundle.name}: B={list(settings.batches)} T={list(settings.lengths)}, threads {threads}, "
        f">= {settings.repeat} runs and >= {settings.min_time_s:g} s per cell (cap {settings.max_time_s:g} s), "
        f"{settings.warmup} warm-up, seed {settings.seed}; tuned: {tuned_bundle.path if tuned_bundle else NO_TUNING}; "
        f"load average {env['load_average']}")

    ctx = {"bundle": bundle, "tuned": tuned_bundle, "threads": settings.threads}
    engines, broken = {}, {}
    unknown = sorted(set(settings.engines) - set(ENGINES))
    if unknown:
        raise ValueError(f"unknown engine(s) {unknown}; valid: {', '.join(ENGINES)}")
    for name, make in ENGINES.items():
        if name not in settings.engines:
            continue
        try:
            engines[name] = make(ctx)
        except Exception as err:  # a missing engine is a table cell, not a crash
            broken[name] = _why(err)
    reference = torch_reference(manifest["graph"]["spec"]) if manifest["graph"]["spec"] else None
    total = len(settings.batches) * len(settings.lengths)
    for i, (b, t) in enumerate(((b, t) for b in settings.batches for t in settings.lengths), 1):
        cells = _bench_cell(engines, broken, reference, manifest, settings, b, t)
        result.cells += cells
        peer = next((c for c in cells if c.engine == PEER), None)
        log(f"[{i}/{total}] B={b} T={t}: " + "; ".join(f"{c.engine} {c.text()}" for c in cells)
            + ("" if peer and peer.median_ms else " (no onnxruntime time: no ratios)"))
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench.json").write_text(result.to_json())
        (out / "bench.md").write_text(result.to_markdown() + "\n")
        result.plot(out / "bench.png")
    return result


def _bench_cell(engines, broken, reference, manifest, settings, b, t) -> list[Cell]:
    inputs = make_inputs(manifest["inputs"], length=t, batch=b, seed=settings.seed, dim_roles=dim_roles(manifest))
    expected = reference(inputs) if reference else None
    cells = {name: Cell(name, b, t, error=why) for name, why in broken.items()}
    runs = {}
    for name, prepare in engines.items():
        cell = cells[name] = Cell(name, b, t)
        try:
            run, fetch = prepare(inputs)
            start = time.perf_counter()
            got = fetch(run())
            cell.first_run_s = round(time.perf_counter() - start, 3)
        except Exception as err:
            cell.error = _why(err)
            continue
        if expected is not None:
            rows = compare(expected, got, name=name, length=t, tolerance_overrides=manifest.get("tolerance"))
            cell.max_abs, cell.ok = max(r.max_abs for r in rows), all(r.ok for r in rows)
        runs[name] = run
    times = interleave(runs, repeat=settings.repeat, min_time_s=settings.min_time_s,
                       max_time_s=settings.max_time_s, warmup=settings.warmup)
    for name, seconds in times.items():
        for key, value in summarize(seconds).items():
            setattr(cells[name], key, value)
    peer = cells.get(PEER)
    for cell in cells.values():
        if cell.median_ms is not None and peer is not None and peer.median_ms:
            cell.ratio_vs_peer = cell.median_ms / peer.median_ms
    return [cells[name] for name in ENGINES if name in cells]
