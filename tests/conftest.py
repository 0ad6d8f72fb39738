"""Shared fixtures (compiled bundles are built once per session and reused), the one numeric
check every test uses (assert_parity, through the parity harness), and the record of every
collected test's parameters that test_registry_coverage.py reads."""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
TINY_SPEC = DATA / "tiny_rope.toml"
SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def cross_compiler_missing() -> str | None:
    """Why the arm target cannot link here (its cross compiler is missing), or None."""
    from portable_pe.backends.arm import cross_compiler
    try:
        cross_compiler()
    except RuntimeError as err:
        return str(err)
    return None


#: tests that build for the arm target: they skip, with the reason, without the cross compiler
needs_cross = pytest.mark.skipif(cross_compiler_missing() is not None, reason=str(cross_compiler_missing()))


def require_cross() -> None:
    why = cross_compiler_missing()
    if why is not None:
        pytest.skip(why)


@functools.lru_cache(maxsize=None)
def load_script(name: str):
    """scripts/NAME.py as a module, loaded once (scripts/ is not a package). It is in
    sys.modules under NAME, as an import would put it: dataclasses look their module up."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session", autouse=True)
def _export_cache(tmp_path_factory):
    """One export cache for the session, not the user's: tests neither read stale
    entries nor leave any behind."""
    import os
    from portable_pe.compile.export import CACHE_ENV
    before = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = str(tmp_path_factory.mktemp("export-cache"))
    yield
    if before is None:
        os.environ.pop(CACHE_ENV, None)
    else:
        os.environ[CACHE_ENV] = before


@pytest.fixture(scope="session")
def bundle_factory(tmp_path_factory):
    """compile(graph, target) -> Bundle, cached per (graph, target) for the session."""
    from portable_pe.compile.pipeline import compile_graph
    cache = {}

    def build(graph: str, target: str = "llvm", *, tuning: bool = True, precision: str | None = None, **options):
        key = (str(graph), target, tuning, precision, tuple(sorted(options.items())))
        if target == "arm" or options.get("host") == "arm":
            require_cross()  # an arm build links with the cross compiler: skip, not fail, without it
        if key not in cache:
            out = tmp_path_factory.mktemp("bundles") / f"{Path(str(graph)).stem}-{target}"
            cache[key] = compile_graph(str(graph), target=target, out=out, log=lambda m: None,
                                       target_options=options or None, tuning=tuning, precision=precision)
        return cache[key]
    return build


@pytest.fixture(scope="session")
def tiny_bundle(bundle_factory):
    return bundle_factory(TINY_SPEC)


@pytest.fixture(scope="session")
def tiny_int8_bundle(bundle_factory):
    return bundle_factory(TINY_SPEC, precision="int8")


# ------------------------------------------------------------------ numeric checks
#: Named rows besides portable_pe.run.parity.TOLERANCES, for checks that have always held
#: another bound than their dtype's row. Same rule as the harness: a result passes when
#: max_abs <= atol + rtol * max|ref| and cosine >= min_cosine. Each keeps what its tests
#: asserted before they went through the harness, so no check got looser.
TEST_TOLERANCES = {
    # float32 against float32 on this CPU: 1e-4 absolute, nothing for the output's
    # magnitude (the float32 row allows 1e-4 + 1e-4 * max|ref|, about 5e-4 for the encoders)
    "float32_abs": {"atol": 1e-4, "rtol": 0.0, "min_cosine": 0.9999},
    # the same float32 ops on both sides (an exported ONNX graph against the PyTorch module
    # it came from; a small graph of shape arithmetic in TVM against onnxruntime): 1e-5 absolute
    "float32_abs_1e-5": {"atol": 1e-5, "rtol": 0.0, "min_cosine": 0.9999},
    # a bf16 kernel against a float64 oracle of its own roundings: float32 accumulation
    # order, and a probability whose exp lands on a bf16 tie rounding one step apart
    "float32_abs_1e-3": {"atol": 1e-3, "rtol": 0.0, "min_cosine": 0.99999},
    # the int8 row's cosine alone: onnxruntime's static QDQ quantizer on its own (before
    # the npu stage's checks), which test_npu has only ever held to a cosine; its max abs
    # error on the tiny rope graph at T=16 is 14% of max|ref|, over the int8 row's 10%
    "int8_cosine": {"atol": float("inf"), "rtol": 0.0, "min_cosine": 0.99},
}


def tolerance_row(name: str) -> dict:
    """A row of parity.TOLERANCES, or of TEST_TOLERANCES, by name."""
    from portable_pe.run.parity import TOLERANCES
    rows = {**TOLERANCES, **TEST_TOLERANCES}
    if name not in rows:
        raise KeyError(f"no tolerance row {name!r}; known: {', '.join(rows)}")
    return rows[name]


def assert_parity(reference, candidate, *, tolerance: str | None = None, name: str = "candidate",
                  length: int = 0) -> list:
    """Assert that `candidate` matches `reference` by the parity harness (parity.compare):
    each output's shape and dtype first, then max abs, max rel and cosine against one row,
    the reference dtype's row of parity.TOLERANCES or the row named by `tolerance` (in
    parity.TOLERANCES or TEST_TOLERANCES). Dicts name the outputs; bare arrays are one output
    "out". Every row must be ok; the message shows every row's numbers. Returns the rows."""
    from portable_pe.run.parity import ParityReport, compare
    if not isinstance(reference, dict):
        reference, candidate = {"out": reference}, {"out": candidate}
    overrides = None
    if tolerance is not None:
        row = tolerance_row(tolerance)
        overrides = {str(ref.dtype): row for ref in reference.values()}
    rows = compare(reference, candidate, name=name, length=length, tolerance_overrides=overrides)
    if not (rows and all(r.ok for r in rows)):
        table = ParityReport(name, "this test", f"tolerance {tolerance or 'by dtype'}", rows).to_markdown()
        raise AssertionError(f"{name} does not match its reference:\n{table}")
    return rows


# ------------------------------------------------------------------ registry coverage
#: test module file name -> the parameter ids and string parameter values of its tests,
#: as collected (before -m / -k deselect any): test_registry_coverage.py checks that every
#: registry entry appears among them.
COLLECTED: dict[str, set[str]] = {}


def pytest_collectreport(report):
    """A test module counts as collected even when it yields no tests (an importorskip)."""
    if report.nodeid.endswith(".py"):
        COLLECTED.setdefault(Path(report.nodeid).name, set())


def pytest_itemcollected(item):
    ids = COLLECTED.setdefault(item.path.name, set())
    callspec = getattr(item, "callspec", None)
    if callspec is not None:
        ids.add(callspec.id)
        ids.update(v for v in callspec.params.values() if isinstance(v, str))


def fake_tuning_database(root, graph: str, point: dict, verdict: dict):
    """An empty database for `graph` whose one tuned point carries `verdict` on its entry."""
    import json
    from tvm.s_tir import meta_schedule as ms
    db_dir = root / "llvm" / graph
    db_dir.mkdir(parents=True)
    ms.database.JSONDatabase(work_dir=str(db_dir), allow_missing=True)  # writes its two empty files
    saved = {**point, "trials_per_task": 0, "tasks": 0, "only": None, "seconds": 0.0, "target": "llvm",
             "kept_kernels": 0, "kernels": [], "entry": verdict}
    (db_dir / "tuned.json").write_text(json.dumps({"graph": graph, "points": [saved]}))
