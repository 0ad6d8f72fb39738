"""Shared fixtures: compiled bundles are built once per session and reused."""

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
