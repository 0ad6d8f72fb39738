"""The cuda target: arch choice, dlight-scheduled builds without a GPU, nvcc on the
generated kernels (marker `nvcc`), parity on a GPU (marker `gpu`)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from portable_pe.compile.pipeline import compile_graph
from portable_pe.spec.graphs import GRAPHS
from portable_pe.backends.targets import load_target

from conftest import TINY_SPEC

CUDA = load_target("cuda")
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")


def has_gpu() -> bool:
    import tvm
    return tvm.cuda(0).exist


def documented_fallback() -> str:
    """The fallback arch as targets/cuda.toml writes it (read as text, not through
    load_target), and as the README's target table documents it."""
    root = Path(__file__).resolve().parent.parent
    (fallback,) = re.findall(r'^fallback\s*=\s*"(sm_\d+)"', (root / "targets" / "cuda.toml").read_text(), re.M)
    assert f"(default: the local GPU's arch, else {fallback})" in (root / "README.md").read_text()
    return fallback


class FakeDevice:
    def __init__(self, compute_version=None):
        self.exist, self.compute_version = compute_version is not None, compute_version


def test_arch_default_without_a_gpu_is_the_documented_fallback(monkeypatch):
    import tvm
    from portable_pe.backends import cuda
    monkeypatch.setattr(tvm, "cuda", lambda *_: FakeDevice())  # no GPU, whatever this machine has
    assert str(cuda.tvm_target(CUDA).attrs["arch"]) == documented_fallback()


@pytest.mark.parametrize("version,arch", [("8.6", "sm_86"), ("9.0", "sm_90"), ("12.0", "sm_120")])
def test_arch_default_is_the_local_gpus_compute_capability(monkeypatch, version, arch):
    import tvm
    from portable_pe.backends import cuda
    monkeypatch.setattr(tvm, "cuda", lambda *_: FakeDevice(version))
    assert str(cuda.tvm_target(CUDA).attrs["arch"]) == arch


@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("nvidia-smi") is None or not has_gpu(), reason="no CUDA GPU on this machine")
def test_arch_default_on_this_gpu_is_what_nvidia_smi_reports():
    import subprocess
    from portable_pe.backends import cuda
    out = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True,
                         text=True, check=True).stdout.split()
    assert str(cuda.tvm_target(CUDA).attrs["arch"]) == "sm_" + out[0].replace(".", "")


def test_arch_is_passed_through_and_a_bad_one_is_refused():
    from portable_pe.backends import cuda
    assert str(cuda.tvm_target(CUDA, arch="sm_87").attrs["arch"]) == "sm_87"
    with pytest.raises(ValueError, match=r"CUDA arch '80' is not an SM arch; expected e.g. sm_80"):
        cuda.tvm_target(CUDA, arch="80")


def build(graph, tmp_path_factory, arch="sm_80"):
    out = tmp_path_factory.mktemp("cuda") / f"{graph.stem if hasattr(graph, 'stem') else graph}-cuda"
    bundle = compile_graph(str(graph), target="cuda", target_options={"arch": arch}, out=out,
                           keep_intermediates=True, log=lambda m: None)
    return bundle, (out.parent / f"{out.name}.intermediates" / "06-kernels.cu").read_text()


@pytest.fixture(scope="module")
def tiny_cuda(tmp_path_factory):
    return build(TINY_SPEC, tmp_path_factory)


def test_cuda_builds_without_a_gpu_and_records_its_kernels(tiny_cuda):
    bundle, source = tiny_cuda
    from portable_pe.backends.cuda import kernel_names
    manifest = bundle.manifest
    assert manifest["target"]["tvm"]["arch"] == "sm_80" and manifest["target"]["tvm"]["host"]["kind"] == "llvm"
    assert manifest["cuda"]["kernels"] == sorted(kernel_names(source)) and len(manifest["cuda"]["kernels"]) > 5
    # dlight bound every kernel to the grid: each one reads blockIdx and threadIdx
    bodies = source.split('extern "C" __global__')[1:]
    definitions = [b for b in bodies if "{" in b.split(";")[0]]
    assert definitions and all("blockIdx" in b.split('extern "C"')[0] and "threadIdx" in b for b in definitions)


def test_cuda_bundle_without_a_gpu_says_so(tiny_cuda):
    if has_gpu():
        pytest.skip("a GPU is present: the bundle runs here")
    from portable_pe.bundle.artifact import BundleError
    from portable_pe.run.local import run_local
    with pytest.raises(BundleError, match="needs a cuda device, none is present here"):
        run_local(tiny_cuda[0], {})


def nvcc_ptx(source: str, arch: str) -> str:
    import tvm
    from tvm.support import nvcc
    # compiler="nvcc": TVM 0.27 defaults to NVRTC, which needs the cuda-bindings package
    with tvm.target.Target({"kind": "cuda", "arch": arch}):
        return bytes(nvcc.compile_cuda(source, target_format="ptx", arch=arch, compiler="nvcc")).decode()


@pytest.mark.nvcc
@needs_nvcc
def test_nvcc_compiles_every_generated_kernel(tiny_cuda):
    bundle, source = tiny_cuda
    ptx = nvcc_ptx(source, "sm_80")
    assert sorted(re.findall(r"\.entry (\w+)\(", ptx)) == bundle.manifest["cuda"]["kernels"]


@pytest.mark.nvcc
@needs_nvcc
def test_nvcc_rejects_a_broken_kernel(tiny_cuda):
    broken = tiny_cuda[1].replace("threadIdx.x", "threadIdx.w", 1)
    with pytest.raises(Exception, match="threadIdx"):
        nvcc_ptx(broken, "sm_80")


@pytest.mark.slow
@pytest.mark.nvcc
@needs_nvcc
@pytest.mark.parametrize("graph", sorted(GRAPHS))
def test_every_shipped_graph_builds_for_cuda_and_nvcc_compiles_it(graph, tmp_path_factory):
    bundle, source = build(graph, tmp_path_factory, arch="sm_90")
    assert sorted(re.findall(r"\.entry (\w+)\(", nvcc_ptx(source, "sm_90"))) == bundle.manifest["cuda"]["kernels"]


@pytest.mark.gpu
@pytest.mark.skipif(not has_gpu(), reason="no CUDA GPU on this machine")
@pytest.mark.parametrize("graph", [TINY_SPEC, *(sorted(GRAPHS))])
def test_cuda_parity_on_the_gpu(graph, tmp_path_factory):
    from portable_pe.run.parity import check_bundle
    out = tmp_path_factory.mktemp("gpu") / "bundle"
    bundle = compile_graph(str(graph), target="cuda", out=out, log=lambda m: None)
    report = check_bundle(bundle)
    assert report.ok, report.to_markdown()
