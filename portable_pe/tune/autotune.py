"""MetaSchedule tuning: one JSON database per (target, graph), applied by compile.

MetaSchedule measures static shapes only, so a graph is tuned at fixed (batch, seq)
points. A compile that finds a database adds one specialized copy of `main` per tuned
point (`main_b1_t128`, ...) whose kernels come from the database, unless the recheck
found `main` as fast there (judge.py); `main` keeps its dynamic shapes and the default
schedules, and the runtime picks the specialized entry when the inputs match it exactly.

    targets/tuning/<target>/<graph>/database_workload.json
                                    database_tuning_record.json
                                    tuned.json      (tuned points, trials, seconds)
    targets/tuning/arm/<board>/<graph>/...          (arm: one database per board)

Candidates are measured on this machine, or on boards behind a TVM RPC tracker
(tune_rpc.py).
"""

from __future__ import annotations

import functools
import json
import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..backends import export_here, get_backend
from .database import (as_main, database_dir_of, fused_module, fused_prim_funcs, kernels_of,
                        open_database, specialize, specialized_name, tuned_points, workload)


#: seconds to build (and for arm, cross-link) one candidate before the builder gives up on
#: it; TVM's default of 30 s counts the start of a fresh worker process (a TVM import)
BUILD_TIMEOUT_S = 120.0


def is_rope_kernel(name: str) -> bool:
    """Fused RoPE kernels: the q/k rotation (slices, cos/sin products, a concat or stack)
    and the cos/sin table itself."""
    has = lambda *words: all(w in name for w in words)  # noqa: E731
    return has("multiply", "concatenate") or has("multiply", "stack") or "cos" in name or "sin" in name


def _builder(st):
    """Candidates are built without TVM's tensor-intrinsic import and linked the way the
    target's bundles are (the aarch64 cross compiler for arm)."""
    from tvm.s_tir import meta_schedule as ms
    backend = get_backend(st.target.backend)
    export = None  # MetaSchedule's own export, for a backend that links here as it does
    if backend.export_library is not export_here:

        def export(module) -> str:
            # its own folder: after measuring, MetaSchedule deletes the artifact's *folder*
            # (utils.remove_build_dir), so a file straight in /tmp would take /tmp with it
            import os
            import tempfile
            path = os.path.join(tempfile.mkdtemp(prefix="tune-candidate-"), "candidate.so")
            backend.export_library(module, path)
            return path
    return ms.builder.LocalBuilder(f_build=functools.partial(build_candidate, backend=st.target.backend),
                                   f_export=export, timeout_sec=BUILD_TIMEOUT_S)


def build_candidate(mod, target, _params, *, backend: str = "llvm"):
    """MetaSchedule's default_build less its `import tvm.s_tir.tensor_intrin`, which parses
    every intrinsic TVM ships (CUDA's mostly) as TVMScript: 145 s of CPU in each builder
    process on this machine, and the builder starts new processes for every batch. The
    candidates arrive already scheduled (any tensorization done in this process), so the
    build needs none of them. The backend builds it (cuda compiles its kernels with nvcc)."""
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock
    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return get_backend(backend).build_candidate(mod, target)


@dataclass
class TuneResult:
    db_dir: Path
    point: dict
    tasks: int
    trials: int
    seconds: float


class TuneError(RuntimeError):
    """Tuning stopped part way; the kernels tuned before it stay in the database."""


def check_tunable(target: str, target_options: dict | None = None) -> None:
    """What MetaSchedule needs of the target (its backend's check_tunable: a CPU target's
    core count, cuda's runtime), checked in a second, before the export."""
    from ..backends.targets import load_target
    from ..compile.stages import resolve_target
    spec = load_target(target)
    _, tvm_target = resolve_target(spec, dict(target_options or {}))
    get_backend(spec.backend).check_tunable(tvm_target)


def tune_graph(source: str, *, target: str = "llvm", target_options: dict | None = None, batch: int = 1,
               seq: int = 128, trials: int = 64, only: str | None = None, runner=None,
               log: Callable[[str], None] = print) -> TuneResult:
    """Tune the graph's kernels at (batch, seq), task by task, into its database.

    `only="rope"` tunes the RoPE kernels alone; `runner` is a MetaSchedule runner
    (default: local; tune_rpc.board_runner for boards behind a TVM RPC tracker).
    `target_options` as for compile (board=, num_cores=, arch=). If tuning stops part way
    (a board lost, Ctrl-C), the kernels tuned so far stay in the database, the point is
    marked incomplete in tuned.json, and the next run at that point tunes only the rest.
    """
    from ..compile.pipeline import prepare
    if only not in (None, "rope"):
        raise ValueError(f"--only takes 'rope', got {only!r}")
    check_tunable(target, target_options)
    st = prepare(source, target=target, target_options=target_options, log=log)
    point = {"batch": batch, "seq": seq}
    bad = [f"{name} ({info['role']}) allows {info['min']}..{info['max']}" for name, info in st.io["dims"].items()
           if not info["min"] <= point[info["role"]] <= info["max"]]
    if bad:
        raise ValueError(f"cannot tune {st.name} at batch={batch} seq={seq}: {'; '.join(bad)}")
    static = as_main(specialize(st.relax, dims=st.io["dims"], point=point), specialized_name(point))
    funcs = fused_prim_funcs(static, st.tvm_target, backend=get_backend(st.target.backend))
    if only == "rope":
        funcs = {n: f for n, f in funcs.items() if is_rope_kernel(n)}
        if not funcs:
            raise ValueError(f"graph {st.name} has no RoPE kernels to tune (encoding {st.spec.encoding if st.spec else '?'})")
    db_dir = database_dir_of(st)
    db_dir.mkdir(parents=True, exist_ok=True)
    database = open_database(db_dir)
    todo = _left_to_tune(db_dir, point, funcs, database, st.tvm_target, log)
    where = "on the boards behind the tracker" if runner is not None else "on this machine"
    log(f"tuning {len(todo)} kernel(s) of {st.name} at batch={batch} seq={seq} for {target} "
        f"{json.dumps(st.target_options) if st.target_options else ''}, {trials} trials each, measured {where} "
        f"-> {db_dir}")
    start = time.perf_counter()
    try:
        _tune_tasks(st, todo, database, db_dir, trials=trials, runner=runner, log=log)
    except BaseException as err:
        done = sum(database.query_tuning_record(workload(f), st.tvm_target, "main") is not None
                   for f in funcs.values())
        _save_point(db_dir, st.name, {**point, "trials_per_task": trials, "tasks": len(funcs), "only": only,
                                      "seconds": round(time.perf_counter() - start, 1), "target": target,
                                      "target_options": st.target_options, "complete": False,
                                      "tuned_tasks": done})
        log(f"tuning stopped: {done} of {len(funcs)} kernel(s) have tuned schedules in {db_dir} (kept; "
            f"`compile` applies them, and tuning again at this point tunes only the rest)")
        if isinstance(err, Exception) and not isinstance(err, (ValueError, TuneError)):
            raise TuneError(f"tuning {st.name} stopped: {str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__}") from err
        raise
    seconds = time.perf_counter() - start
    entry = {**point, "trials_per_task": trials, "tasks": len(funcs), "only": only,
             "seconds": round(seconds, 1), "target": target, "target_options": st.target_options}
    if hasattr(runner, "usage"):
        entry["measured"] = runner.usage().summary()
        log(f"  all kernels: {entry['measured']}")
    _save_point(db_dir, st.name, entry)
    if runner is None and get_backend(st.target.backend).runs_here:
        recheck(st, point, log=log)
    else:
        log("  tuned kernels not compared with the default schedules (that needs this machine to be the target)")
    return TuneResult(db_dir, point, len(funcs), trials, seconds)


def _left_to_tune(db_dir: Path, point: dict, funcs: dict, database, target, log) -> dict:
    """All kernels, or after a run that stopped part way at this point, the ones it did not reach."""
    saved = next((p for p in tuned_points(db_dir) if (p["batch"], p["seq"]) == (point["batch"], point["seq"])), None)
    if saved is None or saved.get("complete", True):
        return funcs
    todo = {n: f for n, f in funcs.items() if database.query_tuning_record(workload(f), target, "main") is None}
    log(f"  resuming an incomplete run: {len(funcs) - len(todo)} kernel(s) already tuned at this point are skipped")
    return todo


def _tune_tasks(st, funcs: dict, database, db_dir: Path, *, trials: int, runner, log) -> None:
    import tvm
    from tvm.s_tir import meta_schedule as ms
    builder = _builder(st)
    # MetaSchedule prints a task table per trial batch; its log files keep it, the console shows our bar
    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    start = time.perf_counter()
    work = Path(db_dir.parent / f".{db_dir.name}.work")
    for i, (name, func) in enumerate(sorted(funcs.items()), 1):
        t = time.perf_counter()
        seen = len(runner.usage().measurements) if hasattr(runner, "usage") else 0
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
        if hasattr(runner, "usage"):
            usage = runner.usage().since(seen)
            log(f"      {usage.summary()}")
            if not any(m.ok for m in usage.measurements):
                raise TuneError(f"no candidate of kernel {name} could be measured on the boards "
                                f"({usage.summary()})")
    shutil.rmtree(work, ignore_errors=True)


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
    from ..threads import DEFAULT_THREADS, set_threads
    from ..run.parity import dim_roles, make_inputs
    from .judge import judge, judge_entry, prune_database
    # judged under the threads and pool settings `bench` uses by default (pools spinning)
    set_threads(DEFAULT_THREADS, passive=False)
    db_dir = database_dir_of(st)
    entry = next((p for p in tuned_points(db_dir) if (p["batch"], p["seq"]) == (point["batch"], point["seq"])), None)
    if entry is None:
        raise ValueError(f"{db_dir} has no tuned point at batch={point['batch']} seq={point['seq']}")
    both = specialize(st.relax, dims=st.io["dims"], point=point)  # main and the point's entry
    static = as_main(both, specialized_name(point))
    values = make_inputs(st.io["inputs"], length=point["seq"], batch=point["batch"],
                         dim_roles=dim_roles({"dims": st.io["dims"]}))
    inputs = [values[i["name"]] for i in st.io["inputs"]]
    log(f"comparing tuned kernels with the default schedules at batch={point['batch']} seq={point['seq']} "
        f"({runs} interleaved runs of each build)")
    backend = get_backend(st.target.backend)
    pipeline = backend.relax_pipeline(st.tvm_target)
    fused = fused_module(static, st.tvm_target, backend=backend)
    verdicts = judge(static, fused, st.tvm_target, pipeline, open_database(db_dir), inputs, runs=runs)
    for v in verdicts:
        if v["tuned_ms"] is not None:
            log(f"  {v['kernel'][:56]:<56} default {v['default_ms']:8.3f} ms  tuned {v['tuned_ms']:8.3f} ms  "
                f"{'kept' if v['kept'] else 'dropped'}")
    kept = prune_database(db_dir, kernels_of(fused), verdicts)
    log(f"  {kept} tuned kernel(s) kept, {sum(v['tuned_ms'] is not None for v in verdicts) - kept} dropped "
        f"(the default schedule was faster)")
    # the entry with the kernels kept, against the dynamic main on the same inputs
    whole = judge_entry(both, specialized_name(point), st.tvm_target, pipeline, open_database(db_dir), inputs,
                        runs=runs)
    log(f"  entry {whole['function']} {whole['tuned_ms']:.3f} ms, dynamic main {whole['main_ms']:.3f} ms: "
        f"{'compile adds the entry' if whole['kept'] else 'compile leaves the entry out (main is as fast)'}")
    _save_point(db_dir, st.name, {**entry, "kept_kernels": kept, "kernels": verdicts, "entry": whole})
    return verdicts


def recheck_graph(source: str, *, target: str = "llvm", log: Callable[[str], None] = print) -> int:
    """Recheck every tuned point of a graph's database (after the default schedules changed)."""
    from ..backends.targets import load_target
    from ..compile.pipeline import prepare
    if not get_backend(load_target(target).backend).runs_here:  # before the export, which takes seconds
        raise ValueError(f"--recheck runs both builds on this machine, so it needs --target llvm, not {target}")
    st = prepare(source, target=target, log=lambda m: None)
    points = tuned_points(database_dir_of(st))
    if not points:
        raise ValueError(f"{st.name} has no tuning database for {target} to recheck")
    for p in points:
        recheck(st, {"batch": p["batch"], "seq": p["seq"]}, log=log)
    return len(points)
