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
