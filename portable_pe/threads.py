"""Thread control shared by everything that times code (bench, tune's recheck, scripts).

A leaf module: timing code in several places sets the same pools the same way.
"""

from __future__ import annotations

import os

#: threads per engine when timing (the 2-core machines this project is measured on)
DEFAULT_THREADS = 2


def physical_cores() -> int:
    """Cores (not hardware threads) among the CPUs this process may run on.

    Linux sysfs names each CPU's package and core; two hardware threads of one core
    share both. Elsewhere, or when sysfs is not readable, every logical CPU counts."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
    cores = set()
    for cpu in cpus:
        topology = f"/sys/devices/system/cpu/cpu{cpu}/topology"
        try:
            with open(f"{topology}/physical_package_id") as package, open(f"{topology}/core_id") as core:
                cores.add((package.read().strip(), core.read().strip()))
        except OSError:
            return len(cpus)
    return len(cores) or len(cpus)


def cpu_quota(cgroup_root: str = "/sys/fs/cgroup") -> int | None:
    """CPUs' worth of time the process's cgroup may use (a container's `--cpus`), rounded
    up, or None when unlimited or unknown. cgroup v2 writes "QUOTA PERIOD" (or "max
    PERIOD") in cpu.max; v1 has cpu.cfs_quota_us (-1: unlimited) and cpu.cfs_period_us."""
    def read(name):
        with open(os.path.join(cgroup_root, name)) as f:
            return f.read().split()
    try:
        quota, period = read("cpu.max")
    except (OSError, ValueError):
        try:
            quota, period = read("cpu/cpu.cfs_quota_us")[0], read("cpu/cpu.cfs_period_us")[0]
        except (OSError, IndexError):
            return None
    try:
        quota, period = int(quota), int(period)
    except ValueError:  # "max": unlimited
        return None
    if quota <= 0 or period <= 0:
        return None
    return max(1, -(-quota // period))


def default_tvm_threads() -> None:
    """Size TVM's thread pool by physical cores unless the user chose (TVM_NUM_THREADS or
    OMP_NUM_THREADS, which TVM reads).

    On x86 TVM 0.27 sizes its pool at half the logical CPUs, assuming two hyper-threads
    per core, and runtime.config_threadpool cannot grow the pool afterwards. On a 2-core
    VM without SMT (this project's CI machines) that is one thread: a Llama-style export
    ran in 4.7 ms on it and 2.7 ms on two. The pool reads the variable when it is
    created, at the first parallel kernel, so portable_pe calls this where it first runs
    TVM code (compile_graph and prepare, LocalRunner), not when it is imported: importing
    the package leaves the environment alone. A cgroup CPU quota (``docker --cpus``)
    lowers the count further."""
    if "TVM_NUM_THREADS" not in os.environ and "OMP_NUM_THREADS" not in os.environ:
        # a container limited to fewer CPUs than it sees: more threads than its quota
        # only queue behind each other (and a parallel kernel waits for the slowest)
        cores = physical_cores()
        os.environ["TVM_NUM_THREADS"] = str(min(cores, cpu_quota() or cores))


def set_threads(n: int, *, passive: bool = True) -> dict[str, int]:
    """One thread count for every engine, and (``passive``) idle workers that sleep instead of spin.

    Engines timed in turn on the same cores fight when the previous engine's pool still
    spins (here a 1 ms torch call took 170 ms after TVM and onnxruntime runs), so every
    pool waits passively: OMP_WAIT_POLICY for torch/inductor (libgomp reads it when it
    loads, so this must run before torch is imported to count), TVM_THREAD_POOL_SPIN_COUNT
    for TVM, allow_spinning=0 for onnxruntime (ort_engine). TVM pins its workers to cores
    by default, and a pinned worker cannot leave a core that another process is using (on a
    shared 2-core machine the TIR RoPE kernel ran at 43% of copy bandwidth pinned, 88%
    unpinned, same minute): TVM_BIND_THREADS=0 leaves placement to the OS as for the other
    engines. TVM_NUM_THREADS only counts before TVM's pool starts; runtime.config_threadpool
    resizes it at any time.

    ``passive=False`` leaves each pool's idle policy at its default (onnxruntime's is the
    caller's: ort_session(spin=...)); the bench's default mode, which times engines in
    blocks so that a spinning pool only competes with itself."""
    os.environ.update({"TVM_NUM_THREADS": str(n), "OMP_NUM_THREADS": str(n), "TVM_BIND_THREADS": "0"})
    if passive:
        os.environ.update({"OMP_WAIT_POLICY": "PASSIVE", "TVM_THREAD_POOL_SPIN_COUNT": "0"})
    import torch
    import tvm
    torch.set_num_threads(n)
    tvm.get_global_func("runtime.config_threadpool")(1, n)  # 1: big cores first
    return {"torch": torch.get_num_threads(), "tvm": int(tvm.get_global_func("runtime.NumThreads")()),
            "onnxruntime": n}
