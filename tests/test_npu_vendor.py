"""The vendor-toolchain runner (npu/toolchain.py): a worker in another interpreter, a file
contract, and one clear error whatever way the worker fails. This interpreter stands in
for a toolchain's virtualenv; the workers are tiny scripts written by the test."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from portable_pe.npu.toolchain import VendorError, missing_message, run_worker, toolchain_python

PYTHON = Path(sys.executable)


def _worker(tmp_path, body: str):
    path = tmp_path / "worker.py"
    path.write_text("import json, os, sys, time\nreq = json.load(open(sys.argv[1]))\n" + body)
    return path


def test_result_comes_back_and_the_request_reaches_the_worker(tmp_path):
    worker = _worker(tmp_path, "json.dump({'doubled': req['x'] * 2, 'cwd': os.getcwd()}, open('result.json', 'w'))\n")
    work = tmp_path / "work"
    result = run_worker("fake", worker, {"x": 21}, work_dir=work, stage="vendor build", python=PYTHON)
    assert result == {"doubled": 42, "cwd": str(work)}


@pytest.mark.parametrize("body, words", [
    ("print('vendor says: E build failed'); sys.exit(3)\n", ["exit 3", "vendor says: E build failed"]),
    ("print('simulating...', flush=True); os.kill(os.getpid(), 11)\n", ["crashed (SIGSEGV)", "simulating..."]),
    ("print('done, but forgot the result')\n", ["no valid result.json", "forgot the result"]),
    ("open('result.json', 'w').write('{not json')\n", ["no valid result.json"]),
])
def test_every_failure_is_one_error_with_the_stage_and_the_vendors_words(tmp_path, body, words):
    with pytest.raises(VendorError) as err:
        run_worker("fake", _worker(tmp_path, body), {}, work_dir=tmp_path / "w", stage="rknn build", python=PYTHON)
    assert str(err.value).startswith("rknn build: fake ")
    for w in words:
        assert w in str(err.value)


def test_a_hanging_worker_is_stopped(tmp_path):
    worker = _worker(tmp_path, "print('waiting', flush=True); time.sleep(60)\n")
    with pytest.raises(VendorError, match=r"ran past 1 s and was stopped(.|\n)*waiting"):
        run_worker("fake", worker, {}, work_dir=tmp_path / "w", stage="simulator", timeout_s=1, python=PYTHON)


def test_a_missing_toolchain_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setenv("PORTABLE_PE_TOOLCHAIN_DIR", str(tmp_path))
    assert toolchain_python("rknn") is None
    with pytest.raises(VendorError, match=r"npu_toolchain\.sh rknn"):
        run_worker("rknn", tmp_path / "worker.py", {}, work_dir=tmp_path / "w", stage="rknn build")
    # a venv without the ready stamp (a setup that died half way) is not a toolchain
    (tmp_path / "rknn" / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "rknn" / "venv" / "bin" / "python").write_text("")
    assert toolchain_python("rknn") is None
    (tmp_path / "rknn" / "ready").write_text("x")
    assert toolchain_python("rknn") == tmp_path / "rknn" / "venv" / "bin" / "python"
    assert "scripts/npu_toolchain.sh rknn" in missing_message("rknn")
