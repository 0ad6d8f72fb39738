"""run_local checks inputs against the manifest before anything runs."""

from __future__ import annotations

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
_POOL_SIZE = ("import os, portable_pe, tvm; from portable_pe.threads import physical_cores, cpu_quota; "
              "print(tvm.get_global_func('runtime.NumThreads')(), min(physical_cores(), cpu_quota() or 10**6))")


def _pool_in_fresh_process(**env_overrides):
    import os
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k not in ("TVM_NUM_THREADS", "OMP_NUM_THREADS")}
    env.update(env_overrides)
    out = subprocess.run([sys.executable, "-c", _POOL_SIZE], env=env, capture_output=True, text=True, check=True)
    return [int(x) for x in out.stdout.split()]


def test_tvm_pool_uses_every_physical_core():
    """TVM alone sizes its pool at half the logical CPUs on x86 (it assumes SMT): one
    thread on a 2-core VM without SMT. Importing portable_pe sizes it by cores."""
    pool, cores = _pool_in_fresh_process()
    assert pool == cores >= 1


def test_tvm_pool_keeps_the_users_thread_count():
    assert _pool_in_fresh_process(TVM_NUM_THREADS="1")[0] == 1
    assert _pool_in_fresh_process(OMP_NUM_THREADS="1")[0] == 1


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
