"""--precision bf16: the rounding (against PyTorch's own float32 -> bfloat16 conversion),
the AMX and AVX512-BF16 matmul kernels (against a float64 product of the rounded operands,
with the instruction found in the assembly), whole bundles against PyTorch float32, and
the refusal on a CPU without bf16 instructions.

The kernels run only on a CPU that has their instructions (this machine kind has both);
elsewhere those tests skip with the missing flag. The aarch64 kernel (BFMMLA) is
cross-compiled here and its instructions counted in the object; it runs on the emulated
board (test_deploy.py)."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess

import numpy as np
import pytest
import torch

from portable_pe.backends import llvm
from portable_pe.backends.targets import load_target
from portable_pe.cpu_schedule.bf16_linear import bf16_bits
from portable_pe.host_cpu import cpu_flags
from portable_pe.cpu_schedule.work_claims import cpu_tir_pipeline

from conftest import TINY_SPEC, assert_parity, needs_cross

CPU_FLAGS = cpu_flags()
#: kernel -> (the LLVM features that select it, the /proc/cpuinfo flags it runs on, its instruction)
KERNELS = {"amx-bf16": (["+avx512bf16", "+amx-tile", "+amx-bf16"], {"amx_tile", "amx_bf16"}, "tdpbf16ps"),
           "avx512-bf16": (["+avx512bf16"], {"avx512_bf16"}, "vdpbf16ps")}


def _needs(kernel: str):
    missing = sorted(KERNELS[kernel][1] - CPU_FLAGS)
    return pytest.mark.skipif(bool(missing), reason=f"this CPU has no {', '.join(missing)} ({kernel})")


def _widen(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _torch_bits(x: np.ndarray) -> np.ndarray:
    return torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def _edge_values() -> np.ndarray:
    """Ties both ways (low half exactly 0x8000 under an even and an odd kept bit), the
    largest finite value (rounds up to inf), subnormals, signed zeros, inf and NaN."""
    patterns = np.array([0x3F808000, 0x3F818000, 0x3F807FFF, 0x3F808001, 0x7F7FFFFF, 0xFF7FFFFF,
                         0x00000001, 0x80008000, 0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000],
                        dtype=np.uint32)
    return patterns.view(np.float32)


def test_bf16_bits_rounds_as_pytorch_does():
    x = np.concatenate([np.random.default_rng(0).standard_normal(10000).astype(np.float32) * 100, _edge_values()])
    ours, theirs = bf16_bits(x), _torch_bits(x)
    finite = ~np.isnan(x)
    assert np.array_equal(ours[finite], theirs[finite])
    assert np.all(np.isnan(_widen(ours[~finite])))


def test_the_kernels_bf16_rounding_reads_its_value_once_and_rounds_as_pytorch():
    """The rounding reads its float three times (low bit, rounding, NaN test); bound once, a
    producer inlined into it (pack_q's RoPE rotation, a gelu epilogue) is computed once, so
    the scheduler inlines it instead of keeping a full-size intermediate."""
    import tvm
    from tvm import te
    from portable_pe.cpu_schedule.bf16_linear import bf16_bits_expr
    x = te.placeholder((len(_edge_values()) + 64,), "float32", name="x")
    y = te.compute(x.shape, lambda i: bf16_bits_expr(x[i] * 3.0), name="y")
    assert str(y.op.body[0]).count("T.float32(3.0)") == 1, y.op.body[0]  # the product, once
    func = te.create_prim_func([x, y])
    run = tvm.compile(tvm.IRModule({"main": func}), target="llvm")
    values = np.concatenate([_edge_values(), np.random.default_rng(1).standard_normal(64).astype(np.float32)])
    out = tvm.runtime.tensor(np.zeros(values.shape, "uint16"))
    run["main"](tvm.runtime.tensor(values), out)
    scaled = values * np.float32(3.0)
    finite = ~np.isnan(scaled)
    assert np.array_equal(out.numpy()[finite], _torch_bits(scaled)[finite])
    assert np.all(np.isnan(_widen(out.numpy()[~finite])))


def _matmul_module(k: int, n: int, *, rows=("T",), seed: int = 0):
    """x [*rows, K] -> (x + 1) @ W + b -> gelu, with W and b constants: a linear layer
    whose input is made by an elementwise op, and whose epilogue has a bias and activation."""
    import tvm
    from tvm import relax
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((k, n)) * 0.1).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    dims = [tvm.tirx.Var(r, "int64") if isinstance(r, str) else r for r in rows]
    x = relax.Var("x", relax.TensorType((*dims, k), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.op.add(x, relax.const(1.0)))
            y = bb.emit(relax.op.add(bb.emit(relax.op.matmul(h, relax.const(w))), relax.const(b)))
            out = bb.emit_output(relax.op.nn.gelu(y))
        bb.emit_func_output(out)
    return bb.get(), w, b


def _build(mod, kernel: str):
    import tvm
    return _build_for(mod, {"kind": "llvm", "mcpu": "rocketlake", "mattr": KERNELS[kernel][0], "num-cores": 2})


def _build_for(mod, target: dict):
    import tvm
    from portable_pe.cpu_schedule import cpu_pipeline
    target = tvm.target.Target(target)
    return tvm.compile(mod, target=target, relax_pipeline=cpu_pipeline(target, precision="bf16"),
                       tir_pipeline=cpu_tir_pipeline(target))


def _run(executable, x: np.ndarray) -> np.ndarray:
    import tvm
    from tvm import relax
    return relax.VirtualMachine(executable, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()


def _oracle(x, w, b):
    """The bf16 build's arithmetic in float64: operands rounded to bf16 (PyTorch's
    conversion), exact products summed, then the float32 epilogue."""
    product = _widen(_torch_bits(x + np.float32(1))).astype(np.float64) @ _widen(_torch_bits(w)).astype(np.float64)
    return torch.nn.functional.gelu(torch.from_numpy((product + b).astype(np.float32))).numpy()


@pytest.mark.parametrize("kernel", [pytest.param(k, marks=_needs(k)) for k in KERNELS])
@pytest.mark.parametrize("k, n", [(64, 96), (48, 80)])
def test_bf16_matmul_kernel_computes_the_rounded_product(kernel, k, n):
    """(64, 96) fits AMX's 32 x 32 blocks; (48, 80) does not (K % 32, N % 32 ≠ 0): AMX pads
    it with zeros to (64, 96) and crops the output, vdpbf16ps takes it as it is."""
    mod, w, b = _matmul_module(k, n)
    executable = _build(mod, kernel)
    for t in (1, 33, 128):
        x = np.random.default_rng(t).standard_normal((t, k)).astype(np.float32)
        assert_parity(_oracle(x, w, b), _run(executable, x), tolerance="float32_abs", name=f"{kernel} T={t}")
    assert KERNELS[kernel][2] in executable.mod.imports[0].inspect_source("asm")


@_needs("amx-bf16")
@pytest.mark.parametrize("batch, k, n", [(2, 64, 64), (8, 512, 256)])
def test_amx_kernel_with_batch_rows_and_no_epilogue(batch, k, n):
    """A [B, T, K] activation (the row blocks per batch item) and a matmul whose result is
    the output itself (written through its own row stride). (8, 512, 256) once stopped the
    build: the padded copy's serial-when-small branch held only for T = 0, and TVM's
    simplifier divided by the zero block count it derived there."""
    import tvm
    from tvm import relax
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((k, n)) * 0.1).astype(np.float32)
    x = relax.Var("x", relax.TensorType((batch, tvm.tirx.Var("T", "int64"), k), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.matmul(x, relax.const(w)))
        bb.emit_func_output(out)
    executable = _build(bb.get(), "amx-bf16")
    xv = rng.standard_normal((batch, 40, k)).astype(np.float32)
    expected = (_widen(_torch_bits(xv)).astype(np.float64) @ _widen(_torch_bits(w)).astype(np.float64)).astype(np.float32)
    assert_parity(expected, _run(executable, xv), tolerance="float32_abs", name=f"amx [{batch}, 40, {k}] x [{k}, {n}]")


def test_amx_dense_configures_the_tiles_once_per_work_item():
    """ldtilecfg and tilerelease cost about 0.16 us, more than half of a 32 x 32 block's
    K = 256 tile steps (0.27 us): the dense kernel opens one tile scope per parallel work
    item, around all its blocks, and runs each block's epilogue right after it (compiled
    only: nothing here runs AMX)."""
    import tvm
    from tvm import relax
    from portable_pe.cpu_schedule import cpu_pipeline
    x = relax.Var("x", relax.TensorType((tvm.tirx.Var("T", "int64"), 256), "float32"))
    w = np.random.default_rng(3).standard_normal((256, 512)).astype(np.float32)
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.gelu(relax.op.matmul(x, relax.const(w))))
        bb.emit_func_output(out)
    target = tvm.target.Target({"kind": "llvm", "mcpu": "rocketlake", "mattr": KERNELS["amx-bf16"][0], "num-cores": 2})
    with target:
        scheduled = cpu_pipeline(target, precision="bf16")(bb.get())
    kernels = [f.script() for f in scheduled.functions.values() if "portable_pe_amx_bf16" in str(f)]
    assert len(kernels) == 1
    lines = kernels[0].splitlines()
    where = {name: [i for i, line in enumerate(lines) if name in line]
             for name in ("T.parallel", "portable_pe_amx_begin", '"portable_pe_amx_bf16"', "portable_pe_amx_end", "gelu")}
    assert len(where["portable_pe_amx_begin"]) == 1 and len(where["portable_pe_amx_end"]) == 1, where
    parallel = max(i for i in where["T.parallel"] if i < where["portable_pe_amx_begin"][0])
    assert parallel < where["portable_pe_amx_begin"][0] < where['"portable_pe_amx_bf16"'][0] < where["portable_pe_amx_end"][0]
    # the epilogue (gelu) between the block's call and the scope's end, inside the item
    assert any(where['"portable_pe_amx_bf16"'][0] < i < where["portable_pe_amx_end"][0] for i in where["gelu"])
    # one call per 32 x 32 block: C is [32, 32]
    assert "(T.int64(32), T.int64(32))" in kernels[0]


@pytest.mark.parametrize("k, n, rows_first", [(256, 512, True), (1024, 1024, False)])
def test_amx_dense_items_are_row_major_unless_the_weight_would_crowd_l2(k, n, rows_first):
    """A 256 KiB bf16 weight: (row block, column group) items, row blocks outermost, so a
    core computes whole rows; a 2 MiB one: column groups outermost, each core keeping its
    groups' panels in L2. TVM names a fused loop after its loops in order (i0: rows)."""
    import tvm
    from tvm import relax, tirx
    from portable_pe.cpu_schedule import cpu_pipeline
    x = relax.Var("x", relax.TensorType((tvm.tirx.Var("T", "int64"), k), "float32"))
    w = np.random.default_rng(4).standard_normal((k, n)).astype(np.float32)
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.matmul(x, relax.const(w)))
        bb.emit_func_output(out)
    target = tvm.target.Target({"kind": "llvm", "mcpu": "rocketlake", "mattr": KERNELS["amx-bf16"][0], "num-cores": 2})
    with target:
        scheduled = cpu_pipeline(target, precision="bf16")(bb.get())
    (kernel,) = [f for f in scheduled.functions.values() if "portable_pe_amx_bf16" in str(f)]
    from portable_pe.cpu_schedule.tir_util import _node, _walk
    (parallel,) = [s for s in _walk(kernel.body) if _node(s) == "For" and s.kind == tirx.ForKind.PARALLEL
                   and "portable_pe_amx_bf16" in str(s)]  # (not the padded copy of A's rows)
    assert parallel.loop_var.name.startswith("i0" if rows_first else "i1"), parallel.loop_var.name


@_needs("amx-bf16")
def test_activation_rounding_in_the_kernel_is_pytorchs():
    """W = identity: each output is one product with 1.0, so the kernel's output is its
    rounding of the activation, bit for bit (ties both ways, tiny values).
    Infinities and NaN stay out: inf x 0 in the identity's other columns makes the row
    NaN (bf16_bits' handling of them is checked against PyTorch above)."""
    import tvm
    from tvm import relax
    eye = np.eye(32, dtype=np.float32)
    x = relax.Var("x", relax.TensorType((32, 32), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.matmul(x, relax.const(eye)))
        bb.emit_func_output(out)
    edges = _edge_values()
    edges = edges[np.isfinite(edges) & (np.abs(edges) < 1e38)]
    values = np.resize(np.concatenate([edges, np.random.default_rng(2).standard_normal(1024).astype(np.float32)]),
                       (32, 32)).astype(np.float32)
    got = _run(_build(bb.get(), "amx-bf16"), values)
    # compared as floats: -0.0 x 1 plus the row's +0.0 products sums to +0.0, as in any matmul
    assert np.array_equal(got, _widen(_torch_bits(values)))


def test_a_cpu_without_bf16_is_refused_with_the_feature_it_lacks():
    spec = dataclasses.replace(load_target("llvm"), tvm={"kind": "llvm", "mcpu": "znver3"})
    with pytest.raises(ValueError, match=r"--precision bf16 needs an x86 CPU with amx-tile\+amx-bf16 or avx512bf16.*"
                                         r"\(znver3\) has neither"):
        llvm.for_precision(llvm.tvm_target(spec), spec, "bf16")


def test_the_host_target_gets_the_bf16_features_its_cpu_reports():
    """LLVM names this CPU by its model number; the flags Linux reports decide the features."""
    spec = load_target("llvm")
    target = llvm.for_precision(llvm.tvm_target(spec), spec, "bf16") if CPU_FLAGS & {"avx512_bf16", "amx_bf16"} else None
    if target is None:
        pytest.skip("this CPU has no bf16 instructions")
    from portable_pe.cpu_schedule.bf16_isa import bf16_kernel
    assert bf16_kernel(target) == ("amx-bf16" if {"amx_tile", "amx_bf16"} <= CPU_FLAGS else "avx512-bf16")


@pytest.mark.skipif(not CPU_FLAGS & {"avx512_bf16", "amx_bf16"}, reason="this CPU has no bf16 instructions")
def test_a_bf16_bundle_matches_pytorch_float32_and_is_not_the_float32_build(bundle_factory, tiny_bundle):
    from portable_pe.run.local import LocalRunner
    from portable_pe.run.parity import check_bundle, make_inputs
    from portable_pe.spec.io_names import dim_roles
    import onnx
    bundle = bundle_factory(TINY_SPEC, precision="bf16")
    graph = onnx.load(str(bundle.file("model.onnx"))).graph
    constants = {i.name for i in graph.initializer}
    linear = sum(n.op_type in ("MatMul", "Gemm") and n.input[1] in constants for n in graph.node)
    assert linear > 0 and bundle.manifest["bf16"] == {**bundle.manifest["bf16"], "matmuls_bf16": linear,
                                                      "matmuls_float32": 0, "kernel": bundle.manifest["bf16"]["kernel"]}
    assert bundle.manifest["precision"] == "bf16" and bundle.manifest["tolerance"]["float32"]["min_cosine"] == 0.9995
    # one fused attention per layer; head dim 16 is not a multiple of 32: float32 attention
    layers = bundle.manifest["graph"]["spec"]["model"]["n_layers"]
    assert (bundle.manifest["bf16"]["attentions_bf16"], bundle.manifest["bf16"]["attentions_float32"]) == (0, layers)
    report = check_bundle(bundle, lengths=(1, 7, 64))
    assert report.ok, report.to_markdown()
    rows = [r for r in report.rows if r.candidate == "tvm"]
    assert rows and all(r.cosine >= 0.9995 for r in rows)
    assert {r.candidate for r in report.rows if not r.gating} == {"onnxruntime", "openvino"}
    # the bf16 build really rounds: its output is not the float32 build's
    inputs = make_inputs(bundle.manifest["inputs"], length=64, dim_roles=dim_roles(bundle.manifest))
    bf16_out, fp32_out = LocalRunner(bundle).run(inputs), LocalRunner(tiny_bundle).run(inputs)
    assert all(np.abs(bf16_out[k] - fp32_out[k]).max() > 1e-4 for k in bf16_out)


def _attention_module(heads: int, d: int, with_bias: bool):
    """softmax(Q·Kᵀ·0.125 [+ a per-head T x S bias]) @ V, q/k/v [b, H, t, D] (b, t symbolic)."""
    import tvm
    from tvm import relax, tirx
    b, t = tirx.Var("b", "int64"), tirx.Var("t", "int64")
    q, k, v = (relax.Var(n, relax.TensorType([b, heads, t, d], "float32")) for n in "qkv")
    params = [q, k, v]
    if with_bias:
        params.append(relax.Var("bias", relax.TensorType([heads, t, t], "float32")))
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            kt = bb.emit(relax.op.permute_dims(k, [0, 1, 3, 2]))
            s = bb.emit(relax.op.multiply(relax.op.matmul(q, kt), relax.const(0.125, "float32")))
            if with_bias:
                s = bb.emit(relax.op.add(s, params[3]))
            out = bb.emit_output(relax.op.matmul(bb.emit(relax.op.nn.softmax(s, axis=-1)), v))
        bb.emit_func_output(out)
    return bb.get()


@_needs("amx-bf16")
@pytest.mark.parametrize("with_bias", [False, True], ids=["no_bias", "t5_bias"])
def test_amx_attention_is_the_bf16_products_of_float32_softmax(with_bias):
    """The oracle, in float64: scores from bf16 Q and K, scale and bias, e = exp(s - max),
    out = bf16(e) @ bf16(V) / sum(e): the kernel's arithmetic but for float32 rounding
    (and, where exp lands on a bf16 tie, one rounding step of one probability)."""
    heads, d = 2, 64
    executable = _build(_attention_module(heads, d, with_bias), "amx-bf16")
    assert "tdpbf16ps" in executable.mod.imports[0].inspect_source("asm")
    import tvm
    from tvm import relax
    vm = relax.VirtualMachine(executable, tvm.cpu())
    # t = 64 and 512: whole tiles start from the bias; 512 (2 MiB of bias): items head-major
    for b, t in ((1, 1), (2, 33), (1, 100), (2, 64), (2, 512)):
        rng = np.random.default_rng(t)
        q, k, v = (rng.standard_normal((b, heads, t, d)).astype(np.float32) for _ in range(3))
        bias = rng.standard_normal((heads, t, t)).astype(np.float32)
        args = [q, k, v] + ([bias] if with_bias else [])
        got = vm["main"](*(tvm.runtime.tensor(a) for a in args)).numpy()
        r = lambda x: _widen(_torch_bits(np.ascontiguousarray(x))).astype(np.float64)  # noqa: E731
        s = r(q) @ r(k).transpose(0, 1, 3, 2) * 0.125 + (bias if with_bias else 0)
        e = np.exp(s - s.max(-1, keepdims=True))
        expected = ((r(e.astype(np.float32)) @ r(v)) / e.sum(-1, keepdims=True)).astype(np.float32)
        assert_parity(expected, got, tolerance="float32_abs_1e-3", name=f"amx attention b={b} t={t}")
        logits = q.astype(np.float64) @ k.astype(np.float64).transpose(0, 1, 3, 2) * 0.125 + (bias if with_bias else 0)
        exact = np.exp(logits - logits.max(-1, keepdims=True))
        exact = (exact / exact.sum(-1, keepdims=True)) @ v
        assert_parity(exact.astype(np.float32), got, tolerance="bf16_linear", name=f"vs float64 b={b} t={t}")


@pytest.mark.skipif(not CPU_FLAGS & {"avx512_bf16", "amx_bf16"}, reason="this CPU has no bf16 instructions")
def test_a_bf16_bundle_is_refused_on_a_cpu_without_its_instructions(bundle_factory, monkeypatch):
    """Its first tile instruction would stop the process: the runner says why before."""
    from portable_pe import host_cpu
    from portable_pe.bundle.artifact import BundleError
    from portable_pe.run.local import LocalRunner
    bundle = bundle_factory(TINY_SPEC, precision="bf16")
    kernel = bundle.manifest["bf16"]["kernel"]
    monkeypatch.setattr(host_cpu, "cpu_flags", lambda: CPU_FLAGS - {"amx_tile", "amx_bf16", "avx512_bf16"})
    with pytest.raises(BundleError, match=rf"runs its bf16 kernels on {kernel}, which needs .*this CPU has no "):
        LocalRunner(bundle)


# ------------------------------------------------------------------- aarch64: BFMMLA
#: Jetson AGX Thor's CPU (its TVM tag's host part); Cortex-A78 (Jetson AGX Orin) has no BF16
THOR = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "neoverse-v3ae", "num-cores": 4}


def test_the_kernel_follows_the_architecture_and_its_cpu_features():
    import tvm
    from portable_pe.cpu_schedule.bf16_isa import KERNEL_FEATURES, bf16_kernel
    from portable_pe.cpu_schedule.bf16_matmul import FITS
    cases = [({"mcpu": "sapphirerapids"}, "amx-bf16"), ({"mcpu": "rocketlake", "mattr": ["+avx512bf16"]}, "avx512-bf16"),
             ({"mcpu": "znver3"}, None), (THOR, "neon-bfmmla"),
             ({"mtriple": "aarch64-linux-gnu", "mcpu": "cortex-a78"}, None),
             ({"mtriple": "aarch64-linux-gnu", "mattr": ["+neon", "+bf16"]}, "neon-bfmmla"),
             ({"mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]}, None)]
    for config, kernel in cases:
        assert bf16_kernel(tvm.target.Target({"kind": "llvm", **config})) == kernel, config
    assert set(FITS) == set(KERNEL_FEATURES) == {kernel for _, kernel in cases if kernel}


def _disassemble(path) -> str:
    objdump = shutil.which("aarch64-linux-gnu-objdump")
    if objdump is None:
        pytest.skip("aarch64-linux-gnu-objdump is not on PATH (apt-get install binutils-aarch64-linux-gnu)")
    return subprocess.run([objdump, "-d", str(path)], capture_output=True, text=True, check=True).stdout


def _instructions_per_function(disassembly: str, mnemonic: str) -> dict[str, int]:
    counts, function = {}, None
    for line in disassembly.splitlines():
        header = re.match(r"^[0-9a-f]+ <(.+)>:$", line)
        if header:
            function = header.group(1)
        elif f"\t{mnemonic}\t" in line:
            counts[function] = counts.get(function, 0) + 1
    return counts


@needs_cross
@pytest.mark.parametrize("k, n", [(64, 96), (48, 80)])
def test_the_aarch64_kernel_is_bfmmla_in_the_cross_compiled_object(k, n, tmp_path):
    """The linear layer cross-compiled for Thor's CPU and linked as a bundle's model.so
    is: one kernel whose 8 x 8 float32 tile is 4 x 4 BFMMLA (2 x 2 each) per 4 reduction
    elements, 4 such steps unrolled (NEON_BFMMLA.k_unroll), the bias and GELU in its
    epilogue. (48, 80), no multiple of AMX's 32, is taken as it is (K in steps of 4, N in
    panels of 8)."""
    from portable_pe.backends import arm
    mod, _, _ = _matmul_module(k, n)
    path = tmp_path / "model.so"
    arm.export_library(_build_for(mod, THOR), path)
    counts = _instructions_per_function(_disassemble(path), "bfmmla")
    assert len(counts) == 1 and next(iter(counts.values())) == 16 * 4, counts
    assert "gelu" in next(iter(counts)), counts


@needs_cross
@pytest.mark.parametrize("board", ["jetson-agx-orin", "generic"])
def test_a_board_without_bf16_is_refused_with_the_feature_it_lacks(board, tmp_path, capsys):
    from portable_pe.cli.main import main as cli
    rc = cli(["compile", str(TINY_SPEC), "--target", "arm", "--board", board, "--precision", "bf16",
              "--out", str(tmp_path / "b")])
    err = capsys.readouterr().err
    assert rc != 0 and not (tmp_path / "b" / "model.so").exists()
    cpu = "cortex-a78" if board == "jetson-agx-orin" else "generic aarch64"
    assert re.search(rf"--precision bf16 needs an aarch64 CPU with bf16 \(FEAT_BF16: BFMMLA, BFDOT\); this board's "
                     rf"CPU \({cpu}\) has none.*--board jetson-agx-thor", err), err
