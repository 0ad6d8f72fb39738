"""portable_pe's modules import each other without a cycle, lazy imports included
(scripts/import_cycles.py; a cycle here once tied tune, compile, bench and tune_judge)."""

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "import_cycles.py"


def test_the_import_graph_has_no_cycle():
    proc = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True)
    assert proc.returncode == 0 and "0 cycle(s)" in proc.stdout, proc.stdout


def test_the_checker_finds_a_cycle(tmp_path):
    """The check can fail: the same script on a copy with a planted cycle reports it."""
    package = tmp_path / "portable_pe"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from . import b\n")
    (package / "b.py").write_text("from .a import f\n")
    (tmp_path / "scripts").mkdir()
    copy = tmp_path / "scripts" / "import_cycles.py"
    copy.write_text(SCRIPT.read_text())
    proc = subprocess.run([sys.executable, str(copy)], capture_output=True, text=True)
    assert proc.returncode == 1 and "portable_pe.a <-> portable_pe.b" in proc.stdout, proc.stdout


def _planted(tmp_path, files: dict[str, str]):
    package = tmp_path / "portable_pe"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name, text in files.items():
        (package / name).write_text(text)
    (tmp_path / "scripts").mkdir()
    copy = tmp_path / "scripts" / "import_cycles.py"
    copy.write_text(SCRIPT.read_text())
    return subprocess.run([sys.executable, str(copy)], capture_output=True, text=True)


def test_the_checker_sees_a_cycle_through_importlib(tmp_path):
    """A registry that loads modules by name (a table of module paths, as backends/ and
    npu/vendors.py keep) is an edge to each: a module it loads that imports the registry
    back is a cycle."""
    proc = _planted(tmp_path, {
        "registry.py": 'import importlib\nMODULES = {"b": "portable_pe.b"}\n'
                       'def get(name):\n    return importlib.import_module(MODULES[name])\n',
        "b.py": "from .registry import MODULES\n"})
    assert proc.returncode == 1 and "portable_pe.b <-> portable_pe.registry" in proc.stdout, proc.stdout


def test_a_dynamic_import_the_checker_cannot_read_fails_it(tmp_path):
    proc = _planted(tmp_path, {"a.py": "import importlib\ndef get(name):\n"
                                       "    return importlib.import_module(f'{__name__}.{name}')\n"})
    assert proc.returncode == 1 and "dynamic import whose module cannot be read: portable_pe/a.py:3" in proc.stdout, \
        proc.stdout
