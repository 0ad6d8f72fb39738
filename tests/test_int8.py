"""--precision int8: calibrated QDQ graphs, their matmuls as integer kernels per ISA, and
int8 bundles checked against PyTorch float32 (onnxruntime's int8 side by side).

Kernels run here for this machine's ISA and for the uint8 (VNNI-style) and int8
(sdot-style) operand layouts through plain TIR; the VNNI and sdot instructions themselves
are compiled and found in the assembly (they run on the emulated board for aarch64, see
test_deploy.py; x86 VNNI needs a CPU that has it)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from portable_pe.cpu_schedule import int8_isa as isa_module
from portable_pe.cpu_schedule.int8_isa import ISAS, DotIsa
from portable_pe.run.parity import TOLERANCES, check_bundle

from conftest import TINY_SPEC

K, N1, N2 = 64, 48, 32


def _qdq_model(seed: int = 0, dims: tuple[int, int, int] = (K, N1, N2), w_max: int = 127,
               extreme: bool = False) -> onnx.ModelProto:
    """x -> Q/DQ -> MatMul(W1) + b1 -> Relu -> Q/DQ -> MatMul(W2): two int8 matmuls, the
    second fed by a requantized activation, like an encoder's feed-forward block. Weights
    within +-w_max; ``extreme``: every weight is -w_max or +w_max."""
    K, N1, N2 = dims  # noqa: N806 (the module's names for the same dims)
    rng = np.random.default_rng(seed)
    if extreme:
        w1, w2 = (rng.choice([-w_max, w_max], shape).astype(np.int8) for shape in ((K, N1), (N1, N2)))
    else:
        w1 = rng.integers(-w_max, w_max + 1, (K, N1)).astype(np.int8)
        w2 = rng.integers(-w_max, w_max + 1, (N1, N2)).astype(np.int8)
    inits = [numpy_helper.from_array(a, n) for a, n in [
        (w1, "w1"), (rng.uniform(1e-3, 4e-3, N1).astype(np.float32), "w1_s"), (np.zeros(N1, np.int8), "w1_z"),
        (w2, "w2"), (rng.uniform(1e-3, 4e-3, N2).astype(np.float32), "w2_s"), (np.zeros(N2, np.int8), "w2_z"),
        (np.float32(0.03), "x_s"), (np.int8(-7), "x_z"), (np.float32(0.02), "h_s"), (np.int8(-100), "h_z"),
        (rng.standard_normal(N1).astype(np.float32), "b1")]]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_s", "x_z"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "x_s", "x_z"], ["xd"]),
        helper.make_node("DequantizeLinear", ["w1", "w1_s", "w1_z"], ["w1d"], axis=1),
        helper.make_node("MatMul", ["xd", "w1d"], ["m1"]),
        helper.make_node("Add", ["m1", "b1"], ["a1"]),
        helper.make_node("Relu", ["a1"], ["h"]),
        helper.make_node("QuantizeLinear", ["h", "h_s", "h_z"], ["hq"]),
        helper.make_node("DequantizeLinear", ["hq", "h_s", "h_z"], ["hd"]),
        helper.make_node("DequantizeLinear", ["w2", "w2_s", "w2_z"], ["w2d"], axis=1),
        helper.make_node("MatMul", ["hd", "w2d"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", K])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", N2])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


def _exact(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    """The QDQ graph's arithmetic in numpy: integer matmuls exact in int64, float64 after."""
    w = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}

    def quantize(v, s, z):  # ONNX QuantizeLinear: float32 division, round half to even, saturate
        return np.clip(np.rint(v / s) + z, -128, 127).astype(np.int64)
    xq = quantize(x, w["x_s"], w["x_z"]) - int(w["x_z"])
    h = np.maximum((xq @ w["w1"].astype(np.int64)) * (np.float64(w["x_s"]) * w["w1_s"].astype(np.float64))
                   + w["b1"], 0).astype(np.float32)
    hq = quantize(h, w["h_s"], w["h_z"]) - int(w["h_z"])
    return (hq @ w["w2"].astype(np.int64)) * (np.float64(w["h_s"]) * w["w2_s"].astype(np.float64))


def _build(model, target):
    import tvm
    from portable_pe.backends.llvm import with_reassociation
    from portable_pe.cpu_schedule import cpu_pipeline
    from portable_pe.compile.frontend import import_onnx
    target = with_reassociation(tvm.target.Target(target))
    return tvm.compile(import_onnx(model), target=target, relax_pipeline=cpu_pipeline(target))


def _plain(a_dtype: str) -> DotIsa:
    """The uint8 (VNNI) or int8 (sdot) operand layout without the instruction: plain TIR."""
    return DotIsa(f"plain-{a_dtype}", a_dtype, "int8", 8, 4, None, 4, 2)


def _amx_int8_missing() -> str | None:
    from portable_pe.host_cpu import amx_permitted, cpu_flags
    if not {"amx_tile", "amx_int8"} <= cpu_flags() or not amx_permitted():
        return "this CPU has no AMX-INT8 (or Linux refuses its tiles)"
    return None


def _avx2_u8s7_missing() -> str | None:
    from portable_pe.host_cpu import cpu_flags
    if "avx2" not in cpu_flags():
        return "this CPU has no AVX2"
    return None


@pytest.mark.parametrize("variant", ["host", "uint8", "int8", "amx-int8", "avx2-u8s7"])
def test_int8_kernels_compute_the_qdq_graph_exactly(variant, monkeypatch):
    """Integer accumulation: the result is the QDQ graph's up to float rounding of the
    final scale (dynamic T, rows that are no multiple of the tile, batch 2). amx-int8: the
    host's AMX features added, as a compile for it does, and dims the tiles take (K = 1024:
    two chunks of 512 accumulating in memory; then K = 64, one tile step). avx2-u8s7: the
    7-bit kernel (vpmaddubsw) at its bound: every weight +-64 and inputs that saturate the
    activations (uint8 operands 0 and 255), so every int16 pair is as large as it can be."""
    import tvm
    from tvm import relax
    from portable_pe.backends import llvm
    cpu = tvm.target.codegen.llvm_get_system_cpu()
    target, dims = {"kind": "llvm", "mcpu": cpu}, (K, N1, N2)
    if variant == "amx-int8":
        if _amx_int8_missing():
            pytest.skip(_amx_int8_missing())
        target["mattr"] = [f"+{f}" for f in llvm.host_features(cpu)]
        dims = (1024, 64, 32)
    elif variant == "avx2-u8s7":
        if _avx2_u8s7_missing():
            pytest.skip(_avx2_u8s7_missing())
        target = {"kind": "llvm", "mcpu": "haswell"}  # AVX2 without VNNI: what any AVX2 CPU runs
    elif variant != "host":
        monkeypatch.setattr("portable_pe.cpu_schedule.quant_matmul.int8_isas", lambda target: (_plain(variant),))
        monkeypatch.setattr("portable_pe.cpu_schedule.int8_matmul.int8_isas", lambda target: (_plain(variant),))
    model = _qdq_model(dims=dims, w_max=64, extreme=True) if variant == "avx2-u8s7" else _qdq_model(dims=dims)
    executable = _build(model, target)
    if variant == "amx-int8":  # both matmuls on the tiles
        assert executable.mod.imports[0].inspect_source("asm").count("tdpbusd") >= 8
    if variant == "avx2-u8s7":
        asm = executable.mod.imports[0].inspect_source("asm")
        assert "vpmaddubsw" in asm and "vpmaddwd" in asm
    vm = relax.VirtualMachine(executable, tvm.cpu())
    rng = np.random.default_rng(1)
    for batch, seq in [(1, 1), (2, 7), (1, 33)]:
        x = rng.standard_normal((batch, seq, dims[0])).astype(np.float32)
        if variant == "avx2-u8s7":  # +-10 / 0.03 quantizes to 127 or -128: uint8 255 or 0
            x = np.where(x > 0, 10.0, -10.0).astype(np.float32)
        got = vm["main"](tvm.runtime.tensor(x)).numpy()
        want = _exact(model, x)
        assert got.shape == want.shape and got.dtype == np.float32
        # exact integer arithmetic up to float32 rounding (measured ~5e-8 of max|want|), element
        # by element: an exactness check, far tighter than any parity row, so a literal
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


X86_KERNELS = [("znver4", "vpdpbusd", "zmm", 127), ("alderlake", "{vex}\tvpdpbusd", "ymm", 127),
               ("skylake-avx512", "vpmaddwd", "zmm", 127), ("znver3", "vpmaddwd", "ymm", 127),
               ("znver3", "vpmaddubsw", "ymm", 64)]


@pytest.mark.parametrize("mcpu,instruction,register,w_max", X86_KERNELS,
                         ids=[f"{k[0]}-{k[1].split()[-1]}" for k in X86_KERNELS])
def test_x86_int8_kernels_use_the_dot_product_instruction(mcpu, instruction, register, w_max):
    """Each x86 kernel by its CPU; AVX2 without VNNI by the weights' range too: 7-bit
    weights on vpmaddubsw, full-range ones (a QDQ graph quantized elsewhere) on vpmaddwd."""
    asm = _build(_qdq_model(w_max=w_max), {"kind": "llvm", "mcpu": mcpu}).mod.imports[0].inspect_source("asm")
    _assert_two_int8_kernels(asm)
    # the module's only multiplies of integers are the two kernels' (their parallel bodies are
    # local functions of their own, so the instruction is looked for in the whole module)
    assert instruction in asm and any(instruction in line and f"%{register}" in line for line in asm.splitlines())


@pytest.mark.parametrize("board_cpu,instruction", [("neoverse-v1", "smmla\t"), ("cortex-a76", "sdot\t"), ("cortex-a72", "smlal")])
def test_aarch64_int8_kernels(board_cpu, instruction):
    asm = _build(_qdq_model(), {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": board_cpu}
                 ).mod.imports[0].inspect_source("asm")
    _assert_two_int8_kernels(asm)
    assert instruction in asm


def _assert_two_int8_kernels(asm: str) -> None:
    """Both matmuls are integer kernels, and the first one ends in the second's quantize."""
    import re
    kernels = set(re.findall(r"^(?:__tvm_ffi_)?(fused_int8_matmul\w*?)(?:_compute_)?:", asm, re.M))
    assert len(kernels) == 2, kernels
    assert len([k for k in kernels if "relu_quantize" in k]) == 1, kernels


def test_isa_follows_the_cpu_features():
    import tvm
    cases = {"znver4": "avx512-vnni", "alderlake": "avx-vnni", "skylake-avx512": "avx512bw", "znver3": "avx2-u8s7",
             "x86-64": "generic"}
    for mcpu, name in cases.items():
        assert isa_module.int8_isa(tvm.target.Target({"kind": "llvm", "mcpu": mcpu})).name == name, mcpu
    arm = {"mtriple": "aarch64-linux-gnu"}
    assert isa_module.int8_isa(tvm.target.Target({"kind": "llvm", **arm, "mcpu": "neoverse-v1"})).name == "neon-i8mm"
    assert isa_module.int8_isa(tvm.target.Target({"kind": "llvm", **arm, "mcpu": "cortex-a76"})).name == "neon-dotprod"
    assert isa_module.int8_isa(tvm.target.Target({"kind": "llvm", **arm, "mattr": ["+neon"]})).name == "neon"
    assert set(ISAS) == set(cases.values()) | {"neon-i8mm", "neon-dotprod", "neon", "avx2"}
    # only the 7-bit kernel needs 7-bit weights, and it has the int16 kernel behind it
    for mcpu, name in cases.items():
        target = tvm.target.Target({"kind": "llvm", "mcpu": mcpu})
        assert isa_module.reduces_weight_range(target) == (name == "avx2-u8s7"), mcpu
        assert [i.name for i in isa_module.int8_isas(target)] == ([name, "avx2"] if name == "avx2-u8s7" else [name])
    assert not isa_module.reduces_weight_range(tvm.target.Target({"kind": "llvm", **arm, "mcpu": "cortex-a72"}))
    assert ISAS["avx2-u8s7"].takes(np.array([-64, 64], np.int8))
    assert not ISAS["avx2-u8s7"].takes(np.array([65], np.int8)) and not ISAS["avx2-u8s7"].takes(np.array([-128], np.int8))


# ------------------------------------------------------------------- int8 bundles
def test_int8_bundle_parity_against_pytorch(tiny_int8_bundle):
    m = tiny_int8_bundle.manifest
    assert m["precision"] == "int8" and m["tolerance"]["float32"] == TOLERANCES["int8_linear"]
    q = m["quantization"]
    assert q["matmuls_int8"] == 8 and q["matmuls_float"] == 4, q  # 2 layers: q, k, v, out, up, down; QKᵀ, PV
    assert q["calibration_lengths"][0] == 1
    report = check_bundle(tiny_int8_bundle, lengths=(1, 33, 300), batch=2)
    tvm_rows = [r for r in report.rows if r.candidate == "tvm"]
    # ok is the int8_linear row the manifest holds: max abs within 5% of max|ref|, cosine >= 0.999
    assert report.ok and len(tvm_rows) == 3 and all(r.ok and r.gating for r in tvm_rows), report.to_markdown()
    peers = [r for r in report.rows if r.candidate == "onnxruntime"]
    assert len(peers) == 3 and not any(r.gating for r in peers)  # shown side by side, not judged


def test_int8_graph_quantizes_weight_matmuls_only(tiny_int8_bundle):
    model = onnx.load(tiny_int8_bundle.file("model.onnx"))
    producer = {o: n for n in model.graph.node for o in n.output}
    consumers = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    matmuls = [n for n in model.graph.node if n.op_type == "MatMul"]
    quantized = [n for n in matmuls if all(producer.get(i) is not None and producer[i].op_type == "DequantizeLinear"
                                           for i in n.input)]
    assert len(quantized) == 8 and len(matmuls) == 12
    for n in quantized:  # float outputs: no re-quantization before the bias and residual
        assert all(c.op_type != "QuantizeLinear" for c in consumers.get(n.output[0], [])), n.name
    # 7-bit weights exactly where the host's kernel needs them (x86 without VNNI), else 8 bits
    import tvm
    from portable_pe.cpu_schedule.int8_isa import reduces_weight_range
    host = tvm.target.Target({"kind": "llvm", "mcpu": tvm.target.codegen.llvm_get_system_cpu()})
    weights = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    w_max = max(int(np.abs(weights[producer[n.input[1]].input[0]].astype(np.int16)).max()) for n in quantized)
    reduced = reduces_weight_range(host)
    assert w_max == (64 if reduced else 127), w_max
    assert ("7 bits" in tiny_int8_bundle.manifest["quantization"]["weights"]) == reduced


def test_precision_is_checked_per_target(tmp_path):
    from portable_pe.compile.pipeline import compile_graph
    with pytest.raises(ValueError, match=r"target 'cuda' builds precision fp32, not 'int8'"):
        compile_graph(str(TINY_SPEC), target="cuda", precision="int8", out=tmp_path / "b", log=lambda m: None)
    with pytest.raises(ValueError, match=r"target 'npu' builds precision int8, not 'fp32'"):
        compile_graph(str(TINY_SPEC), target="npu", precision="fp32", out=tmp_path / "b", log=lambda m: None)
    with pytest.raises(ValueError, match=r"unknown precision 'int4'; valid: fp32, int8"):
        compile_graph(str(TINY_SPEC), target="llvm", precision="int4", out=tmp_path / "b", log=lambda m: None)
    assert not (tmp_path / "b").exists()


def test_cli_precision_choices_and_exit_code(capsys):
    from portable_pe.cli.main import main
    from portable_pe.quant import PRECISIONS
    assert main(["compile", str(TINY_SPEC), "--target", "cuda", "--precision", "int8"]) == 2
    assert "builds precision fp32, not 'int8'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["compile", str(TINY_SPEC), "--precision", "int4"])
    assert "choose from " + ", ".join(f"'{p}'" for p in PRECISIONS) in capsys.readouterr().err


def test_every_kernel_keeps_its_noalias_compute_function_beside_the_vms_shape_function():
    """TVM's CPU codegen treats the pointer arguments of a function without `tirx.noalias`
    as aliasing for the rest of the LLVM module; the VM's shape function had none, and the
    kernels codegen'd after it were inlined into their packed wrappers without noalias (the
    int8 kernels of sinusoidal and alibi ran 4x slower). With ShapeFuncsNoAlias every kernel
    keeps its `_compute_` function, whatever the order."""
    import tvm
    from portable_pe.backends.llvm import with_reassociation
    from portable_pe.compile.pipeline import STAGES, run_stages
    from portable_pe.compile.state import CompileRequest, CompileState
    from portable_pe.cpu_schedule import cpu_pipeline
    from portable_pe.backends.targets import load_target
    st = CompileState(CompileRequest(source=str(Path(__file__).parent / "data" / "guide" / "tiny_sinusoidal.toml"),
                                     target=load_target("llvm"), precision="int8", use_tuning=False),
                      log=lambda m: None)
    run_stages(st, [s for s in STAGES if s[0] in ("target", "load", "export", "simplify", "legalize", "quantize",
                                                  "import")])
    target = with_reassociation(st.tvm_target)
    with target:
        mod = cpu_pipeline(target)(st.relax)
    kernels = {gv.name_hint: f for gv, f in mod.functions_items()
               if isinstance(f, tvm.tirx.PrimFunc) and gv.name_hint.startswith("fused_int8_matmul")}
    assert kernels and "shape_func" in {gv.name_hint for gv, _ in mod.functions_items()}
    # the shape function first: the order in which the leak hurt
    pair = tvm.IRModule({"shape_func": mod["shape_func"], **kernels})
    ir = tvm.compile(pair, target=target).mod.inspect_source("ll")
    for name in kernels:
        assert f"@{name}_compute_(" in ir, f"{name} lost its noalias compute function"


_TINY_ALIBI_32 = """# 2 layers, d=64, 2 heads of 32 (the AMX attention's head dims), ALiBi
name = "tiny_alibi_32"
seed = 11

[model]
d_model = 64
n_heads = 2
n_layers = 2
d_ff = 128

[encoding]
name = "alibi"

[export]
example_length = 16
max_length = 1024
"""


def test_int8_attention_runs_on_amx_tiles_no_less_accurate_than_onnxruntime_int8(tmp_path):
    """On a CPU with AMX-BF16 an int8 build's attention (not quantized) takes the bf16
    tile kernel: the manifest says so (the run-time instruction check reads it), and the
    output stays as close to PyTorch float32 as onnxruntime's int8 of the same QDQ graph,
    at a length whose blocks start from the ALiBi bias in the tiles (64) and two that do
    not (1, 33)."""
    from portable_pe.compile.pipeline import compile_graph
    from portable_pe.host_cpu import amx_permitted, cpu_flags
    if not {"amx_tile", "amx_bf16"} <= cpu_flags() or not amx_permitted():
        pytest.skip("this CPU has no AMX-BF16 (or Linux refuses its tiles): int8 attention stays float32")
    spec = tmp_path / "tiny_alibi_32.toml"
    spec.write_text(_TINY_ALIBI_32)
    bundle = compile_graph(str(spec), target="llvm", precision="int8", out=tmp_path / "b", log=lambda m: None)
    assert bundle.manifest["bf16"] == {"kernel": "amx-bf16", "attentions_bf16": 2, "attentions_float32": 0}
    report = check_bundle(bundle, lengths=(1, 33, 64), batch=2)
    assert report.ok, report.to_markdown()
    rows = {(r.candidate, r.length): r for r in report.rows}
    for t in (1, 33, 64):
        assert rows[("tvm", t)].cosine >= rows[("onnxruntime", t)].cosine - 1e-6, report.to_markdown()


def test_an_amx_int8_bundle_is_refused_on_a_cpu_without_amx_int8(tmp_path, monkeypatch):
    """Its first tile instruction would stop the process: the runner says why before."""
    if _amx_int8_missing():
        pytest.skip(_amx_int8_missing())
    from portable_pe import host_cpu
    from portable_pe.bundle.artifact import BundleError
    from portable_pe.compile.pipeline import compile_graph
    from portable_pe.run.local import LocalRunner
    bundle = compile_graph(str(TINY_SPEC), target="llvm", precision="int8", out=tmp_path / "b", log=lambda m: None)
    assert bundle.manifest["int8"] == {"kernel": "amx-int8"}
    flags = host_cpu.cpu_flags()
    monkeypatch.setattr(host_cpu, "cpu_flags", lambda: flags - {"amx_int8"})
    with pytest.raises(BundleError, match=r"runs its int8 kernels on amx-int8, which needs amx_tile, amx_int8; "
                                          r"this CPU has no amx_int8"):
        LocalRunner(bundle)


def test_a_split_projections_biases_go_into_its_int8_kernel(tiny_int8_bundle):
    """The q/k/v projection's per-part biases are added in the int8 kernel's float epilogue
    (split_bias.py, as in float32 builds), not by the kernels that copy the parts out."""
    import re
    names = set(re.findall(rb"fused_[a-z0-9_]+", tiny_int8_bundle.file("model.so").read_bytes()))
    # a part's copy that adds its bias: the add right after the slice (RoPE's own adds and
    # subtracts, later in a copy's name, rotate the part)
    copies_adding = [n for n in names if re.search(rb"(strided_slice\d*|split)_add\d", n)]
    assert not copies_adding, copies_adding
    assert any(re.fullmatch(rb"fused_int8_matmul\w*_multiply\w*_add\d+\w*", n) for n in names), names
