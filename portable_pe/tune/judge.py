"""Keep a tuned kernel only where it beats the default schedule, timed inside the model.

MetaSchedule compares its candidates with one another, never with the schedules a
kernel gets when the database has nothing for it (cpu_schedule/: packed weights,
register tiles, serial small nests). A few trials per kernel often lose to those, and a
database that silently makes a compile slower is worse than none. So, for one tuned
point, both builds of the specialized entry run side by side, interleaved, with every
kernel call timed by the VM's instrument hook. Calls pair up by position (both builds
run the same Relax graph, so the same kernels in the same order), are summed per fused
kernel, and the database keeps the best record of each kernel whose tuned version was
faster; the others fall back to the default schedules.

The verdicts go into tuned.json beside the database, so anyone can see which kernels
came from MetaSchedule and by how much they won or lost.

A second verdict is on the specialized entry as a whole, against the dynamic `main` the
same inputs run without it. The static copy does not only swap in tuned kernels: with
every shape a constant it takes other forms and schedules (TOPI's reshapes instead of
head_reshapes' fusable ones, static extents that the small-work rules serialize), and
the CPU schedules are written and measured on the symbolic forms. Rechecked on Zen 3, all
seven llvm entries (B=1 T=128) ran 0-6% slower than `main` (alibi: a split and two head
copies, 0.39 ms per run, where `main` has 0.09). So a compile adds the entry only where it
beat `main` in the recheck (entry_verdict).
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import numpy as np

#: VM calls that are no kernel: its builtins, and the views flat_rows makes (memory.view)
_NOT_KERNELS = ("vm.builtin.", "runtime.TVMTensorCreateView")
# A tuned kernel must be this much faster to stay: below it, the difference is the
# run-to-run noise of a shared machine, and the default schedule is the one we maintain.
KEEP_MARGIN = 0.03


def kernel_call_order(fused) -> list[str]:
    """Names of the kernels `main` of a fused module calls, in call order."""
    import tvm
    from tvm import relax
    call_tir = tvm.ir.Op.get("relax.call_tir")
    return [binding.value.args[0].name_hint
            for block in fused["main"].body.blocks for binding in block.bindings
            if isinstance(binding.value, relax.Call) and binding.value.op.same_as(call_tir)]


def _reshapes_as_views(fused, target):
    """`fused` with the reshapes the build turns into views (RewriteDataflowReshape) taken
    out of its calls, as the VM runs it. After the default schedules: a fused pair of
    reshapes (flat_rows makes them) is seen as one only once its blocks are inlined."""
    import tvm
    from tvm import relax
    from ..cpu_schedule.pipeline import CPUDefaultSchedule, MarkConstantWeights
    with target:
        return tvm.transform.Sequential([MarkConstantWeights, CPUDefaultSchedule(target),
                                         relax.transform.RewriteDataflowReshape()])(fused)


def timed_kernel_calls(vm, entry: str, args) -> list[tuple[str, float]]:
    """One run of `entry`: (kernel symbol, seconds) of every kernel call, builtins left out."""
    calls: list[tuple[str, float]] = []
    started: dict[str, float] = {}

    def instrument(_func, symbol, before, _ret, *_args):
        if symbol.startswith(_NOT_KERNELS):
            return 0
        if before:
            started[symbol] = time.perf_counter()
        else:
            calls.append((symbol, time.perf_counter() - started.pop(symbol)))
        return 0

    vm.set_instrument(instrument)
    vm[entry](*args)
    return calls


def judge(static_mod, fused, target, pipeline, database, inputs: list[np.ndarray], *, runs: int = 30) -> list[dict]:
    """Per kernel of `fused` (static_mod after the fusion passes): median ms per run with the
    default schedule and with the database."""
    from .database import kernels_of, workload
    vms = {"default": _loaded(static_mod, target, pipeline), "tuned": _loaded(static_mod, target, pipeline, database)}
    args = _warmed_up(vms.values(), ["main"], inputs)
    order = kernel_call_order(_reshapes_as_views(fused, target))
    samples: dict[str, list[list[tuple[str, float]]]] = {name: [] for name in vms}
    for _ in range(runs):  # one run each, in turn, so drift lands on both
        for name, vm in vms.items():
            samples[name].append(timed_kernel_calls(vm, "main", args))
    for name, per_run in samples.items():
        if any(len(calls) != len(order) for calls in per_run):
            raise RuntimeError(f"the {name} build ran {len(per_run[0])} kernel calls, the graph has "
                               f"{len(order)}: cannot pair kernels for the comparison")
    funcs = kernels_of(fused)
    verdicts = []
    for kernel in dict.fromkeys(order):
        positions = [i for i, k in enumerate(order) if k == kernel]
        ms = {name: 1000 * float(np.median([sum(run[i][1] for i in positions) for run in per_run]))
              for name, per_run in samples.items()}
        tuned = database.has_workload(workload(funcs[kernel]))
        verdicts.append({"kernel": kernel, "calls": len(positions), "default_ms": round(ms["default"], 4),
                         "tuned_ms": round(ms["tuned"], 4) if tuned else None,
                         "kept": bool(tuned and ms["tuned"] < ms["default"] * (1 - KEEP_MARGIN))})
    return verdicts


def prune_database(db_dir: Path, funcs: dict, verdicts: list[dict]) -> int:
    """Keep the best record of every workload, except this point's losing kernels (`funcs`:
    this point's kernels by name); atomically. Returns how many of them stay tuned."""
    import shutil
    import tempfile
    import tvm_ffi
    from tvm.s_tir import meta_schedule as ms
    from .database import DB_FILES, open_database, workload
    database = open_database(db_dir)
    verdict_of = {tvm_ffi.structural_hash(workload(funcs[v["kernel"]])): v["kept"] for v in verdicts}
    recorded = {}  # structural hash -> MetaSchedule Workload
    for record in database.get_all_tuning_records():
        recorded.setdefault(tvm_ffi.structural_hash(record.workload.mod), record.workload)
    with tempfile.TemporaryDirectory(dir=db_dir.parent, prefix=f".{db_dir.name}.") as tmp:
        fresh = ms.database.JSONDatabase(work_dir=tmp, allow_missing=True)
        for key, entry in recorded.items():
            if not verdict_of.get(key, True):
                continue
            for record in database.get_top_k(entry, 1):
                fresh.commit_tuning_record(ms.database.TuningRecord(
                    record.trace, fresh.commit_workload(entry.mod), record.run_secs, record.target,
                    record.args_info))
        for name in DB_FILES:
            shutil.move(str(Path(tmp) / name), str(db_dir / name))
    return sum(1 for v in verdicts if v["kept"])


def judge_entry(mod, entry: str, target, pipeline, database, inputs: list[np.ndarray], *, runs: int = 30) -> dict:
    """Median ms per run of the specialized `entry` (with the database's kernels) and of the
    dynamic `main` on the same inputs: one build holding both, as a compile makes it, run
    in turn so drift lands on both. kept: the entry is faster by more than KEEP_MARGIN."""
    vm = _loaded(mod, target, pipeline, database)
    args = _warmed_up([vm], [entry, "main"], inputs)
    samples: dict[str, list[float]] = {entry: [], "main": []}
    for i in range(runs):
        for name in (entry, "main") if i % 2 == 0 else ("main", entry):
            start = time.perf_counter()
            vm[name](*args)
            samples[name].append(time.perf_counter() - start)
    tuned_ms, main_ms = (1000 * float(np.median(samples[name])) for name in (entry, "main"))
    return {"function": entry, "tuned_ms": round(tuned_ms, 4), "main_ms": round(main_ms, 4),
            "kept": bool(tuned_ms < main_ms * (1 - KEEP_MARGIN))}


def entry_verdict(point: dict) -> dict | None:
    """The recheck's verdict on a tuned point's entry (judge_entry), None where the point was
    never compared with `main` (tuned before the comparison existed, or on a board)."""
    return point.get("entry")


def adds_entry(point: dict) -> bool:
    """Whether a compile adds the point's specialized entry: unless the recheck found `main`
    as fast (a point never compared keeps its entry)."""
    verdict = entry_verdict(point)
    return verdict is None or verdict["kept"]


def _loaded(mod, target, pipeline, database=None):
    """`mod` built as a bundle is (backend._build: the same TIR pipeline, so the times are the
    shipped ones), with `database` in scope when given, in a VM on the CPU."""
    import tvm
    from tvm import relax
    from ..cpu_schedule.work_claims import cpu_tir_pipeline
    with database if database is not None else contextlib.nullcontext():
        exe = tvm.compile(mod, target=target, relax_pipeline=pipeline, tir_pipeline=cpu_tir_pipeline(target))
    return relax.VirtualMachine(exe, tvm.cpu())


def _warmed_up(vms, entries: list[str], inputs: list[np.ndarray]) -> list:
    """`inputs` as device tensors, after three runs of each entry of each VM."""
    import tvm
    args = [tvm.runtime.tensor(np.ascontiguousarray(a), device=tvm.cpu()) for a in inputs]
    for vm in vms:
        for name in entries:
            for _ in range(3):
                vm[name](*args)
    return args
