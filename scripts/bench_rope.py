"""RoPE as one kernel against the memory-bandwidth limit.

    out = concat(x1*cos - x2*sin, x2*cos + x1*sin)    x: (B, H, T, Dh) fp32, x1/x2 its halves,
                                                       cos/sin: (T, Dh/2) precomputed tables

Engines: a plain copy of x (numpy copyto, and a parallel TVM copy kernel) as the bandwidth
reference; TVM as hand-scheduled TIR and as a Relax function through portable_pe's llvm
pipeline; onnxruntime's standard RotaryEmbedding (opset 23); PyTorch eager; torch.compile.
Every engine is checked against a float64 numpy reference before it is timed, then all
are timed round-robin (portable_pe.bench.interleave).

    python scripts/bench_rope.py [--batch 1 --heads 8 --length 32768 --head-dim 64]
                                 [--threads 2 --repeat 20 --min-time 2 --json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from portable_pe.bench.graph import interleave, summarize
from portable_pe.threads import set_threads  # noqa: E402

COPIES = ("copy numpy", "copy tvm")
PEER = "onnxruntime"
ATOL = 1e-4
#: T rows per parallel block: every head reuses the block's table rows (1 MiB of cos+sin at
#: Dh=64, within L2) and reads 1 MiB runs of x; measured here against 1024/2048/8192-row
#: blocks, 4096 came closest to the copy kernel (91% vs 84-88%, same interleaved run).
T_BLOCK = 4096


@dataclass(frozen=True)
class Shape:
    batch: int = 1
    heads: int = 8
    length: int = 32768
    head_dim: int = 64

    @property
    def x(self) -> tuple[int, int, int, int]:
        return (self.batch, self.heads, self.length, self.head_dim)

    @property
    def half(self) -> int:
        return self.head_dim // 2


def make_data(shape: Shape, *, base: float = 10000.0, seed: int = 0):
    """x (B, H, T, Dh) standard normal; cos, sin (T, Dh/2) float32; the float64 reference."""
    x = np.random.default_rng(seed).standard_normal(shape.x).astype(np.float32)
    inv_freq = base ** (-np.arange(shape.half, dtype=np.float64) / shape.half)
    angles = np.arange(shape.length, dtype=np.float64)[:, None] * inv_freq[None]  # (T, Dh/2)
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    x1, x2 = x[..., :shape.half].astype(np.float64), x[..., shape.half:].astype(np.float64)
    c, s = cos.astype(np.float64), sin.astype(np.float64)
    expected = np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)
    return x, cos, sin, expected


# ------------------------------------------------------------------------------- engines
# make(shape, threads) -> prepare(x, cos, sin) -> (run, fetch); run() is timed.

def copy_numpy(shape, threads):
    def prepare(x, cos, sin):
        dst = np.empty_like(x)
        return (lambda: np.copyto(dst, x)), (lambda _: dst)
    return prepare


def _target():
    import tvm
    return tvm.target.Target({"kind": "llvm", "mcpu": tvm.target.codegen.llvm_get_system_cpu()})


def copy_tvm(shape, threads):
    import tvm
    from tvm.script import tirx as T
    n = int(np.prod(shape.x))
    lanes = 16

    @T.prim_func
    def copy(x: T.Buffer((n,), "float32"), o: T.Buffer((n,), "float32")):
        T.func_attr({"global_symbol": "copy", "tirx.noalias": True})
        for r in T.parallel((n + 1023) // 1024):
            for j in range(1024 // lanes):
                for i in T.vectorized(lanes):
                    if r * 1024 + j * lanes + i < n:
                        o[r * 1024 + j * lanes + i] = x[r * 1024 + j * lanes + i]
    fn = tvm.compile(tvm.IRModule({"copy": copy}), target=_target())["copy"]

    def prepare(x, cos, sin):
        src, dst = tvm.runtime.tensor(x.reshape(-1)), tvm.runtime.empty((n,), "float32", tvm.cpu())
        return (lambda: fn(src, dst)), (lambda _: dst.numpy().reshape(x.shape))
    return prepare


def rope_tir(shape: Shape, *, threads: int):
    """Parallel over T blocks (at least 4 per thread); inside, every head reuses the block's
    cos/sin rows from cache; Dh/2 lanes vectorized; both halves of a row written in one
    loop nest (no concat)."""
    from tvm.script import tirx as T
    bh, n, d, half = shape.batch * shape.heads, shape.length, shape.head_dim, shape.half
    tb = max(1, min(T_BLOCK, -(-n // (4 * threads))))

    @T.prim_func
    def rope(x: T.Buffer((bh, n, d), "float32"), c: T.Buffer((n, half), "float32"),
             s: T.Buffer((n, half), "float32"), o: T.Buffer((bh, n, d), "float32")):
        T.func_attr({"global_symbol": "rope", "tirx.noalias": True})
        for blk in T.parallel((n + tb - 1) // tb):
            for h in range(bh):
                for tt in range(tb):
                    if blk * tb + tt < n:
                        for i in T.vectorized(half):
                            o[h, blk * tb + tt, i] = (x[h, blk * tb + tt, i] * c[blk * tb + tt, i]
                                                      - x[h, blk * tb + tt, i + half] * s[blk * tb + tt, i])
                            o[h, blk * tb + tt, i + half] = (x[h, blk * tb + tt, i + half] * c[blk * tb + tt, i]
                                                             + x[h, blk * tb + tt, i] * s[blk * tb + tt, i])
    return rope


def tvm_tir(shape, threads):
    import tvm
    fn = tvm.compile(tvm.IRModule({"rope": rope_tir(shape, threads=threads)}), target=_target())["rope"]
    flat = (shape.batch * shape.heads, shape.length, shape.head_dim)

    def prepare(x, cos, sin):
        args = [tvm.runtime.tensor(a) for a in (x.reshape(flat), cos, sin)]
        out = tvm.runtime.empty(flat, "float32", tvm.cpu())
        return (lambda: fn(*args, out)), (lambda _: out.numpy().reshape(x.shape))
    return prepare


def tvm_relax(shape, threads):
    """RoPE as the model compiler sees it (slice, mul, sub/add, concat), built with
    portable_pe's llvm pipeline."""
    import tvm
    from tvm import relax
    from tvm.script import relax as R
    from portable_pe.backends import llvm
    x = relax.Var("x", R.Tensor(shape.x, "float32"))
    c = relax.Var("cos", R.Tensor((shape.length, shape.half), "float32"))
    s = relax.Var("sin", R.Tensor((shape.length, shape.half), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, c, s]):
        with bb.dataflow():
            x1 = bb.emit(relax.op.strided_slice(x, axes=[3], begin=[0], end=[shape.half]))
            x2 = bb.emit(relax.op.strided_slice(x, axes=[3], begin=[shape.half], end=[shape.head_dim]))
            lo = bb.emit(relax.op.subtract(relax.op.multiply(x1, c), relax.op.multiply(x2, s)))
            hi = bb.emit(relax.op.add(relax.op.multiply(x2, c), relax.op.multiply(x1, s)))
            out = bb.emit_output(relax.op.concat([lo, hi], axis=-1))
        bb.emit_func_output(out)
    target = _target()
    ex = tvm.compile(bb.get(), target=target, relax_pipeline=llvm.relax_pipeline(target))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    main = vm["main"]

    def prepare(x, cos, sin):
        args = [tvm.runtime.tensor(a) for a in (x, cos, sin)]
        return (lambda: main(*args)), (lambda out: out.numpy())
    return prepare


def onnxruntime_rope(shape, threads):
    """The standard RotaryEmbedding op (opset 23): x (B, H, T, Dh), cos/sin caches
    (B, T, Dh/2) when no position_ids are given (B=1 here: the same bytes as (T, Dh/2))."""
    import onnx
    from onnx import TensorProto, helper
    from portable_pe.compile.simplify import ort_session
    cache = [shape.batch, shape.length, shape.half]
    graph = helper.make_graph(
        [helper.make_node("RotaryEmbedding", ["x", "cos", "sin"], ["y"], interleaved=0)], "rope",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape.x)),
         helper.make_tensor_value_info("cos", TensorProto.FLOAT, cache),
         helper.make_tensor_value_info("sin", TensorProto.FLOAT, cache)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape.x))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)], ir_version=10)
    onnx.checker.check_model(model)
    session = ort_session(model, threads=threads, spin=False)

    def prepare(x, cos, sin):
        feeds = {"x": x, "cos": np.ascontiguousarray(np.broadcast_to(cos, cache)),
                 "sin": np.ascontiguousarray(np.broadcast_to(sin, cache))}
        return (lambda: session.run(["y"], feeds)), (lambda out: out[0])
    return prepare


def _torch_rope(x, cos, sin):
    import torch
    x1, x2 = x.chunk(2, dim=-1)  # (B, H, T, Dh/2) each
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def torch_rope(shape, threads, *, compiled=False):
    import torch
    fn = torch.compile(_torch_rope, dynamic=False) if compiled else _torch_rope

    def prepare(x, cos, sin):
        args = [torch.from_numpy(a) for a in (x, cos, sin)]

        def run():
            with torch.inference_mode():
                return fn(*args)
        return run, (lambda out: out.numpy())
    return prepare


ENGINES = {
    "copy numpy": copy_numpy,
    "copy tvm": copy_tvm,
    "tvm (TIR)": tvm_tir,
    "tvm (Relax, portable_pe pipeline)": tvm_relax,
    "onnxruntime": onnxruntime_rope,
    "torch": torch_rope,
    "torch.compile": lambda shape, threads: torch_rope(shape, threads, compiled=True),
}


# ------------------------------------------------------------------------------- bench
@dataclass
class Row:
    engine: str
    max_abs_err: float | None = None
    median_ms: float | None = None
    iqr_ms: float | None = None
    runs: int = 0
    gbps: float | None = None          # (x + out) / median
    gbps_tables: float | None = None   # (x + out + cos + sin) / median
    of_copy: float | None = None       # gbps / best copy gbps
    error: str = ""


def check_engines(shape: Shape, *, threads: int, engines=ENGINES, seed: int = 0):
    """Build every engine, run it once and compare with the float64 reference.
    Returns ({name: run} of the engines that passed, {name: Row})."""
    x, cos, sin, expected = make_data(shape, seed=seed)
    runs, rows = {}, {}
    for name, make in engines.items():
        row = rows[name] = Row(name)
        try:
            run, fetch = make(shape, threads)(x, cos, sin)
            got = np.asarray(fetch(run()))
        except Exception as err:  # an engine that can't run is a row, not a crash
            row.error = f"{type(err).__name__}: {str(err).strip().splitlines()[-1] if str(err).strip() else ''}"[:160]
            continue
        ref = x if name in COPIES else expected
        if got.shape != ref.shape:
            row.error = f"shape {got.shape}, expected {ref.shape}"
            continue
        row.max_abs_err = float(np.max(np.abs(got.astype(np.float64) - ref)))
        if row.max_abs_err >= ATOL:
            row.error = f"max abs err {row.max_abs_err:.2e} >= {ATOL:g}"
            continue
        runs[name] = run
    return runs, rows


def bench_rope(shape: Shape = Shape(), *, threads: int = 2, repeat: int = 20, min_time_s: float = 2.0,
               max_time_s: float = 60.0, warmup: int = 3, log=print) -> dict:
    resolved = set_threads(threads)
    io_bytes = 2 * int(np.prod(shape.x)) * 4
    table_bytes = 2 * shape.length * shape.half * 4
    log(f"rope kernel: x {shape.x} fp32, tables 2x({shape.length}, {shape.half}); threads {resolved}; "
        f"bytes x+out {io_bytes / 2**20:.0f} MiB (+ tables {table_bytes / 2**20:.1f} MiB); "
        f">= {repeat} runs and >= {min_time_s:g} s, {warmup} warm-up")
    runs, rows = check_engines(shape, threads=threads)
    log("checked: " + ", ".join(f"{n} {'ok' if n in runs else rows[n].error}" for n in rows))
    times = interleave(runs, repeat=repeat, min_time_s=min_time_s, max_time_s=max_time_s, warmup=warmup)
    for name, seconds in times.items():
        row = rows[name]
        stats = summarize(seconds)
        row.median_ms, row.iqr_ms, row.runs = stats["median_ms"], stats["iqr_ms"], stats["runs"]
        row.gbps = io_bytes / row.median_ms / 1e6
        row.gbps_tables = row.gbps if name in COPIES else (io_bytes + table_bytes) / row.median_ms / 1e6
    best_copy = max((rows[c].gbps for c in COPIES if rows[c].gbps), default=None)
    for row in rows.values():
        if row.gbps and best_copy:
            row.of_copy = row.gbps / best_copy
    tvm, ort = rows["tvm (TIR)"], rows[PEER]
    return {"shape": asdict(shape), "threads": resolved, "bytes": {"x_out": io_bytes, "tables": table_bytes},
            "rows": [asdict(r) for r in rows.values()],
            "tvm_over_ort_speed": ort.median_ms / tvm.median_ms if tvm.median_ms and ort.median_ms else None}


def to_markdown(result: dict) -> str:
    s = result["shape"]
    lines = [f"### RoPE kernel: B={s['batch']} H={s['heads']} T={s['length']} Dh={s['head_dim']} fp32, "
             f"{result['threads']['tvm']} thread(s)", "",
             "| engine | median ms ± IQR | GB/s x+out | GB/s +tables | of best copy | max abs err |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        if r["error"] or r["median_ms"] is None:
            lines.append(f"| {r['engine']} | {r['error'] or 'not timed'} | | | | |")
            continue
        lines.append(f"| {r['engine']} | {r['median_ms']:.2f} ± {r['iqr_ms']:.2f} | {r['gbps']:.1f} | "
                     f"{r['gbps_tables']:.1f} | {r['of_copy']:.0%} | {r['max_abs_err']:.1e} |")
    ratio = result["tvm_over_ort_speed"]
    lines += ["", f"TVM (TIR) vs onnxruntime: {ratio:.2f}x the speed" if ratio else "TVM/ORT: n/a"]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--length", type=int, default=32768)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--min-time", type=float, default=2.0, help="seconds of timing at least")
    p.add_argument("--json", type=Path, help="also write the result as JSON")
    args = p.parse_args(argv)
    if args.head_dim % 2:
        p.error("--head-dim must be even")
    result = bench_rope(Shape(args.batch, args.heads, args.length, args.head_dim), threads=args.threads,
                        repeat=args.repeat, min_time_s=args.min_time, log=lambda m: print(m, flush=True))
    print(to_markdown(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
        print(f"(JSON written to {args.json})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
