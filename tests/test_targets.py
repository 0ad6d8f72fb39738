"""Every registered target builds the tiny graph, and the parity harness judges the bundle:
PASS where the compiled model runs on this machine, UNVERIFIED (onnxruntime's rows only)
where it needs a board or a GPU. A new target needs an entry in TARGET_CASES, or
test_registry_coverage.py names it."""

from __future__ import annotations

import platform
import shutil
import subprocess

import pytest

from conftest import TINY_SPEC
from portable_pe.bundle.artifact import BundleError
from portable_pe.run.local import LocalRunner
from portable_pe.run.parity import check_bundle


def _has_gpu() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    return subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.startswith("GPU")


# target -> (its options for the tiny graph, where its compiled model runs)
TARGET_CASES = {
    "llvm": ({}, "here"),
    "arm": ({}, "here" if platform.machine() == "aarch64" else "a board"),
    "cuda": ({}, "here" if _has_gpu() else "a GPU"),
    "npu": ({"profile": "rknpu2", "seq_len": 32}, "here"),  # model.so: the same graph on the host
}


@pytest.mark.parametrize("target", sorted(TARGET_CASES))
def test_every_target_builds_the_tiny_graph_and_parity_judges_it(target, bundle_factory):
    options, runs_on = TARGET_CASES[target]
    bundle = bundle_factory(TINY_SPEC, target, **options)
    assert bundle.manifest["target"]["name"] == target
    try:
        runner, why = LocalRunner(bundle).run, ""
    except BundleError as err:  # what `portable-pe compile` and `parity` do with such a bundle
        runner, why = None, str(err)
    assert (runner is not None) == (runs_on == "here"), why
    report = check_bundle(bundle, lengths=(1, 7), tvm_runner=runner,
                          candidates=("onnxruntime", "tvm") if runner else ("onnxruntime",))
    report.unverified = why
    assert report.verdict == ("PASS" if runs_on == "here" else "UNVERIFIED"), report.to_markdown()
    assert {r.candidate for r in report.rows} == ({"onnxruntime", "tvm"} if runner else {"onnxruntime"})
