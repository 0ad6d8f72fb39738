"""What the CPU pipeline could not do in one build, for the bundle's manifest and the log.

Every rule and rewrite fails safe: a kernel whose schedule raises is left unscheduled (a
serial, scalar loop nest), an attention whose fusion raises stays unfused, a matmul whose
bf16 or int8 lowering raises stays float32; the build still succeeds and still matches
PyTorch. Right for correctness, silent for speed: one TVM API slip in the dense rule
once left every dense of the learned graph unscheduled, about 35 times slower, while the
compile printed PASS. A build records each such failure here; the manifest lists them
("cpu_schedules") and the compile warns.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def error_summary(err: Exception, limit: int = 200) -> str:
    """The first non-empty line of an error (TVM's carry a traceback after it)."""
    line = next((ln.strip() for ln in str(err).splitlines() if ln.strip()), type(err).__name__)
    return line[:limit]


@dataclass
class PipelineFailures:
    """{kernel: why its schedule failed}, and the rewrites kept as they were, with why."""
    unscheduled: dict[str, str] = field(default_factory=dict)
    kept: list[str] = field(default_factory=list)

    def kernel(self, name: str, err: Exception) -> None:
        self.unscheduled[name] = error_summary(err)

    def rewrite(self, what: str, err: Exception) -> None:
        self.kept.append(f"{what}: {error_summary(err)}")

    def __bool__(self) -> bool:
        return bool(self.unscheduled or self.kept)

    def to_manifest(self) -> dict:
        """The manifest's "cpu_schedules" section, or nothing when all went through."""
        if not self:
            return {}
        section = {}
        if self.unscheduled:
            section["unscheduled"] = dict(sorted(self.unscheduled.items()))
        if self.kept:
            section["rewrites_failed"] = sorted(set(self.kept))
        return {"cpu_schedules": section}


def warning_line(section: dict) -> str:
    """One line for the compile's log from the manifest's "cpu_schedules" section."""
    parts = []
    unscheduled = sorted(section.get("unscheduled", {}))
    if unscheduled:
        parts.append(f"{len(unscheduled)} kernel(s) left unscheduled, serial and scalar "
                     f"({', '.join(unscheduled[:4])}{', ...' if len(unscheduled) > 4 else ''})")
    failed = section.get("rewrites_failed", [])
    if failed:
        parts.append(f"{len(failed)} rewrite(s) failed ({failed[0]})")
    return "warning: " + "; ".join(parts) + ": the bundle is correct but slower (manifest: cpu_schedules)"
