"""run_local checks inputs against the manifest before anything runs."""

from __future__ import annotations

import os

import numpy as np
import pytest

from portable_pe.run.local import InputError, run_local


def good_inputs(length=5, batch=1):
    rng = np.random.default_rng(0)
    return {"x": rng.standard_normal((batch, length, 64)).astype(np.float32),
            "positions": np.arange(length, dtype=np.int64)}


def test_runs_and_names_outputs(tiny_bundle):
    out = run_local(tiny_bundle, good_inputs(length=9, batch=2))
    assert list(out) == ["hidden"] and out["hidden"].shape == (2, 9, 64) and out["hidden"].dtype == np.float32


@pytest.mark.parametrize("change,message", [
    (lambda i: i.pop("positions"), r"missing \['positions'\]"),
    (lambda i: i.update(extra=np.zeros(1)), r"unexpected \['extra'\]"),
    (lambda i: i.update(x=i["x"].astype(np.float64)), "'x' must be float32, got float64"),
    (lambda i: i.update(positions=i["positions"].astype(np.int32)), "'positions' must be int64"),
    (lambda i: i.update(x=i["x"][0]), r"'x' must have rank 3 \['batch', 'seq', 64\]"),
    (lambda i: i.update(x=np.zeros((1, 5, 32), np.float32)), "'x' axis 2 must be 64, got 32"),
    (lambda i: i.update(positions=np.arange(6)), "dim 'seq' is 5 in one input and 6"),
    (lambda i: i.update(x=np.zeros((1, 2000, 64), np.float32), positions=np.arange(2000)), "seq in 1..1024"),
])
def test_bad_inputs_are_named(tiny_bundle, change, message):
    inputs = good_inputs()
    change(inputs)
    with pytest.raises(InputError, match=message):
        run_local(tiny_bundle, inputs)


def test_sequence_longer_than_learned_table(bundle_factory):
    bundle = bundle_factory("learned")
    x = np.zeros((1, 513, 256), np.float32)
    with pytest.raises(InputError, match="learned position table of 512 rows"):
        run_local(bundle, {"x": x, "positions": np.arange(513)})
    with pytest.raises(InputError, match="values must lie in 0..511"):
        run_local(bundle, {"x": x[:, :10], "positions": np.arange(10) + 600})


# ----------------------------------------------------------------- TVM's thread pool
# Expected counts come from /proc/cpuinfo and from cgroup files read or written by this
# file, never from portable_pe.threads (which reads the sysfs topology). The pool is
# observed in a fresh process that has run a bundle, not after an import.
_RUN_AND_COUNT = """
import sys
import numpy as np
import tvm
from portable_pe.bundle.artifact import load_bundle
from portable_pe.run.local import run_local
run_local(load_bundle(sys.argv[1]), {"x": np.zeros((1, 4, 64), np.float32), "positions": np.arange(4)})
print(tvm.get_global_func("runtime.NumThreads")())
"""


def cpuinfo_cores() -> int:
    """Distinct (physical id, core id) pairs of the CPUs this process may run on, as
    /proc/cpuinfo lists them (two hardware threads of one core share the pair)."""
    from pathlib import Path
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        pytest.skip("no /proc/cpuinfo on this system")
    allowed, pairs = os.sched_getaffinity(0), set()
    for block in text.strip().split("\n\n"):
        fields = dict(line.split(":", 1) for line in block.splitlines() if ":" in line)
        fields = {k.strip(): v.strip() for k, v in fields.items()}
        if "physical id" not in fields or "core id" not in fields:
            pytest.skip("/proc/cpuinfo names no physical id / core id here (e.g. an arm VM)")
        if int(fields["processor"]) in allowed:
            pairs.add((fields["physical id"], fields["core id"]))
    return len(pairs)


def own_cgroup_quota() -> int | None:
    """This process's cgroup CPU limit, read here (v2 cpu.max, else v1), in whole CPUs rounded up."""
    import math
    from pathlib import Path
    root = Path("/sys/fs/cgroup")
    try:
        quota, period = (root / "cpu.max").read_text().split()
    except (OSError, ValueError):
        try:
            quota, period = ((root / "cpu" / f).read_text().strip() for f in ("cpu.cfs_quota_us", "cpu.cfs_period_us"))
        except OSError:
            return None
    if quota in ("max", "-1"):
        return None
    return math.ceil(int(quota) / int(period))


def pool_after_running_a_bundle(bundle, **env_overrides) -> int:
    """TVM's pool size in a fresh process that has just run `bundle`."""
    import subprocess
    import sys
    from pathlib import Path
    env = {k: v for k, v in os.environ.items() if k not in ("TVM_NUM_THREADS", "OMP_NUM_THREADS")}
    env.update(env_overrides)
    out = subprocess.run([sys.executable, "-c", _RUN_AND_COUNT, str(bundle.path)], env=env, capture_output=True,
                         text=True, cwd=Path(__file__).resolve().parent.parent)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.split()[-1])


def test_physical_cores_are_the_distinct_cores_of_proc_cpuinfo():
    from portable_pe.threads import physical_cores
    assert physical_cores() == cpuinfo_cores() >= 1


def test_tvm_pool_uses_every_physical_core(tiny_bundle):
    """TVM alone sizes its pool at half the logical CPUs on x86 (it assumes SMT): one
    thread on a 2-core VM without SMT. A process that runs a bundle uses every core
    (or the container's quota, when lower)."""
    quota = own_cgroup_quota()
    assert pool_after_running_a_bundle(tiny_bundle) == min(cpuinfo_cores(), quota or 10**6)


def test_tvm_pool_keeps_the_users_thread_count(tiny_bundle):
    assert pool_after_running_a_bundle(tiny_bundle, TVM_NUM_THREADS="1") == 1
    assert pool_after_running_a_bundle(tiny_bundle, OMP_NUM_THREADS="1") == 1


def test_a_quota_of_one_and_a_half_cpus_gives_two_threads(tmp_path, monkeypatch):
    """docker --cpus=1.5 writes cpu.max "150000 100000": two threads (never more than the
    cores), not one."""
    from portable_pe import threads
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    read_quota = threads.cpu_quota
    monkeypatch.setattr(threads, "cpu_quota", lambda root=str(tmp_path): read_quota(root))
    monkeypatch.delenv("TVM_NUM_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    threads.default_tvm_threads()
    assert os.environ["TVM_NUM_THREADS"] == str(min(cpuinfo_cores(), 2))


@pytest.mark.parametrize("files,cpus", [
    ({"cpu.max": "max 100000\n"}, None),
    ({"cpu.max": "150000 100000\n"}, 2),  # docker --cpus=1.5: two threads, not one
    ({"cpu.max": "50000 100000\n"}, 1),
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
    ({"cpu/cpu.cfs_quota_us": "300000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 3),
    ({}, None),
])
def test_a_containers_cpu_quota_is_read_from_cgroup_v1_and_v2(tmp_path, files, cpus):
    from portable_pe.threads import cpu_quota
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cpu_quota(str(tmp_path)) == cpus


def test_the_pool_default_is_the_smaller_of_cores_and_quota(monkeypatch):
    from portable_pe import threads
    for quota, want in ((None, "8"), (3, "3"), (16, "8")):
        monkeypatch.delenv("TVM_NUM_THREADS", raising=False)
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        monkeypatch.setattr(threads, "physical_cores", lambda: 8)
        monkeypatch.setattr(threads, "cpu_quota", lambda quota=quota: quota)
        threads.default_tvm_threads()
        assert threads.os.environ["TVM_NUM_THREADS"] == want, quota
