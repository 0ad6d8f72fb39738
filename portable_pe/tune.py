"""MetaSchedule tuning: one JSON database per (target, graph), applied by compile.

MetaSchedule measures static shapes only, so a graph is tuned at fixed (batch, seq)
points. A compile that finds a database adds one specialized copy of `main` per tuned
point (`main_b1_t128`, ...) whose kernels come from the database; `main` keeps its
dynamic shapes and the default schedules, and the runtime picks the specialized entry
when the inputs match it exactly.

    targets/tuning/<target>/<graph>/database_workload.json
                                    database_tuning_record.json
                                    tuned.json      (tuned points, trials, seconds)
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .tuning_db import (as_main, database_dir, fused_module, fused_prim_funcs, kernels_of, open_database,
                        specialize, specialized_name, tuned_points, workload)


def is_rope_kernel(name: str) -> bool:
    """Fused RoPE kernels: the q/k rotation (slices, cos/sin products, a concat or stack)
    and the cos/sin table itself."""
    has = lambda *words: all(w in name for w in words)  # noqa: E731
    return has("multiply", "concatenate") or has("multiply", "stack") or "cos" in name or "sin" in name


def rpc_runner(tracker: str, key: str | None):
    """MetaSchedule's RPC runner: candidates are measured on boards registered at a TVM RPC
    tracker under `key` (start boards with `python -m tvm.exec.rpc_server --tracker HOST:PORT
    --key KEY`; the emulated board: scripts/board_server.py start --tracker ... --key ...)."""
    from tvm.s_tir import meta_schedule as ms
    host, _, port = tracker.rpartition(":")
    if not host or not port.isdigit() or not key:
        raise ValueError(f"--rpc-tracker expects HOST:PORT and --rpc-key a key, got {tracker!r} / {key!r}")
    return ms.runner.RPCRunner(ms.runner.RPCConfig(tracker_host=host, tracker_port=int(port),
                                                   tracker_key=key, session_timeout_sec=120))


def _builder(st):
    """Candidates are linked the way the target's bundles are (the aarch64 cross compiler for arm)."""
    from tvm.s_tir import meta_schedule as ms
    from .backends import get_backend
    if st.target.backend == "llvm":
        return "local"
    backend = get_backend(st.target.backend)

    def export(module) -> str:
        import tempfile
        path = tempfile.mktemp(suffix=".so", prefix="tune-")
        backend.export_library(module, path)
        return path
    return ms.builder.LocalBuilder(f_export=export)


@dataclass
class TuneResult:
    db_dir: Path
    point: dict
    tasks: int
    trials: int
    seconds: float


def tune_graph(source: str, *, target: str = "llvm", batch: int = 1, seq: int = 128, trials: int = 64,
               only: str | None = None, runner=None, log: Callable[[str], None] = print) -> TuneResult:
    """Tune the graph's kernels at (batch, seq), task by task, into its database.

    `only="rope"` tunes the RoPE kernels alone; `runner` is a MetaSchedule runner
    (default: local; pass ms.runner.RPCRunner for boards behind a TVM RPC tracker).
    """
    import tvm
    from tvm.s_tir import meta_schedule as ms
    from .compile import prepare
    if only not in (None, "rope"):
        raise ValueError(f"--only takes 'rope', got {only!r}")
    st = prepare(source, target=target, log=log)
    point = {"batch": batch, "seq": seq}
    bad = [f"{name} ({info['role']}) allows {info['min']}..{info['max']}" for name, info in st.io["dims"].items()
           if not info["min"] <= point[info["role"]] <= info["max"]]
    if bad:
        raise ValueError(f"cannot tune {st.name} at batch={batch} seq={seq}: {'; '.join(bad)}")
    static = as_main(specialize(st.relax, dims=st.io["dims"], point=point), specialized_name(point))
    funcs = fused_prim_funcs(static, st.tvm_target)
    if only == "rope":
        funcs = {n: f for n, f in funcs.items() if is_rope_kernel(n)}
        if not funcs:
            raise ValueError(f"graph {st.name} has no RoPE kernels to tune (encoding {st.spec.encoding if st.spec else '?'})")
    db_dir = database_dir(target, st.name)
    db_dir.mkdir(parents=True, exist_ok=True)
    database = open_database(db_dir)
    log(f"tuning {len(funcs)} kernel(s) of {st.name} at batch={batch} seq={seq} for {target}, "
        f"{trials} trials each -> {db_dir}")
    builder = _builder(st)
    # MetaSchedule prints a task table per trial batch; its log files keep it, the console shows our bar
    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    start = time.perf_counter()
    work = Path(db_dir.parent / f".{db_dir.name}.work")
    for i, (name, func) in enumerate(sorted(funcs.items()), 1):
        t = time.perf_counter()
        with tvm.transform.PassContext(opt_level=3):
            ms.tune_tir(mod=workload(func),
                        target=st.tvm_target, work_dir=str(work), max_trials_global=trials,
                        num_trials_per_iter=min(trials, 16), database=database, builder=builder,
                        **({"runner": runner} if runner is not None else {}))
        elapsed = time.perf_counter() - start
        eta = elapsed / i * (len(funcs) - i)
        bar = "#" * int(30 * i / len(funcs))
        log(f"  [{bar:<30}] {i}/{len(funcs)} {name[:48]:<48} {time.perf_counter() - t:5.1f} s, "
            f"elapsed {elapsed:6.1f} s, about {eta:6.1f} s left")
    shutil.rmtree(work, ignore_errors=True)
    seconds = time.perf_counter() - start
    entry = {**point, "trials_per_task": trials, "tasks": len(funcs), "only": only,
             "seconds": round(seconds, 1), "target": target}
    _save_point(db_dir, st.name, entry)
    if runner is None and st.target.backend == "llvm":
        recheck(st, point, log=log)
    else:
        log("  tuned kernels not compared with the default schedules (that needs this machine to be the target)")
    return TuneResult(db_dir, point, len(funcs), trials, seconds)


def _save_point(db_dir: Path, graph: str, entry: dict) -> None:
    points = [p for p in tuned_points(db_dir) if (p["batch"], p["seq"]) != (entry["batch"], entry["seq"])]
    points.append(entry)
    points.sort(key=lambda p: (p["batch"], p["seq"]))
    tmp = db_dir / "tuned.json.tmp"
    tmp.write_text(json.dumps({"graph": graph, "points": points}, indent=2) + "\n")
    tmp.replace(db_dir / "tuned.json")


def recheck(st, point: dict, *, runs: int = 30, log: Callable[[str], None] = print) -> list[dict]:
    """Time each tuned kernel against its default schedule inside the model at `point` and
    keep only the winners in the database (tune_judge.py); records the verdicts in tuned.json."""
    from .backends import get_backend
    from .threads import DEFAULT_THREADS, set_threads
    from .parity import dim_roles, make_inputs
    from .tune_judge import judge, prune_database
    set_threads(DEFAULT_THREADS)  # judged under the threads and pool settings `bench` uses
    db_dir = database_dir(st.target.name, st.name)
    entry = next((p for p in tuned_points(db_dir) if (p["batch"], p["seq"]) == (point["batch"], point["seq"])), None)
    if entry is None:
        raise ValueError(f"{db_dir} has no tuned point at batch={point['batch']} seq={point['seq']}")
    static = as_main(specialize(st.relax, dims=st.io["dims"], point=point), specialized_name(point))
    values = make_inputs(st.io["inputs"], length=point["seq"], batch=point["batch"],
                         dim_roles=dim_roles({"dims": st.io["dims"]}))
    log(f"comparing tuned kernels with the default schedules at batch={point['batch']} seq={point['seq']} "
        f"({runs} interleaved runs of each build)")
    fused = fused_module(static, st.tvm_target)
    verdicts = judge(static, fused, st.tvm_target, get_backend(st.target.backend).relax_pipeline(st.tvm_target),
                     open_database(db_dir), [values[i["name"]] for i in st.io["inputs"]], runs=runs)
    for v in verdicts:
        if v["tuned_ms"] is not None:
            log(f"  {v['kernel'][:56]:<56} default {v['default_ms']:8.3f} ms  tuned {v['tuned_ms']:8.3f} ms  "
                f"{'kept' if v['kept'] else 'dropped'}")
    kept = prune_database(db_dir, kernels_of(fused), verdicts)
    _save_point(db_dir, st.name, {**entry, "kept_kernels": kept, "kernels": verdicts})
    log(f"  {kept} tuned kernel(s) kept, {sum(v['tuned_ms'] is not None for v in verdicts) - kept} dropped "
        f"(the default schedule was faster)")
    return verdicts


def recheck_graph(source: str, *, target: str = "llvm", log: Callable[[str], None] = print) -> int:
    """Recheck every tuned point of a graph's database (after the default schedules changed)."""
    from .compile import prepare
    from .targets import load_target
    if load_target(target).backend != "llvm":  # before the export, which takes seconds
        raise ValueError(f"--recheck runs both builds on this machine, so it needs --target llvm, not {target}")
    st = prepare(source, target=target, log=lambda m: None)
    points = tuned_points(database_dir(target, st.name))
    if not points:
        raise ValueError(f"{st.name} has no tuning database for {target} to recheck")
    for p in points:
        recheck(st, {"batch": p["batch"], "seq": p["seq"]}, log=log)
    return len(points)
