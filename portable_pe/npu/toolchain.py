"""NPU vendor compilers, each run in its own virtualenv through a small file contract.

A vendor toolchain (Rockchip RKNN-Toolkit2, Arm Vela, ...) pins versions that clash with
ours (numpy, onnx, protobuf, torch), so it never enters this process.
`bash scripts/npu_toolchain.sh NAME` builds its virtualenv in toolchain_dir(NAME), and
portable-pe runs a worker script with that virtualenv's python:

    work/request.json   written by us: what to build, paths relative to work/
    python WORKER request.json        (cwd = work/, the toolchain's venv python)
    work/result.json    written by the worker: what it built and the vendor's report
    work/worker.log     the worker's stdout and stderr, kept for the user

A worker that crashes (vendor compilers and simulators can segfault), runs past its
timeout or writes no result.json raises VendorError naming the stage, the toolchain and
the last lines of its log; nothing else of ours is touched.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

TOOLCHAIN_DIR_ENV = "PORTABLE_PE_TOOLCHAIN_DIR"
SETUP_SCRIPT = "scripts/npu_toolchain.sh"


class VendorError(RuntimeError):
    """A vendor toolchain stage failed; the message carries the vendor's own words."""


def toolchain_dir(name: str) -> Path:
    base = os.environ.get(TOOLCHAIN_DIR_ENV) or Path.home() / ".cache" / "portable-pe" / "toolchains"
    return Path(base) / name


def toolchain_python(name: str) -> Path | None:
    """The toolchain virtualenv's python, or None when `scripts/npu_toolchain.sh NAME` has
    not completed (its last step writes the `ready` stamp)."""
    root = toolchain_dir(name)
    python = root / "venv" / "bin" / "python"
    return python if python.is_file() and (root / "ready").is_file() else None


def missing_message(name: str) -> str:
    return (f"the {name} toolchain is not installed ({toolchain_dir(name)} has no ready virtualenv); "
            f"set it up with `bash {SETUP_SCRIPT} {name}` (cached; {TOOLCHAIN_DIR_ENV} moves it)")


def _tail(path: Path, lines: int = 12) -> str:
    if not path.is_file():
        return "(no output)"
    text = path.read_text(errors="replace").strip().splitlines()
    return "\n".join(f"    {line}" for line in text[-lines:]) or "(no output)"


def run_worker(name: str, worker: Path, request: dict, *, work_dir: Path, stage: str,
               timeout_s: float = 1800.0, python: Path | None = None) -> dict:
    """Run `worker` with toolchain `name`'s python on `request`; return its result.json.

    `python` overrides the interpreter (tests use this one's). Raises VendorError when the
    toolchain is missing, the worker fails, is killed by a signal, times out, or writes no
    valid result.json.
    """
    python = python or toolchain_python(name)
    if python is None:
        raise VendorError(f"{stage}: {missing_message(name)}")
    work_dir.mkdir(parents=True, exist_ok=True)
    (work_dir / "request.json").write_text(json.dumps(request, indent=2))
    result_path, log_path = work_dir / "result.json", work_dir / "worker.log"
    result_path.unlink(missing_ok=True)
    with open(log_path, "wb") as log:
        try:
            proc = subprocess.run([str(python), str(Path(worker).resolve()), "request.json"], cwd=work_dir,
                                  stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s,
                                  env={**os.environ, "PYTHONPATH": "", "PYTHONNOUSERSITE": "1"})
        except subprocess.TimeoutExpired:
            raise VendorError(f"{stage}: {name} ran past {timeout_s:g} s and was stopped; last output "
                              f"({log_path}):\n{_tail(log_path)}") from None
    if proc.returncode < 0:
        what = signal.Signals(-proc.returncode).name
        raise VendorError(f"{stage}: {name} crashed ({what}); last output ({log_path}):\n{_tail(log_path)}")
    if proc.returncode != 0:
        raise VendorError(f"{stage}: {name} failed (exit {proc.returncode}); last output "
                          f"({log_path}):\n{_tail(log_path)}")
    try:
        return json.loads(result_path.read_text())
    except (OSError, ValueError) as err:
        raise VendorError(f"{stage}: {name} wrote no valid result.json ({err}); last output "
                          f"({log_path}):\n{_tail(log_path)}") from None


def why_no_build(mode: str, toolchain: str, *, blocker: str | None = None) -> str | None:
    """Why no vendor build will be made, or None when it will. `mode` is --vendor-build:
    skip (never), auto and require (when the toolchain is installed and nothing blocks it)."""
    return ("--vendor-build skip" if mode == "skip" else blocker
            or (missing_message(toolchain) if toolchain_python(toolchain) is None else None))


def skipped_build(mode: str, toolchain: str, log, *, blocker: str | None = None) -> dict | None:
    """The manifest's report of a vendor build that is not made, and why, or None when it is
    to be made (why_no_build); with `require`, a build that cannot be made is a VendorError."""
    why = why_no_build(mode, toolchain, blocker=blocker)
    if why is None:
        return None
    if mode == "require":
        raise VendorError(f"{toolchain} build: {why} (--vendor-build require)")
    log(f"  {toolchain}: no vendor build was made: {why}")
    return {"vendor": {"name": toolchain, "built": False, "why": why}}


def vendor_coverage(source: str, *, npu_ops: int, cpu_ops: int) -> dict:
    """The manifest's `npu.coverage` when a vendor's compiler placed the ops (RKNN, Vela)."""
    total = npu_ops + cpu_ops
    return {"source": source, "nodes_total": total, "nodes_npu": npu_ops, "nodes_host": cpu_ops,
            "node_coverage": npu_ops / total if total else 1.0}
