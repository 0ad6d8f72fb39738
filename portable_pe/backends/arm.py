"""aarch64 Linux boards: NEON code cross-compiled on the workstation, run on the board.

The board comes from targets/arm.toml's [options.board] table (TVM tags where TVM has
one). The schedules are the host CPU target's, so arm follows whatever llvm does.
"""

from __future__ import annotations

import os
import shutil

import tvm

from . import llvm
from .backend import Backend

#: The cross compiler, overridable (e.g. a clang wrapper, or a toolchain outside PATH).
CROSS_CXX_ENV = "PORTABLE_PE_AARCH64_CXX"
CROSS_CXX = "aarch64-linux-gnu-g++"
CROSS_PACKAGE = "g++-aarch64-linux-gnu"


def cross_compiler() -> str:
    """The aarch64 C++ compiler's path, or a clear error naming the package that has it."""
    name = os.environ.get(CROSS_CXX_ENV) or CROSS_CXX
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"the arm target links model.so with the aarch64 cross compiler `{name}`, "
                           f"which is not on PATH; install it with `apt-get install {CROSS_PACKAGE}` "
                           f"(Debian/Ubuntu) or point {CROSS_CXX_ENV} at one")
    return path


def tvm_target(spec, *, board: str | None = None, num_cores: int | None = None) -> tvm.target.Target:
    # Fail here, before the build, rather than after minutes of compiling.
    cross_compiler()
    boards = spec.options["board"]["choices"]
    board = board or spec.options["board"]["default"]
    if board not in boards:
        raise ValueError(f"unknown board {board!r} for target {spec.name!r}; valid: {', '.join(boards)}")
    if not boards[board]:
        target = tvm.target.Target(dict(spec.tvm))
    else:
        target = tvm.target.Target(boards[board])
        if target.kind.name != "llvm":  # e.g. a Jetson tag is its GPU; its CPU is the host part
            target = target.host
        if target is None or "aarch64" not in str(target.attrs.get("mtriple", "")):
            raise ValueError(f"board {board!r}: TVM tag {boards[board]!r} has no aarch64 CPU target")
    cores = _num_cores(spec, board, target, num_cores)
    if cores is not None:
        target = tvm.target.Target({**target.export(), "num-cores": cores})
    return llvm.with_reassociation(target)


def _num_cores(spec, board: str, target, given) -> int | None:
    """--num-cores, else the tag's own count, else targets/arm.toml's table, else None
    (a compile needs none; MetaSchedule does, and tune says so)."""
    if given is not None:
        if isinstance(given, bool) or not isinstance(given, int) or given < 1:
            raise ValueError(f"--num-cores must be a positive integer (the board's physical cores), got {given!r}")
        return given
    if "num-cores" in target.attrs:
        return int(target.attrs["num-cores"])
    return spec.options["board"].get("num_cores", {}).get(board)


def for_precision(target: tvm.target.Target, spec, precision: str) -> tvm.target.Target:
    """bf16 needs the board's CPU to have FEAT_BF16 (BFMMLA): its TVM tag's CPU decides."""
    from ..cpu_schedule.bf16_isa import bf16_kernel, needed_features
    if precision != "bf16" or bf16_kernel(target) is not None:
        return target
    with_it = [b for b in spec.options["board"]["choices"] if _board_has_bf16(spec, b)]
    raise ValueError(f"--precision bf16 needs an aarch64 CPU with {needed_features('aarch64')} (FEAT_BF16: BFMMLA, BFDOT); this "
                     f"board's CPU ({target.attrs.get('mcpu', 'generic aarch64')}) has none: build fp32 (the "
                     f"default) or --precision int8, or pick a board whose CPU has it "
                     f"(--board {' or '.join(with_it) or 'none listed in targets/arm.toml'})")


def _board_has_bf16(spec, board: str) -> bool:
    from ..cpu_schedule.bf16_isa import bf16_kernel
    tag = spec.options["board"]["choices"][board]
    target = tvm.target.Target(tag) if tag else tvm.target.Target(dict(spec.tvm))
    return bf16_kernel(target.host if target.kind.name != "llvm" else target) is not None


def tuning_variant(options: dict, target) -> str:
    """Tuning databases are per board: targets/tuning/arm/<board>/<graph>/."""
    return options["board"]


def export_library(executable, path, *, target_options: dict | None = None) -> None:
    executable.export_library(str(path), fcompile=tvm.support.cc.cross_compiler(cross_compiler()))


# The schedules are the host CPU target's, so arm follows whatever llvm does.
BACKEND = Backend(name="arm", tvm_target=tvm_target, relax_pipeline=llvm.relax_pipeline,
                  export_library=export_library, precisions=("fp32", "int8", "bf16"), for_precision=for_precision,
                  tuning_variant=tuning_variant)


def cpu_features(target) -> list[str]:
    """The optional aarch64 features (bundle/run_on_board.py HWCAP_OF_FEATURE) that code
    built for ``target`` may use: the manifest records them, and a board without one is
    refused before the bundle loads (deploy, run_on_board.py) instead of dying of SIGILL."""
    from tvm.target.codegen import llvm_get_cpu_features
    from ..bundle.run_on_board import HWCAP_OF_FEATURE
    return sorted(set(llvm_get_cpu_features(target)) & set(HWCAP_OF_FEATURE))

