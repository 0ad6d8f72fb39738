"""One NPU report cell of the guide: a job (encoder, length) and the report every vendor
column fills for it, with exactly REPORT_KEYS whatever the vendor (guide/npu.py)."""

from __future__ import annotations

from dataclasses import dataclass

#: every NPU report has exactly these keys, whatever the vendor
REPORT_KEYS = ("column", "graph", "encoding", "seq_len", "ok", "error", "ops_npu", "ops_cpu", "cpu_ops",
               "accuracy", "time_ms", "time_source", "size_bytes", "build_s", "details")


@dataclass(frozen=True)
class NpuJob:
    spec: object        # graphs.GraphSpec
    seq_len: int


def npu_report(*, column: str, job: NpuJob, ok: bool, error: str | None = None, ops_npu: int | None = None,
               ops_cpu: int | None = None, cpu_ops: list[dict] | None = None, accuracy: dict | None = None,
               time_ms: float | None = None, time_source: str | None = None, size_bytes: int | None = None,
               build_s: float | None = None, details: dict | None = None) -> dict:
    """One (column, encoder, length) cell.

    ok/error: whether the vendor built it, and if not why (the vendor's own words, or
    ours when we refuse first, e.g. a length past a learned table). ops_npu/ops_cpu:
    operators placed on the NPU / left to the CPU; cpu_ops: [{op, name, reason}] with the
    vendor's reason for each CPU operator. accuracy: {cosine, max_abs, max_ref, source}
    against PyTorch fp32 (simulator, or reference int8 kernels). time_ms/time_source: the
    vendor's inference time estimate and what made it. size_bytes: the deployable model.
    build_s: wall time of the whole build for this cell. details: vendor-specific numbers."""
    return {"column": column, "graph": job.spec.name, "encoding": job.spec.encoding, "seq_len": job.seq_len,
            "ok": ok, "error": error, "ops_npu": ops_npu, "ops_cpu": ops_cpu, "cpu_ops": list(cpu_ops or []),
            "accuracy": accuracy, "time_ms": time_ms, "time_source": time_source, "size_bytes": size_bytes,
            "build_s": build_s, "details": dict(details or {})}
