"""Benchmark one graph on PyTorch eager, torch.compile, onnxruntime, OpenVINO and TVM, in
float32 and int8, side by side.

    engines x (batch, length) cells -> median and IQR per cell -> Markdown, bench.json, bench.png

Every cell feeds the same seeded inputs to every engine and checks each engine's output
against PyTorch eager (the parity tolerance table of the bundle it runs; int8 engines by
the int8 row, with their cosine recorded). Then the engines are timed in alternating
blocks: each engine runs alone for a block of runs, then the next, the order rotating
each round, so drift lands on all of them alike and an engine's spinning thread pool
(onnxruntime's default) never steals the cores of the engine timed next, as it does when
engines alternate call by call. Thread counts are equal for all engines; pools are at
their defaults, or all passive with ``pool="passive"`` (bench_engines.py).
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from .engines import ENGINES, NO_INT8, NO_TUNED_ENTRY, NO_TUNING, PEERS, POOLS, precision_of
from .report import BenchResult, Cell
from ..host_cpu import cpu_summary
from ..run.parity import TOLERANCES, compare, dim_roles, make_inputs, torch_reference, usable_lengths
from ..threads import DEFAULT_THREADS, set_threads
from ..tune.database import database_dir, tuned_points
from ..tune.judge import adds_entry

PEER = PEERS["fp32"]


@dataclass(frozen=True)
class Settings:
    lengths: tuple[int, ...] = (128, 512)
    batches: tuple[int, ...] = (1, 8)
    threads: int = DEFAULT_THREADS
    repeat: int = 20          # at least this many timed runs per engine and cell ...
    min_time_s: float = 2.0   # ... and at least this long per cell
    max_time_s: float = 60.0  # a slow cell stops here once every engine has 3 runs
    warmup: int = 3
    seed: int = 0
    engines: tuple[str, ...] = tuple(ENGINES)
    pool: str = "default"     # bench_engines.POOLS


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


def time_in_blocks(runs: dict[str, Callable[[], object]], *, repeat: int, min_time_s: float,
                   max_time_s: float, warmup: int = 0, rounds: int = 3) -> dict[str, list[float]]:
    """Seconds per run of each callable, timed in alternating blocks.

    A round gives every engine one block: an untimed run (a pool that slept between its
    blocks wakes up, one that spins settles), then timed runs for about 1/rounds of its
    share of ``min_time_s``. Each round starts one engine later. It stops after
    ``rounds`` rounds once every engine has ``repeat`` runs and ``min_time_s`` passed,
    or at ``max_time_s`` once every engine has 3 runs."""
    names = list(runs)
    for name in names:
        for _ in range(warmup):
            runs[name]()
    times = {name: [] for name in names}
    block_s = min_time_s / max(1, len(names) * rounds)
    start, done = time.perf_counter(), 0
    while names:
        for name in names[done % len(names):] + names[:done % len(names)]:
            runs[name]()
            block_start = time.perf_counter()
            while True:
                t = time.perf_counter()
                runs[name]()
                times[name].append(time.perf_counter() - t)
                if time.perf_counter() - block_start >= block_s:
                    break
        done += 1
        elapsed = time.perf_counter() - start
        counts = min(len(v) for v in times.values())
        if (done >= rounds and counts >= repeat and elapsed >= min_time_s) or (counts >= 3 and elapsed >= max_time_s):
            break
    return times


def summarize(seconds: list[float]) -> dict[str, float]:
    ms = np.asarray(seconds) * 1e3
    q1, med, q3 = np.percentile(ms, [25, 50, 75])
    return {"median_ms": float(med), "iqr_ms": float(q3 - q1), "runs": len(ms)}


# ----------------------------------------------------------------------------- engines
# (bench_engines.py: one factory per engine; bench_report.py: cells, tables and the plot)


def _why(err: Exception) -> str:
    if isinstance(err, LookupError) and str(err).startswith("n/a ("):  # a bundle the bench has not: why, whole
        return str(err)
    lines = [ln for ln in str(err).strip().splitlines() if ln.strip()]
    return f"{type(err).__name__}: {lines[-1] if lines else ''}"[:200]


# ----------------------------------------------------------------------------- the bench
def bench_graph(graph: str, *, settings: Settings = Settings(), tuned: str | Path | None = None,
                bundle: str | Path | None = None, int8_bundle: str | Path | None = None,
                bf16_bundle: str | Path | None = None, out: str | Path | None = None,
                log: Callable[[str], None] = print) -> BenchResult:
    """Time every engine of `settings.engines` on `graph` at each (batch, length).

    `bundle`: an untuned llvm bundle of the graph to reuse (default: compile one into `out`,
    ignoring any tuning database).
    `tuned`: a tuned bundle folder for the "tvm-tuned" column (default: compile one when the
    graph has a tuning database under targets/tuning/llvm/ with an entry the compile adds;
    else the column reads n/a and says which of the two is missing).
    `int8_bundle`: an llvm --precision int8 bundle for the int8 engines (default: compile
    one when an int8 engine is asked for).
    `bf16_bundle`: an llvm --precision bf16 bundle for "tvm-bf16" (default: compile one when
    it is asked for; on a CPU without bf16 instructions the column says why it is empty).
    `out`: where bench.json, bench.md and bench.png go (nothing written when None).
    """
    from ..bundle.artifact import load_bundle
    unknown = sorted(set(settings.engines) - set(ENGINES))
    if unknown:
        raise ValueError(f"unknown engine(s) {unknown}; valid: {', '.join(ENGINES)}")
    if settings.pool not in POOLS:
        raise ValueError(f"unknown pool mode {settings.pool!r}; valid: {', '.join(POOLS)}")
    out = Path(out) if out else None
    threads = set_threads(settings.threads, passive=settings.pool == "passive")
    bundle = load_bundle(bundle) if bundle else _compile(graph, out, "llvm", log, tuning=False)
    points = tuned_points(database_dir("llvm", bundle.name))
    tuned_missing = NO_TUNING
    if tuned is None and points and not any(adds_entry(p) for p in points):
        tuned_missing = NO_TUNED_ENTRY  # no compile: it would leave every entry out
    elif tuned is None and points and "tvm-tuned" in settings.engines:
        tuned = _compile(graph, out, "llvm-tuned", log).path
    tuned_bundle = load_bundle(tuned) if tuned else None
    wants_int8 = any(precision_of(e) == "int8" for e in settings.engines)
    int8 = load_bundle(int8_bundle) if int8_bundle else _compile(graph, out, "llvm-int8", log) if wants_int8 else None
    wants_bf16 = any(precision_of(e) == "bf16" for e in settings.engines)
    bf16, bf16_missing = (load_bundle(bf16_bundle), None) if bf16_bundle else \
        _compile_bf16(graph, out, log) if wants_bf16 else (None, None)
    for kind, other in (("--tuned", tuned_bundle), ("--int8-bundle", int8), ("--bf16-bundle", bf16)):
        if other is not None and other.name != bundle.name:
            raise ValueError(f"{kind} bundle {other.path} is for graph {other.name!r}, not {bundle.name!r}")
    manifest = bundle.manifest
    bad = sorted(set(settings.lengths) - set(usable_lengths(manifest, settings.lengths)))
    if bad:
        raise ValueError(f"lengths {bad} are outside what {bundle.name} accepts ({manifest['dims']})")
    max_batch = manifest.get("dims", {}).get("batch", {}).get("max")
    if max_batch and max(settings.batches) > max_batch:
        raise ValueError(f"batch {max(settings.batches)} is above the graph's max_batch {max_batch}")

    env = {"machine": platform.machine(), "processor": platform.processor() or platform.machine(),
           "cpu": _cpu_name(), "cpu_summary": cpu_summary(), "cpu_count": os.cpu_count(), "threads": threads,
           "untuned_bundle": str(bundle.path), "tuned_bundle": str(tuned_bundle.path) if tuned_bundle else None,
           "int8_bundle": str(int8.path) if int8 else None,
           "bf16_bundle": str(bf16.path) if bf16 else None,
           "tuning_database": tuned_bundle.manifest.get("tuning", {}).get("database") if tuned_bundle else None,
           "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
           "versions": {**manifest["versions"], **_peer_versions()}}
    result = BenchResult(bundle.name, {**asdict(settings), "lengths": list(settings.lengths),
                                       "batches": list(settings.batches)}, env)
    log(f"bench {bundle.name}: B={list(settings.batches)} T={list(settings.lengths)}, threads {threads}, "
        f"pools {settings.pool}, alternating blocks, >= {settings.repeat} runs and >= {settings.min_time_s:g} s "
        f"per cell (cap {settings.max_time_s:g} s), {settings.warmup} warm-up, seed {settings.seed}; "
        f"tuned: {tuned_bundle.path if tuned_bundle else tuned_missing}; int8: {int8.path if int8 else NO_INT8}; "
        f"load average {env['load_average']}")

    ctx = {"bundle": bundle, "tuned": tuned_bundle, "tuned_missing": tuned_missing, "int8": int8, "bf16": bf16,
           "bf16_missing": bf16_missing,
           "threads": settings.threads, "pool": settings.pool}
    engines, broken = {}, {}
    for name, make in ENGINES.items():
        if name not in settings.engines:
            continue
        try:
            engines[name] = make(ctx)
        except Exception as err:  # a missing engine is a table cell, not a crash
            broken[name] = _why(err)
    tolerances = {"fp32": manifest.get("tolerance"), "int8": int8.manifest.get("tolerance") if int8 else None,
                  "bf16": bf16.manifest.get("tolerance") if bf16 else None}
    env["compute_precision"] = ctx.get("compute_precision", {})
    for name, precision in env["compute_precision"].items():
        if precision in ("bf16", "f16") and precision_of(name) == "fp32":
            tolerances[name] = {"float32": dict(TOLERANCES["bf16_compute"])}
            log(f"note: {name} computes in {precision} on this CPU (its default INFERENCE_PRECISION_HINT); "
                "its accuracy is judged by the bf16 tolerance")
    reference = torch_reference(manifest["graph"]["spec"]) if manifest["graph"]["spec"] else None
    total = len(settings.batches) * len(settings.lengths)
    for i, (b, t) in enumerate(((b, t) for b in settings.batches for t in settings.lengths), 1):
        cells = _bench_cell(engines, broken, reference, manifest, tolerances, settings, b, t)
        result.cells += cells
        log(f"[{i}/{total}] B={b} T={t}: " + "; ".join(f"{c.engine} {c.text()}" for c in cells))
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench.json").write_text(result.to_json())
        (out / "bench.md").write_text(result.to_markdown() + "\n")
        result.plot(out / "bench.png")
    return result


def _compile(graph: str, out: Path | None, flavour: str, log, *, tuning: bool = True):
    """The bench's own llvm bundle: "llvm" (untuned), "llvm-tuned", "llvm-int8" or "llvm-bf16"."""
    from ..compile.pipeline import compile_graph
    dest = (out or Path("dist")) / f"{Path(graph).stem}-{flavour}"
    what = {"llvm": "untuned: default llvm schedules, no tuning database", "llvm-tuned": "with its tuning database",
            "llvm-int8": "--precision int8", "llvm-bf16": "--precision bf16"}[flavour]
    log(f"compiling {graph} ({what}) -> {dest}")
    return compile_graph(graph, target="llvm", out=dest, tuning=tuning, log=lambda m: None,
                         precision={"llvm-int8": "int8", "llvm-bf16": "bf16"}.get(flavour))


def _compile_bf16(graph: str, out: Path | None, log):
    """(the bf16 bundle, None), or (None, why not) on a CPU without bf16 instructions."""
    try:
        return _compile(graph, out, "llvm-bf16", log), None
    except ValueError as err:
        if "--precision bf16 needs" not in str(err):
            raise
        log(f"no bf16 bundle: {err}")
        return None, f"n/a ({err})"


def _cpu_name() -> str:
    try:
        import tvm
        return str(tvm.target.codegen.llvm_get_system_cpu())
    except Exception:  # pylint: disable=broad-except
        return ""


def _peer_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version
    found = {}
    for package in ("onnxruntime", "openvino"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            pass
    return found


def _bench_cell(engines, broken, reference, manifest, tolerances, settings, b, t) -> list[Cell]:
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
            rows = compare(expected, got, name=name, length=t, tolerance_overrides=tolerances.get(name, tolerances[precision_of(name)]))
            cell.max_abs, cell.ok = max(r.max_abs for r in rows), all(r.ok for r in rows)
            cell.cosine = min(r.cosine for r in rows)
        runs[name] = run
    times = time_in_blocks(runs, repeat=settings.repeat, min_time_s=settings.min_time_s,
                           max_time_s=settings.max_time_s, warmup=settings.warmup)
    for name, seconds in times.items():
        for key, value in summarize(seconds).items():
            setattr(cells[name], key, value)
    for cell in cells.values():
        peer = cells.get(PEERS[precision_of(cell.engine)])
        if cell.median_ms is not None and peer is not None and peer.median_ms:
            cell.ratio_vs_peer = cell.median_ms / peer.median_ms
    return [cells[name] for name in ENGINES if name in cells]
