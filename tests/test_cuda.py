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
ROOT = Path(__file__).resolve().parent.parent
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
    # model.so holds compiled kernels only where TVM's CUDA runtime (the driver) is present
    import tvm
    assert manifest["cuda"]["kernel_code"] == ("binary" if tvm.runtime.enabled("cuda") else "source")
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


def test_run_on_board_refuses_a_bundle_whose_kernels_are_source_only(tiny_cuda):
    """A bundle built without the driver holds CUDA C, which the runtime-only TVM of a GPU
    machine cannot load (seen on an H200: "module 'tvm.target._ffi_api' has no attribute
    'TargetCurrent'"): the shipped runner says why before trying."""
    import json
    import tvm
    from portable_pe.bundle import run_on_board
    bundle = tiny_cuda[0]
    manifest = json.loads(bundle.file("manifest.json").read_text())
    if manifest["cuda"]["kernel_code"] != "source":
        pytest.skip("TVM here has the CUDA runtime: its bundles hold compiled kernels")
    with pytest.raises(SystemExit, match="holds its CUDA kernels as source only.*no NVIDIA driver"):
        run_on_board.load_vm(bundle.path, manifest)


def test_run_on_board_loads_tvms_cuda_runtime_or_says_why_it_cannot():
    """run_on_board.py loads libtvm_runtime_cuda.so itself (a runtime-only TVM does not, and
    then fails with "a loader of that name is not registered"); where that library cannot
    load (no driver's libcuda.so.1 here), it says so."""
    import tvm
    from portable_pe.bundle import run_on_board
    if tvm.runtime.enabled("cuda"):
        run_on_board.load_device_runtime("cuda")
        import tvm_ffi
        assert tvm_ffi.get_global_func("ffi.Module.load_from_bytes.cuda", allow_missing=True) is not None
    else:
        with pytest.raises(SystemExit, match=r"this TVM cannot load CUDA kernels \(.*libtvm_runtime_cuda.so: "
                                             r".*libcuda.so.1.*install a TVM built with CUDA"):
            run_on_board.load_device_runtime("cuda")


def test_sin_and_cos_on_cuda_take_their_argument_reduced_to_one_period():
    """Under nvcc's fast math sinf is __sinf, loose far from zero (the sinusoidal graph on an
    H200: 2.8e-05 from PyTorch at T=300, 1.7e-06 with the argument reduced first). The
    reduction is part of lowering the intrinsic, so kernels and tuning records stay as they
    are. Here: the cuda source of a sin/cos kernel calls sinf and cosf on the reduced
    argument, and the reduced argument keeps sin and cos (llvm, against float64 numpy)."""
    import numpy as np
    import tvm
    from tvm import te, tirx
    from portable_pe.backends.cuda import build_candidate, cuda_source
    from portable_pe.backends.cuda_intrin import reduced_argument

    n = 1024
    x = te.placeholder((n,), "float32", name="x")
    y = te.compute((n,), lambda i: tirx.sin(x[i]) + tirx.cos(x[i]), name="y")
    sch = tvm.s_tir.Schedule(te.create_prim_func([x, y]))
    outer, inner = sch.split(sch.get_loops(sch.get_sblock("y"))[0], [None, 128])
    sch.bind(outer, "blockIdx.x")
    sch.bind(inner, "threadIdx.x")
    source = cuda_source(build_candidate(sch.mod, tvm.target.Target({"kind": "cuda", "arch": "sm_90"})))
    assert re.search(r"sinf\(\(\(\(x_ptr\[.*nearbyintf", source) and re.search(r"cosf\(\(\(\(x_ptr\[.*nearbyintf", source), \
        source

    reduced = te.compute((n,), lambda i: tirx.sin(reduced_argument(x[i])), name="s")
    cosine = te.compute((n,), lambda i: tirx.cos(reduced_argument(x[i])), name="c")
    period = te.compute((n,), lambda i: reduced_argument(x[i]), name="r")
    f = tvm.compile(te.create_prim_func([x, reduced, cosine, period]), target="llvm")
    values = np.linspace(-400, 400, n).astype("float32")  # a sinusoidal table's positions x frequencies
    out = [tvm.runtime.tensor(np.zeros(n, "float32")) for _ in range(3)]
    f(tvm.runtime.tensor(values), *out)
    s, c, r = (o.numpy() for o in out)
    exact = values.astype(np.float64)
    assert np.abs(r).max() <= np.pi + 1e-5
    assert np.abs(s - np.sin(exact)).max() < 2e-6 and np.abs(c - np.cos(exact)).max() < 2e-6


def test_a_whole_power_becomes_products_and_other_powers_stay():
    """nvcc's fast math (TVM's default) computes powf(x, 2) as exp2(2 * log2(x)): NaN for
    x < 0. Pixtral's RMSNorm squares with Pow, and its cuda build returned NaN everywhere on
    an H200; x ** k for a whole k up to 4 is built as products instead."""
    import numpy as np
    import tvm
    from tvm import relax
    from tvm.script import relax as R
    from portable_pe.backends.cuda_math import PowerAsProducts

    @tvm.script.ir_module
    class Module:
        @R.function
        def main(x: R.Tensor((4,), "float32")):
            with R.dataflow():
                a = R.power(x, R.const(2.0, "float32"))
                b = R.power(x, R.const(3.0, "float32"))
                c = R.power(x, R.const(0.5, "float32"))
                out = (a, b, c)
                R.output(out)
            return out

    rewritten = PowerAsProducts()(Module)
    text = rewritten.script()
    assert text.count("R.power(") == 1 and "0.5" in text and text.count("R.multiply(") == 3
    vm = relax.VirtualMachine(tvm.compile(rewritten, target="llvm"), tvm.cpu())
    x = np.array([-2.0, -0.5, 0.0, 3.0], "float32")
    a, b, c = (v.numpy() for v in vm["main"](tvm.runtime.tensor(x)))
    assert np.array_equal(a, x * x) and np.array_equal(b, x * x * x)
    assert np.isnan(c[:2]).all() and np.allclose(c[2:], np.sqrt(x[2:]))


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
@pytest.mark.parametrize("graph", [*sorted(GRAPHS), *sorted(p.stem for p in (ROOT / "graphs" / "vision").glob("*.toml"))])
def test_every_shipped_graph_builds_for_cuda_and_nvcc_compiles_it(graph, tmp_path_factory):
    bundle, source = build(graph, tmp_path_factory, arch="sm_90")
    assert sorted(re.findall(r"\.entry (\w+)\(", nvcc_ptx(source, "sm_90"))) == bundle.manifest["cuda"]["kernels"]


VISION = Path(__file__).parent / "data" / "vision"


@pytest.mark.nvcc
@needs_nvcc
@pytest.mark.parametrize("graph", ["tiny_vit_rope_2d", "tiny_video_mrope"])
def test_a_vision_graph_builds_for_cuda_and_nvcc_compiles_it(graph, tmp_path_factory):
    """One build for every image size: the token count H // P * (W // P) + extras is named
    (dim_vars) and the kernels over it bound without padding (cuda_rules), where dlight's
    rules failed the build ("The padding factor ... is not divisible"); nvcc compiles what
    came out. Their parity on a GPU is test_cuda_parity_on_the_gpu."""
    bundle, source = build(VISION / f"{graph}.toml", tmp_path_factory, arch="sm_90")
    assert sorted(re.findall(r"\.entry (\w+)\(", nvcc_ptx(source, "sm_90"))) == bundle.manifest["cuda"]["kernels"]
    fell = (bundle.manifest.get("cuda_schedules") or {}).get("fell_through", {})
    if graph == "tiny_video_mrope":  # dlight's Matmul fails on the 3D patch stem; the next rule takes it
        assert any(kernel.startswith("conv3d") and rows[0].startswith("Matmul: ") for kernel, rows in fell.items()), fell
    else:
        assert fell == {}


@pytest.mark.gpu
@pytest.mark.skipif(not has_gpu(), reason="no CUDA GPU on this machine")
@pytest.mark.parametrize("graph", [TINY_SPEC, *(sorted(GRAPHS)), *sorted(VISION.glob("*.toml"))])
def test_cuda_parity_on_the_gpu(graph, tmp_path_factory):
    from portable_pe.run.parity import check_bundle
    out = tmp_path_factory.mktemp("gpu") / "bundle"
    bundle = compile_graph(str(graph), target="cuda", out=out, log=lambda m: None)
    report = check_bundle(bundle)
    assert report.ok, report.to_markdown()


def _matmul_over_tokens(tokens, *dims):
    """A [tokens, 64] x [64, tokens] matmul as a PrimFunc, as a ViT's Q·Kᵀ; `dims`: the
    variables `tokens` is made of, passed as scalars as the importer passes them."""
    from tvm import te, tirx
    dim = tirx.IntImm("int64", 64)  # int64 throughout, as the importer writes them
    q = te.placeholder((tokens, dim), name="q")
    kt = te.placeholder((dim, tokens), name="kt")
    k = te.reduce_axis((tirx.IntImm("int64", 0), dim), name="k")
    s = te.compute((tokens, tokens), lambda i, j: te.sum(q[i, k] * kt[k, j], axis=k), name="s")
    return te.create_prim_func([q, kt, s, *dims])


def test_a_schedule_whose_kernel_cannot_be_declared_in_cuda_falls_through():
    """BEiT's token count is an expression (H // 16 * (W // 16) + 1) that dim_vars cannot
    name; dlight's Matmul then sized its accumulator by it and CUDA codegen refused the
    build ("Can only handle constant size stack allocation for now"). The lowered kernel is
    checked, and such a schedule hands the kernel to the next rule; a token count that is
    one variable schedules as before."""
    import tvm
    from tvm import tirx
    from tvm.s_tir import dlight as dl
    from portable_pe.backends.cuda import tvm_target
    from portable_pe.backends.cuda_rules import _check_device_allocations, _has_compound_dims
    target = tvm_target(CUDA, arch="sm_90")
    h, w, n = (tirx.Var(name, "int64") for name in ("H", "W", "n"))
    compound = _matmul_over_tokens(h // 16 * (w // 16) + 1, h, w)
    named = _matmul_over_tokens(n, n)
    assert _has_compound_dims(compound) and not _has_compound_dims(named)
    with target:
        scheduled = [dl.gpu.Matmul().apply(f, target, False) for f in (compound, named)]
    with pytest.raises(ValueError, match="non-constant size.*local"):
        _check_device_allocations(scheduled[0].mod["main"], target)
    _check_device_allocations(scheduled[1].mod["main"], target)
    # and the build itself refuses what the check refuses (the check is not stricter)
    with target, pytest.raises(Exception, match="constant size stack allocation"):
        tvm.tirx.build(tvm.IRModule({"main": scheduled[0].mod["main"].with_attr("global_symbol", "main")}),
                       target=target)
