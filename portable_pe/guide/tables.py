"""The guide's position-table section: fp32 against int8 tables (`--pe-tables int8`).

Two views. Materialized: every table an encoding amounts to at a length (sin/cos rows,
the learned table, T5 and ALiBi (H*N, N) biases), as a graph with positions folded to
constants holds them (NPU builds), in fp32 and as int8 rows with per-row scales, with the
error int8 adds (pe_tables.measure). Stored: the tables the dynamic llvm graph keeps
(learned table, T5 bucket table): those encoders are built again with int8 tables and
compared with their fp32 build: model size, output error against PyTorch, and latency,
timed round-robin against the fp32 build.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np


def materialized(specs: dict, lengths: tuple[int, ...]) -> list[dict]:
    from ..quant.tables import measure
    rows = []
    for name, spec in specs.items():
        for seq in lengths:
            if seq > spec.max_length:
                continue
            for row in measure(spec, seq):
                rows.append({**row, "graph": name, "seq": seq})
    return rows


def stored_tables(spec) -> list[dict]:
    """The tables `--pe-tables int8` would quantize in this encoder's llvm graph."""
    from ..compile.export import export_onnx_cached
    from ..quant.tables import quantize_onnx_tables
    model, _ = export_onnx_cached(spec)
    return quantize_onnx_tables(model)[1]


def compare_builds(specs: dict, sources: dict[str, str], fp32_bundles: dict[str, str], *, lengths: tuple[int, ...],
                   threads: int, work_dir: Path, log: Callable[[str], None]) -> list[dict]:
    """fp32 against int8 stored tables, for each encoder that stores any."""
    from ..bundle.artifact import load_bundle
    from ..bench.graph import interleave, summarize
    from ..run.parity import TOLERANCES, compare, torch_reference
    from ..threads import set_threads
    from .cpu import Runner, build_bundles
    set_threads(threads)
    with_tables = {n: s for n, s in specs.items() if stored_tables(s)}
    if not with_tables:
        return []
    built = build_bundles({n: sources[n] for n in with_tables}, work_dir=work_dir, pe_tables="int8", log=log)
    rows = []
    for name, spec in with_tables.items():
        runners = {"fp32": Runner(load_bundle(Path(fp32_bundles[name]))), "int8": Runner(built[name]["bundle"])}
        reference = torch_reference(spec.to_dict())
        row = {"graph": name, "tables": built[name]["bundle"].manifest["pe_tables"]["tables"],
               "model_onnx_bytes": {k: r.bundle.file("model.onnx").stat().st_size for k, r in runners.items()},
               "cells": []}
        for seq in [n for n in lengths if n <= spec.max_length]:
            x = np.random.default_rng(2).standard_normal((1, seq, spec.model.d_model)).astype(np.float32)
            args = {k: r.args(x) for k, r in runners.items()}
            ref = reference({"x": x, "positions": np.arange(seq, dtype=np.int64)})
            cell = {"batch": 1, "seq": seq}
            for k, r in runners.items():
                out = r.vm["main"](*args[k])
                # int8 rows are judged by the int8-table row, as `compile --pe-tables int8` does
                (c,) = compare(ref, {"hidden": (out if hasattr(out, "numpy") else out[0]).numpy()}, name=k,
                               length=seq, tolerance_overrides=None if k == "fp32" else
                               {"float32": dict(TOLERANCES["int8_tables"])})
                cell[f"{k}_max_abs"], cell[f"{k}_ok"] = c.max_abs, c.ok
            times = interleave({k: (lambda r=runners[k], a=args[k]: r.vm["main"](*a)) for k in runners},
                               repeat=5, min_time_s=0.5, max_time_s=20.0, warmup=1)
            for k in runners:
                cell[f"{k}_ms"] = summarize(times[k])["median_ms"]
            row["cells"].append(cell)
        rows.append(row)
    return rows
