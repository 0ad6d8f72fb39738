"""The guide's llvm section: every encoder built for this CPU, timed side by side.

Per (batch, length) cell the encoders run round-robin, run by run (bench.interleave), so
drift lands on all of them alike; each gets the same seeded input. Besides latency:

- run memory: the resident memory one run adds, from an empty TVM memory pool (the pool
  keeps every block a run allocates until it is cleared, so its growth is the run's peak);
- the position work from a per-kernel profile (the VM's instrument hook, the timing
  `tune --recheck` uses): kernels are matched to the no-position build's by structural
  hash, and the position work is the time of the kernels the encoding adds or changes
  minus the time of the baseline kernels they replace (for RoPE the angle tables and the
  rotation fused into the q/k reshapes; for T5 the bucket kernels and the attention's
  bias read), so fused kernels are charged only for what they add;
- a bundle refuses what it was not built for (a learned table's length): that cell holds
  the refusal, in the runtime's words.

Every build uses the default schedules (no tuning database), so encodings compare alike.
"""

from __future__ import annotations

import ctypes
import gc
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from ..bench.graph import interleave, summarize


@dataclass(frozen=True)
class CpuSettings:
    batches: tuple[int, ...] = (1, 8)
    lengths: tuple[int, ...] = (128, 512, 2048, 4096)
    threads: int = 2
    repeat: int = 5            # at least this many timed runs per encoding and cell ...
    min_time_s: float = 1.0    # ... and this long per cell
    max_time_s: float = 30.0   # a slow cell stops here once it has 3 runs
    profile_batch: int = 1     # the per-kernel profile runs at this batch, every length
    profile_runs: int = 3


def build_bundles(sources: dict[str, str], *, work_dir: Path, pe_tables: str | None = None,
                  log: Callable[[str], None]) -> dict[str, dict]:
    """name -> {"bundle", "build_s"} for every graph, built for llvm without tuning."""
    from ..compile.pipeline import compile_graph
    built = {}
    for name, source in sources.items():
        start = time.perf_counter()
        bundle = compile_graph(source, target="llvm", out=work_dir / f"{name}{'-' + pe_tables if pe_tables else ''}",
                               tuning=False, pe_tables=pe_tables, log=lambda m: None)
        built[name] = {"bundle": bundle, "build_s": time.perf_counter() - start}
        log(f"  llvm: built {name}{' (' + pe_tables + ' tables)' if pe_tables else ''} "
            f"in {built[name]['build_s']:.1f} s")
    return built


#: TVM's weight-prepack split renames a kernel `K` to `K_prepacked` in the built module
_PREPACKED = "_prepacked"


def kernel_hashes(source: str) -> dict[str, str]:
    """Kernel name -> structural hash of each kernel a build of `source` schedules: the
    same kernel in two builds has the same hash, whatever its name or number."""
    import tvm_ffi
    from ..compile.pipeline import prepare
    from ..tune.database import fused_module, kernels_of, workload
    st = prepare(source, target="llvm", log=lambda m: None)
    funcs = kernels_of(fused_module(st.relax, st.tvm_target))
    return {name: format(tvm_ffi.structural_hash(workload(f)), "x") for name, f in funcs.items()}


def kernel_key(symbol: str, hashes: dict[str, str]) -> str:
    """A run-time kernel symbol's structural hash; symbols that are no fused kernel (the
    dynamic shape function) are keyed by name."""
    name = symbol[: -len(_PREPACKED)] if symbol.endswith(_PREPACKED) else symbol
    return hashes.get(name, f"symbol:{symbol}")


class Runner:
    """One bundle's VM, its inputs per cell, and the refusal of inputs it was not built for."""

    def __init__(self, bundle):
        import tvm
        from ..run.local import LocalRunner
        self.bundle = bundle
        from tvm import relax
        self.local = LocalRunner(bundle)
        self.vm = self.local.vm
        # a second VM for the per-kernel profile: the instrument hook stays set on it
        self.profile_vm = relax.VirtualMachine(tvm.runtime.load_module(str(bundle.file("model.so"))),
                                               self.local.device)
        self.names = [i["name"] for i in bundle.manifest["inputs"]]
        self._tensor = lambda a: tvm.runtime.tensor(np.ascontiguousarray(a), device=self.local.device)

    def args(self, x: np.ndarray):
        """VM arguments for token embeddings x, or the bundle's refusal (InputError)."""
        inputs = {"x": x, "positions": np.arange(x.shape[1], dtype=np.int64)}
        return self.vm_args({k: v for k, v in inputs.items() if k in self.names})

    def vm_args(self, inputs: dict[str, np.ndarray]):
        """VM arguments for `inputs` by name (an image graph's {"pixel_values": ...}), or the
        bundle's refusal (InputError)."""
        from ..run.local import check_inputs
        check_inputs(self.bundle.manifest, inputs)
        return [self._tensor(inputs[n]) for n in self.names]


_libc = ctypes.CDLL("libc.so.6") if os.path.exists("/proc/self/statm") else None


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def run_memory(vm, args) -> int:
    """Bytes of resident memory one run of `main` adds from an empty memory pool."""
    import tvm
    clear = tvm.get_global_func("vm.builtin.memory_manager.clear")
    clear()
    gc.collect()
    _libc.malloc_trim(0)
    before = _rss()
    out = vm["main"](*args)
    grown = _rss() - before
    del out
    clear()
    return grown


def profile(vm, args, hashes: dict[str, str], *, runs: int) -> dict[str, float]:
    """Median ms per run of each kernel (by structural hash) over `runs` instrumented runs."""
    from ..tune.judge import timed_kernel_calls
    per_run = []
    for _ in range(runs):
        totals: dict[str, float] = {}
        for symbol, seconds in timed_kernel_calls(vm, "main", args):
            key = kernel_key(symbol, hashes)
            totals[key] = totals.get(key, 0.0) + 1e3 * seconds
        per_run.append(totals)
    return {h: float(np.median([r[h] for r in per_run])) for h in per_run[0]}


def position_work(kernels: dict[str, float], baseline: dict[str, float], names: dict[str, str]) -> dict:
    """The encoding's kernels against the baseline's: what it adds minus what it replaces."""
    added = {h: ms for h, ms in kernels.items() if h not in baseline}
    replaced = {h: ms for h, ms in baseline.items() if h not in kernels}
    total = sum(kernels.values())
    work = sum(added.values()) - sum(replaced.values())
    return {"kernels_ms": total, "position_ms": work, "position_share": work / total if total else None,
            "added": sorted(((names.get(h, h), round(ms, 4)) for h, ms in added.items()), key=lambda kv: -kv[1]),
            "replaced": sorted(((names.get(h, h), round(ms, 4)) for h, ms in replaced.items()), key=lambda kv: -kv[1])}


def measure(graphs: dict[str, str], *, baseline: str, settings: CpuSettings, work_dir: Path,
            log: Callable[[str], None]) -> dict:
    """The llvm section's numbers (see the module docstring), as plain JSON-able data."""
    from ..run.local import InputError
    from ..threads import set_threads
    set_threads(settings.threads)
    built = build_bundles(graphs, work_dir=work_dir, log=log)
    runners = {name: Runner(b["bundle"]) for name, b in built.items()}
    hashes = {name: kernel_hashes(source) for name, source in graphs.items()}
    kernel_names = {h: n for name in graphs for n, h in hashes[name].items()}
    rng = np.random.default_rng(0)
    latency, memory, profiles = [], [], []
    d = built[baseline]["bundle"].manifest["inputs"][0]["dims"][-1]
    for batch in settings.batches:
        for seq in settings.lengths:
            x = rng.standard_normal((batch, seq, d)).astype(np.float32)
            args, refused = {}, {}
            for name, runner in runners.items():
                try:
                    args[name] = runner.args(x)
                except InputError as err:
                    refused[name] = str(err)
            log(f"  llvm: B={batch} T={seq}: timing {len(args)} encoder(s) round-robin"
                f"{' (refused: ' + ', '.join(refused) + ')' if refused else ''}")
            # the memory run from an empty pool is also each encoder's warm-up run
            grown = {n: run_memory(runners[n].vm, args[n]) for n in args}
            times = interleave({n: (lambda r=runners[n], a=args[n]: r.vm["main"](*a)) for n in args},
                               repeat=settings.repeat, min_time_s=settings.min_time_s,
                               max_time_s=settings.max_time_s, warmup=0)
            for name in runners:
                cell = {"graph": name, "batch": batch, "seq": seq}
                if name in refused:
                    latency.append({**cell, "ok": False, "error": refused[name]})
                    continue
                latency.append({**cell, "ok": True, **summarize(times[name])})
                memory.append({**cell, "run_bytes": grown[name]})
            if batch == settings.profile_batch and baseline in args:
                base = profile(runners[baseline].profile_vm, args[baseline], hashes[baseline],
                               runs=settings.profile_runs)
                for name in args:
                    kernels = base if name == baseline else profile(runners[name].profile_vm, args[name],
                                                                    hashes[name], runs=settings.profile_runs)
                    profiles.append({"graph": name, "batch": batch, "seq": seq,
                                     **position_work(kernels, base, kernel_names)})
    return {"builds": {n: {"build_s": b["build_s"], "model_onnx_bytes": b["bundle"].file("model.onnx").stat().st_size,
                           "model_so_bytes": b["bundle"].file("model.so").stat().st_size} for n, b in built.items()},
            "latency": latency, "memory": memory, "profile": profiles, "bundles": {n: str(b["bundle"].path) for n, b in built.items()}}

