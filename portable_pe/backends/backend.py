"""The Backend record: every hook a target kind's build has, with the default a target
that has nothing to do for it keeps (backends/__init__.py lists the hooks)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


def _unchanged(model, state):
    from ..compile.state import Added
    return Added()


def _nothing(state):
    from ..compile.state import Added
    return Added()


def export_here(executable, path, *, target_options: dict | None = None) -> None:
    """model.so linked by this machine's compiler (the default)."""
    executable.export_library(str(path))


def _one_database(options: dict, target) -> str | None:
    return None


def needs_core_count(target) -> None:
    """MetaSchedule's CPU rules need the target's core count."""
    if "num-cores" not in target.attrs:
        raise ValueError(f"target {target.kind.name} {target.attrs.get('mtriple', '')} has no core count, which "
                         "MetaSchedule needs (\"num-cores\"): pass --num-cores N, the board's physical cores")


def _cpu_fusion_passes(target) -> list:
    from ..cpu_schedule import fusion_passes
    return fusion_passes()


def _any_target(target, spec, precision: str):
    """Every precision a backend lists builds for its target as it is."""
    return target


def _compile(mod, target):
    import tvm
    return tvm.compile(mod, target=target)


def _build(mod, target, pipeline):
    import tvm
    from ..cpu_schedule.work_claims import cpu_tir_pipeline
    return tvm.compile(mod, target=target, relax_pipeline=pipeline, tir_pipeline=cpu_tir_pipeline(target))


@dataclass(frozen=True)
class Backend:
    name: str
    tvm_target: Callable
    relax_pipeline: Callable
    legalize_onnx: Callable = _unchanged
    vendor_build: Callable = _nothing
    finalize: Callable = _nothing
    export_library: Callable = export_here
    precisions: tuple[str, ...] = ("fp32",)
    for_precision: Callable = _any_target
    runs_here: bool = False
    tuning_variant: Callable = _one_database
    check_tunable: Callable = needs_core_count
    fusion_passes: Callable = _cpu_fusion_passes
    build_candidate: Callable = _compile
    build: Callable = _build
