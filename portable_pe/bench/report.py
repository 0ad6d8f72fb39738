"""A bench's results: cells, the Markdown tables, bench.json and the latency plot.

Two tables per graph: float32 (PyTorch, torch.compile, onnxruntime, OpenVINO, TVM) with
ratios to onnxruntime and TVM's ratio to the better of onnxruntime and OpenVINO; and
int8 (the int8 bundle on onnxruntime, OpenVINO and TVM) with ratios to onnxruntime's
int8, TVM int8's ratio to TVM float32, and each engine's accuracy against PyTorch fp32.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .engines import ENGINES, INT8_ENGINES, PEERS, precision_of


@dataclass
class Cell:
    engine: str
    batch: int
    length: int
    median_ms: float | None = None
    iqr_ms: float | None = None
    runs: int = 0
    ratio_vs_peer: float | None = None  # latency / its table's peer (PEERS)
    max_abs: float | None = None
    cosine: float | None = None         # against PyTorch eager float32
    ok: bool | None = None
    first_run_s: float | None = None  # includes torch.compile's compile
    error: str = ""

    def text(self) -> str:
        if self.error:
            return self.error
        ratio = f" ({self.ratio_vs_peer:.2f}x)" if self.ratio_vs_peer is not None else ""
        return f"{_ms(self.median_ms)} ± {_ms(self.iqr_ms)}{ratio}{'' if self.ok is not False else ' MISMATCH'}"


def _ms(value: float) -> str:
    return f"{value:.3f}" if value < 1 else f"{value:.2f}" if value < 100 else f"{value:.0f}"


def _ratio(a: Cell | None, b: Cell | None) -> str:
    if a is None or b is None or not a.median_ms or not b.median_ms:
        return ""
    return f"{a.median_ms / b.median_ms:.2f}"


@dataclass
class BenchResult:
    graph: str
    settings: dict
    environment: dict
    cells: list[Cell] = field(default_factory=list)

    def engines(self, precision: str) -> list[str]:
        return [e for e in ENGINES if e in self.settings.get("engines", ENGINES) and precision_of(e) == precision]

    def cell(self, engine: str, b: int, t: int) -> Cell | None:
        return next((c for c in self.cells if c.engine == engine and c.batch == b and c.length == t), None)

    def _rows(self):
        return [(b, t) for b in self.settings["batches"] for t in self.settings["lengths"]]

    def to_markdown(self) -> str:
        mode = self.settings.get("pool", "default")
        head = (f"{self.settings['threads']} thread(s), pools {mode}"
                f"{' (onnxruntime spinning, engines timed in alternating blocks)' if mode == 'default' else ' (idle workers sleep)'}")
        parts = []
        fp32 = self.engines("fp32")
        if fp32:
            extra = self._peer_columns()
            parts.append(self._table(f"### bench: {self.graph}, float32, {head}; median ms ± IQR (latency / {PEERS['fp32']})",
                                     fp32, extra, self._best_peer_ratio))
        int8 = self.engines("int8")
        if int8:
            extra = ["tvm-int8 / tvm"] if "tvm-int8" in int8 and "tvm" in self.settings.get("engines", ()) else []
            parts.append(self._table(f"### bench: {self.graph}, int8, {head}; median ms ± IQR (latency / {PEERS['int8']})",
                                     int8, extra, lambda b, t: [_ratio(self.cell("tvm-int8", b, t), self.cell("tvm", b, t))]))
            parts.append(self._accuracy_table(int8))
        bf16 = self.engines("bf16")
        if bf16:
            ran = self.settings.get("engines", ())
            others = [e for e in ("openvino", "openvino-f32", "tvm") if e in ran]
            # what OpenVINO's default computed in is read from the engine (its precision hint),
            # not assumed: on CPUs without bf16 it is f32, and the bf16 column is then n/a
            computed = self.environment.get("compute_precision", {}).get("openvino", "unknown")
            parts.append(self._table(f"### bench: {self.graph}, bf16, {head}; median ms ± IQR (latency / {PEERS['bf16']}, "
                                     f"its default: {computed} compute on this CPU)", bf16 + others,
                                     [f"tvm-bf16 / {e}" for e in others],
                                     lambda b, t: [_ratio(self.cell("tvm-bf16", b, t), self.cell(e, b, t)) for e in others]))
            parts.append(self._accuracy_table(bf16 + [e for e in ("openvino",) if e in ran], what="bf16"))
        lowered = {e: p for e, p in self.environment.get("compute_precision", {}).items() if p not in ("f32", "fp32")}
        if lowered:
            parts.append("Computed below float32 at the engine's defaults on this CPU: " +
                         ", ".join(f"{e} in {p}" for e, p in lowered.items()) + " (INFERENCE_PRECISION_HINT).")
        return "\n\n".join(parts)

    def _table(self, title, engines, extra, extra_cells) -> str:
        lines = [title, "", "| B | T | " + " | ".join(engines + extra) + " |", "|---:|---:|" + "---|" * len(engines + extra)]
        for b, t in self._rows():
            row = [self.cell(e, b, t).text() if self.cell(e, b, t) else "" for e in engines]
            lines.append(f"| {b} | {t} | " + " | ".join(row + (extra_cells(b, t) if extra else [])) + " |")
        return "\n".join(lines)

    def _best_peer_ratio(self, b, t) -> list[str]:
        """tvm / the faster of onnxruntime and OpenVINO at its defaults (bf16 compute on bf16
        CPUs), and, where it ran, tvm / the faster of onnxruntime and OpenVINO in f32."""
        out = []
        for column in self._peer_columns():
            openvino = "openvino-f32" if column.endswith("openvino-f32)") else "openvino"
            peers = [c for c in (self.cell("onnxruntime", b, t), self.cell(openvino, b, t)) if c and c.median_ms]
            out.append(_ratio(self.cell("tvm", b, t), min(peers, key=lambda c: c.median_ms)) if peers else "")
        return out

    def _peer_columns(self) -> list[str]:
        engines = set(self.engines("fp32"))
        return (["tvm / best(onnxruntime, openvino)"] if {"tvm", "onnxruntime", "openvino"} <= engines else []) + \
            (["tvm / best(onnxruntime, openvino-f32)"] if {"tvm", "onnxruntime", "openvino-f32"} <= engines else [])

    def _accuracy_table(self, engines, what: str = "int8") -> str:
        lines = [f"{what} accuracy against PyTorch float32: cosine (max abs error)", "",
                 "| B | T | " + " | ".join(engines) + " |", "|---:|---:|" + "---|" * len(engines)]
        for b, t in self._rows():
            row = []
            for e in engines:
                c = self.cell(e, b, t)
                row.append(f"{c.cosine:.6f} ({c.max_abs:.3g})" if c and c.cosine is not None else "")
            lines.append(f"| {b} | {t} | " + " | ".join(row) + " |")
        return "\n".join(lines)

    def to_json(self) -> str:
        return json.dumps({"graph": self.graph, "settings": self.settings, "environment": self.environment,
                           "cells": [asdict(c) for c in self.cells]}, indent=2)

    def plot(self, path: Path) -> None:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        batches = self.settings["batches"]
        fig, axes = plt.subplots(1, len(batches), figsize=(5 * len(batches), 4), squeeze=False)
        for ax, b in zip(axes[0], batches):
            for engine in ENGINES:
                pts = sorted((c.length, c.median_ms, c.iqr_ms) for c in self.cells
                             if c.engine == engine and c.batch == b and c.median_ms is not None)
                if pts:
                    t, med, iqr = zip(*pts)
                    ax.errorbar(t, med, yerr=np.asarray(iqr) / 2, marker="o", capsize=3, label=engine,
                                linestyle="--" if engine in INT8_ENGINES else "-")
            ax.set(xscale="log", yscale="log", xlabel="sequence length T", ylabel="latency (ms)",
                   title=f"{self.graph}, batch {b}, {self.settings['threads']} thread(s)")
            ax.set_xticks(self.settings["lengths"], [str(t) for t in self.settings["lengths"]])
            ax.minorticks_off()
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
