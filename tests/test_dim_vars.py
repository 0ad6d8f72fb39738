"""Compound dims get variables of their own (cpu_schedule/dim_vars.py): a pixel graph's token
count H // p * (W // p) + k reaches the kernels as a variable, as a text graph's T does,
a wrong shape still fails at run time, and graphs whose dims are affine are left alone."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")
from tvm import relax, tirx  # noqa: E402

from portable_pe.cpu_schedule.dim_vars import name_compound_dims  # noqa: E402

VISION = Path(__file__).parent / "data" / "vision"


def _dims(mod) -> list:
    """Every dim of every tensor a binding of `main` makes, MatchCast sources left out."""
    dims = []
    for block in mod["main"].body.blocks:
        for binding in block.bindings:
            ty = binding.var.ty
            if isinstance(ty, relax.TensorType) and isinstance(ty.shape, relax.ShapeExpr):
                dims.append((binding.var.name, list(ty.shape.values)))
    return dims


def _patch_rows(bb, x, weight):
    """x (1, 8, H, W) through a 4 x 4 patch stem with `weight` (16, 8, 4, 4): the
    [1, H // 4 * (W // 4), 16] patch rows, as a ViT's stem makes them."""
    h, w = x.ty.shape.values[2:]
    grid = bb.emit(relax.op.nn.conv2d(x, relax.const(weight), strides=4))
    rows = bb.emit(relax.op.reshape(grid, [1, 16, (h // 4) * (w // 4)]))
    return bb.emit(relax.op.permute_dims(rows, [0, 2, 1]))


def _numpy_patch_rows(x, weight):
    """_patch_rows in numpy (its own conv): the rows past the last whole patch are dropped."""
    h, w = x.shape[2] // 4, x.shape[3] // 4
    patches = x[:, :, :h * 4, :w * 4].reshape(1, 8, h, 4, w, 4)
    return np.einsum("bchpwq,ocpq->bhwo", patches, weight).reshape(1, -1, 16)


def _pixel_module(body):
    """main(x (1, 8, H, W)), its dataflow written by ``body(bb, x)``, which returns the output."""
    h, w = tirx.Var("h", "int64"), tirx.Var("w", "int64")
    x = relax.Var("x", relax.TensorType([1, 8, h, w], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(body(bb, x))
        bb.emit_func_output(out)
    return bb.get()


def _stem_module():
    """x (1, 8, H, W) -> a patch grid of H // 4 x W // 4 -> 2 prefix rows + the patches -> a
    linear: the shapes of a ViT, with nothing else."""
    rng = np.random.default_rng(0)

    def body(bb, x):
        rows = _patch_rows(bb, x, rng.standard_normal((16, 8, 4, 4)).astype("float32"))
        tokens = bb.emit(relax.op.concat([relax.const(np.ones((1, 2, 16), "float32")), rows], axis=1))
        return bb.emit(relax.op.matmul(tokens, relax.const(rng.standard_normal((16, 32)).astype("float32"))))

    return _pixel_module(body)


def test_every_dim_after_the_first_is_a_variable_or_a_constant():
    named = name_compound_dims(_stem_module())
    dims = _dims(named)
    compound = [(name, d) for name, ds in dims for d in ds if not isinstance(d, (tirx.IntImm, tirx.Var))]
    # only the bindings the match_casts read keep the expression (the conv's H // 4, the flattened grid, ...)
    assert compound and all(name.endswith("_dims") for name, _ in compound), compound
    matmul = [ds for name, ds in dims if name == dims[-1][0]][0]
    assert isinstance(matmul[1], tirx.Var), matmul  # the token count: one variable, not 2 + H // 4 * (W // 4)


def test_the_named_graph_runs_and_a_wrong_shape_fails_loudly():
    backend, target = _llvm()
    plain, named = _stem_module(), name_compound_dims(_stem_module())
    run = {name: relax.VirtualMachine(tvm.compile(mod, target=target, relax_pipeline=backend.relax_pipeline(target)),
                                      tvm.cpu())["main"] for name, mod in (("plain", plain), ("named", named))}
    rng = np.random.default_rng(1)
    for h, w in ((8, 12), (16, 16), (9, 14)):  # 9 x 14: the conv drops the rows that are not whole patches
        x = tvm.runtime.tensor(rng.standard_normal((1, 8, h, w)).astype("float32"))
        want, got = run["plain"](x).numpy(), run["named"](x).numpy()
        assert got.shape == want.shape == (1, 2 + (h // 4) * (w // 4), 32)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _llvm():
    """(backend, tvm target) for this machine's llvm target."""
    from portable_pe.backends import get_backend
    from portable_pe.backends.targets import load_target
    spec = load_target("llvm")
    backend = get_backend(spec.backend)
    return backend, backend.tvm_target(spec)


def _fused_kernels_and_main(make_module):
    """The kernel names the CPU fusion passes make of ``make_module()``, and its main compiled."""
    from portable_pe.cpu_schedule.pipeline import fusion_passes
    backend, target = _llvm()
    with target:
        fused = tvm.transform.Sequential(fusion_passes())(make_module())
    kernels = [gv.name_hint for gv, f in fused.functions_items() if isinstance(f, tirx.PrimFunc)]
    built = tvm.compile(make_module(), target=target, relax_pipeline=backend.relax_pipeline(target))
    return kernels, relax.VirtualMachine(built, tvm.cpu())["main"]


def _prefix_slice_module():
    """The stem's tokens (2 prefix rows + the patches), then the patches alone sliced back out
    and scaled by a per-patch table made by a second stem: DINOv3's patch tokens before its
    2D RoPE, whose cos/sin tables also come from a kernel of their own."""
    def body(bb, x):
        weights = np.random.default_rng(0).standard_normal((2, 16, 8, 4, 4)).astype("float32")
        rows, table = (_patch_rows(bb, x, weight) for weight in weights)
        tokens = bb.emit(relax.op.concat([relax.const(np.ones((1, 2, 16), "float32")), rows], axis=1))
        tokens = bb.emit(relax.op.add(tokens, relax.const(np.float32(1.0))))
        patches = bb.emit(relax.op.strided_slice(tokens, [1], [2], [tokens.ty.shape.values[1]], assume_inbound=True))
        return relax.op.multiply(patches, table)

    return _pixel_module(body)


def test_a_slice_as_long_as_a_named_dim_is_that_dims_length(caplog):
    """x[:, 2:] of the 2 + n tokens is n long; written so, it needs no match_cast, so FuseOps
    puts the slice in its reader's kernel instead of copying the patches out first."""
    named = name_compound_dims(_prefix_slice_module())
    slices = [b for block in named["main"].body.blocks for b in block.bindings
              if isinstance(b, relax.VarBinding) and isinstance(b.value, relax.Call)
              and getattr(b.value.op, "name", "") == "relax.strided_slice"]
    assert len(slices) == 1 and isinstance(slices[0].var.ty.shape.values[1], tirx.Var), slices
    cast_sources = [b.value for block in named["main"].body.blocks for b in block.bindings
                    if isinstance(b, relax.MatchCast)]
    assert not any(src.same_as(slices[0].var) for src in cast_sources)

    with caplog.at_level(logging.INFO, logger="portable_pe.cpu_schedule"):
        kernels, run = _fused_kernels_and_main(_prefix_slice_module)
    assert "cannot fuse" not in caplog.text, caplog.text  # the module fused is the one above
    # (the stem's own strided_slice, the pixels cut to whole patches, is a kernel of its own)
    assert [k for k in kernels if "strided_slice" in k and "multiply" in k], kernels
    weights = np.random.default_rng(0).standard_normal((2, 16, 8, 4, 4)).astype("float32")
    for h, w in ((8, 12), (16, 16)):
        x = np.random.default_rng(h).standard_normal((1, 8, h, w)).astype("float32")
        grid, table = (_numpy_patch_rows(x, weight) for weight in weights)
        np.testing.assert_allclose(run(tvm.runtime.tensor(x)).numpy(), (grid + 1.0) * table, rtol=1e-4, atol=1e-4)


def _prefix_transpose_module():
    """The stem's tokens (2 prefix rows + the patches) scaled, then transposed: DINOv3's keys
    (prefix beside the rotated patches) on their way to Kᵀ."""
    def body(bb, x):
        rows = _patch_rows(bb, x, np.random.default_rng(0).standard_normal((16, 8, 4, 4)).astype("float32"))
        scaled = bb.emit(relax.op.multiply(rows, relax.const(np.float32(3.0))))
        keys = bb.emit(relax.op.concat([relax.const(np.ones((1, 2, 16), "float32")), scaled], axis=1))
        keys_t = bb.emit(relax.op.permute_dims(keys, [0, 2, 1]))
        return relax.op.sum(keys_t, axis=[1])

    return _pixel_module(body)


def test_a_cast_waits_for_the_transpose_that_is_its_values_one_use():
    """concat(prefix, patches) is inferred 2 + n long where the token count's name is n'; the
    match_cast goes after the transpose that reads it, so the two fuse into one kernel."""
    named = name_compound_dims(_prefix_transpose_module())
    bindings = [b for block in named["main"].body.blocks for b in block.bindings]
    cast_of = {b.value: b.var for b in bindings if isinstance(b, relax.MatchCast)}
    concat = [b for b in bindings
              if isinstance(b.value, relax.Call) and getattr(b.value.op, "name", "") == "relax.concat"]
    assert len(concat) == 1 and concat[0].var not in cast_of, concat
    last = [b for b in bindings if isinstance(b.value, relax.Call)
            and getattr(b.value.op, "name", "") == "relax.permute_dims"][-1]
    assert last.var in cast_of  # the transpose's result is named, and checked at run time
    assert isinstance(cast_of[last.var].ty.shape.values[2], tirx.Var)

    kernels, run = _fused_kernels_and_main(_prefix_transpose_module)
    assert [k for k in kernels if "transpose" in k.partition("concatenate")[2]], kernels
    weight = np.random.default_rng(0).standard_normal((16, 8, 4, 4)).astype("float32")
    for h, w in ((8, 12), (12, 4)):
        x = np.random.default_rng(h).standard_normal((1, 8, h, w)).astype("float32")
        grid = _numpy_patch_rows(x, weight)
        want = np.concatenate([np.ones((1, 2, 16), "float32"), grid * 3.0], axis=1).transpose(0, 2, 1).sum(axis=1)
        np.testing.assert_allclose(run(tvm.runtime.tensor(x)).numpy(), want, rtol=1e-4, atol=1e-4)


def test_affine_graphs_are_left_alone():
    """A text graph's T and a KV cache's past + T are already what the kernels want."""
    t, past = tirx.Var("T", "int64"), tirx.Var("past", "int64")
    x = relax.Var("x", relax.TensorType([1, t, 16], "float32"))
    cache = relax.Var("cache", relax.TensorType([1, past, 16], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, cache]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.concat([cache, x], axis=1))
        bb.emit_func_output(out)
    mod = bb.get()
    assert name_compound_dims(mod).same_as(mod)


@pytest.mark.parametrize("spec", sorted(p.name for p in VISION.glob("tiny_*.toml")))
def test_a_vision_graphs_kernels_see_its_token_count_named(spec, caplog):
    """The CPU pipeline names them before fusing: the MLP's matmul kernel sees a variable
    row count and takes no height or width of its own. Every shipped vision graph's tiny
    twin, each fused from its named module: where TVM cannot fuse one, the module as
    imported is (a slice-length rewrite did that to the learned, sin-cos and relative-bias
    ViTs until WithNamedDims learned to name them again without it)."""
    from portable_pe.compile.pipeline import prepare
    from portable_pe.cpu_schedule.pipeline import fusion_passes
    st = prepare(str(VISION / spec), target="llvm", log=lambda _: None)
    with st.tvm_target, caplog.at_level(logging.INFO, logger="portable_pe.cpu_schedule"):
        fused = tvm.transform.Sequential(fusion_passes())(st.relax)
    matmuls = {gv.name_hint: f for gv, f in fused.functions_items()
               if isinstance(f, tirx.PrimFunc) and "matmul" in gv.name_hint and "gelu" in gv.name_hint}
    assert matmuls, sorted(gv.name_hint for gv in fused.get_global_vars())
    for name, func in matmuls.items():
        params = [p.name for p in func.params]
        assert "height" not in params and "width" not in params, (name, params)
    # fused from a named module, not the module as imported
    assert "fusing it as imported" not in caplog.text, caplog.text


def test_where_the_named_module_cannot_be_fused_the_module_as_imported_is():
    """WithNamedDims: a fusion pass that fails on the named module (as TVM 0.27's FuseTIR
    does on some exports), and on each lesser naming of it that differs, gets the module as
    it came; one that succeeds gets the named one."""
    from portable_pe.cpu_schedule.dim_vars import WithNamedDims
    seen = []

    @tvm.transform.module_pass(opt_level=0, name="RefusesMatchCast")
    def refuses_match_cast(mod, _ctx):
        named = "match_cast" in mod["main"].script()
        seen.append(named)
        if named:
            raise RuntimeError("Check failed: All shape inputs are expected to be single tirx var.")
        return mod

    out = WithNamedDims([refuses_match_cast])(_stem_module())
    # neither rewrite fires on the stem alone: every naming is the first, fused once, then
    # the module as imported
    assert seen == [True, False] and "match_cast" not in out["main"].script()
    seen.clear()
    # the keys' concat moves its cast after the transpose: that naming, the naming without
    # it (the slice-less one is the same module, not fused again), then as imported
    WithNamedDims([refuses_match_cast])(_prefix_transpose_module())
    assert seen == [True, True, False]

    @tvm.transform.module_pass(opt_level=0, name="Accepts")
    def accepts(mod, _ctx):
        return mod

    assert "match_cast" in WithNamedDims([accepts])(_stem_module())["main"].script()
