"""Thread control shared by everything that times code (bench, tune's recheck, scripts).

A leaf module: timing code in several places sets the same pools the same way.
"""

from __future__ import annotations

import os

#: threads per engine when timing (the 2-core machines this project is measured on)
DEFAULT_THREADS = 2


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
