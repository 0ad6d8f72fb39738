"""Tuning databases: where they live and how a compile or a recheck reads them.

A leaf module (nothing in portable_pe imported at module level but targets): compile,
tune, tune_judge and bench all read databases, and none of them need each other for it.

    targets/tuning/<target>/<graph>/database_workload.json
                                    database_tuning_record.json
                                    tuned.json      (tuned points, trials, seconds)
    targets/tuning/<target>/<variant>/<graph>/...   for targets whose backend keys its
                                    databases by an option (arm: the board; cuda: the arch)
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from ..backends.targets import TARGETS_DIR

TUNING_DIR = TARGETS_DIR / "tuning"
DB_FILES = ("database_workload.json", "database_tuning_record.json")


def database_dir(target: str, graph: str, *, variant: str | None = None) -> Path:
    """PORTABLE_PE_TUNING_DIR moves the databases (tests use it to keep targets/ clean)."""
    root = Path(os.environ.get("PORTABLE_PE_TUNING_DIR", TUNING_DIR)) / target
    return (root / variant if variant else root) / graph


def database_dir_of(st) -> Path:
    """The database of a compile state (resolved target and options): a backend whose
    `tuning_variant(options, target)` names one keeps a database per board or arch."""
    from ..backends import get_backend
    variant = get_backend(st.target.backend).tuning_variant(st.target_options, st.tvm_target)
    return database_dir(st.target.name, st.name, variant=variant)


def tuned_points(db_dir: Path) -> list[dict]:
    meta = db_dir / "tuned.json"
    return json.loads(meta.read_text())["points"] if meta.is_file() else []


def database_digest(db_dir: Path) -> str:
    digest = hashlib.sha256()
    for name in DB_FILES:
        digest.update((db_dir / name).read_bytes())
    return digest.hexdigest()


def open_database(db_dir: Path):
    from tvm.s_tir import meta_schedule as ms
    return ms.database.JSONDatabase(work_dir=str(db_dir), allow_missing=True)


def specialized_name(point: dict) -> str:
    return f"main_b{point['batch']}_t{point['seq']}"


def specialize(mod, *, dims: dict[str, dict], point: dict):
    """A copy of `main` with batch and seq bound to the point's values, added as a new entry."""
    from tvm import relax
    values = {name: point[info["role"]] for name, info in dims.items()}
    bound = relax.transform.BindSymbolicVars(values, func_name="main")(mod)["main"]
    name = specialized_name(point)
    mod[name] = bound.with_attr("global_symbol", name)
    return mod


def as_main(mod, name: str):
    """A module whose `main` is `mod[name]`, keeping every other function but the old main:
    the ONNX importer may emit TIR helpers (e.g. `maximum`) that main calls directly."""
    import tvm
    drop = {"main", name}
    out = tvm.IRModule({gv: f for gv, f in mod.functions_items() if gv.name_hint not in drop})
    out["main"] = mod[name].with_attr("global_symbol", "main")
    return out


def fused_module(mod, target, *, backend=None):
    """`mod` after exactly the compile's fusion passes (the backend's fusion_passes: cuda's,
    or the CPU ones; default llvm's): the kernels a compile would schedule."""
    import tvm
    from ..backends import get_backend
    backend = backend or get_backend("llvm")
    with target:
        return tvm.transform.Sequential(backend.fusion_passes(target))(mod)


def kernels_of(fused) -> dict:
    """Kernel name -> PrimFunc of a fused module."""
    from tvm import tirx
    return {gv.name_hint: f for gv, f in fused.functions_items() if isinstance(f, tirx.PrimFunc)}


def fused_prim_funcs(mod, target, *, backend=None):
    """The PrimFuncs a compile would schedule, after exactly the compile's fusion passes."""
    return kernels_of(fused_module(mod, target, backend=backend))


def workload(func):
    """A kernel as MetaSchedule tunes and looks it up: a module whose `main` it is."""
    import tvm
    return tvm.IRModule({"main": func.with_attr("global_symbol", "main")})


def coverage(mod, target, database, *, backend=None) -> tuple[list[str], list[str]]:
    """(hits, misses) over a static-shape module's kernels: those the database has a
    measured schedule for, and those that will get the default schedules. (A workload
    whose candidates all failed to run is in the database with no usable record: a miss.)"""
    hits, misses = [], []
    for name, func in fused_prim_funcs(mod, target, backend=backend).items():
        found = database.query_tuning_record(workload(func), target, "main") is not None
        (hits if found else misses).append(name)
    return hits, misses
