"""Untuned CPU schedules for Relax-compiled Transformer encoders (TVM 0.27).

The stock Relax CPU pipeline (``relax/backend/cpu_generic/pipeline.py``) legalizes
and fuses operators but applies no schedule: every PrimFunc stays a serial,
scalar loop nest.  This module adds a rule-based scheduler, in the spirit of
``tvm.s_tir.dlight`` GPU rules, that gives every PrimFunc a parallel,
vectorized, register-tiled CPU schedule without any tuning:

* matmul / dense / batch-matmul (``C[..., i, j] += A[..., i, k] * B[..., k, j]``,
  including 4-D attention matmuls with a symbolic sequence length) get a
  register-blocked micro-kernel: ``i`` tiled by ``MI`` rows (unrolled), ``j``
  tiled by ``NJ`` lanes (vectorized), the reduction innermost over the tile,
  epilogue (bias, scale, GELU, residual ...) computed per tile;
* row reductions (softmax, layer-norm, RMS-norm, mean ...) get one parallel
  loop over rows, with all the row's stages computed inside it and the
  elementwise stages vectorized;
* everything else (transposes, RoPE slice/concat chains, splits, casts, ...)
  gets the generic rule: parallel outer fused loop, vectorized inner loop.

Symbolic extents are handled by splitting with fixed factors; TVM adds a
predicate for the tail and the TIR ``LoopPartition`` pass peels it.

Every function is scheduled independently inside ``try``: if a rule raises, the
function is left unscheduled (logged at debug level) and the compile goes on.

Public API
----------
``cpu_schedule_passes(target) -> list[Pass]``
    Passes to insert after legalization/fusion, before TIR lowering.
``cpu_pipeline(target) -> Pass``
    A full Relax pipeline for ``tvm.compile(..., relax_pipeline=...)``.
"""

from __future__ import annotations

import logging

import tvm
from tvm import relax, s_tir, tirx
from tvm.ir import IRModule

logger = logging.getLogger(__name__)

__all__ = ["cpu_schedule_passes", "cpu_pipeline", "schedule_prim_func", "CPUDefaultSchedule"]

_SCHEDULED_ATTR = "tirx.is_scheduled"


# --------------------------------------------------------------------------------------
# Target helpers
# --------------------------------------------------------------------------------------
def _vector_lanes(target, dtype_bits: int = 32) -> int:
    """Number of lanes of the widest SIMD register for the given element width."""
    bits = 128
    try:
        mcpu = str(target.attrs.get("mcpu", "")) if target is not None else ""
        mattr = [str(a) for a in target.attrs.get("mattr", [])] if target is not None else []
        mtriple = str(target.attrs.get("mtriple", "")) if target is not None else ""
    except Exception:  # pragma: no cover - defensive
        mcpu, mattr, mtriple = "", [], ""
    avx512_cpus = (
        "skylake-avx512", "cascadelake", "cooperlake", "icelake", "tigerlake",
        "sapphirerapids", "emeraldrapids", "graniterapids", "znver4", "znver5",
        "rocketlake", "cannonlake", "x86-64-v4",
    )
    avx2_cpus = (
        "haswell", "broadwell", "skylake", "alderlake", "raptorlake", "meteorlake",
        "znver1", "znver2", "znver3", "x86-64-v3", "core-avx2",
    )
    if any(a.startswith("+avx512f") for a in mattr) or any(mcpu.startswith(c) for c in avx512_cpus):
        bits = 512
    elif any(a.startswith("+avx2") for a in mattr) or any(mcpu.startswith(c) for c in avx2_cpus):
        bits = 256
    elif "aarch64" in mtriple or "arm" in mtriple:
        bits = 128
    return max(1, bits // max(dtype_bits, 8))


def _num_cores(target) -> int:
    try:
        n = int(target.attrs.get("num-cores", 0))
    except Exception:  # pragma: no cover
        n = 0
    return n if n > 0 else 1


# --------------------------------------------------------------------------------------
# Small TIR helpers
# --------------------------------------------------------------------------------------
def _const_int(expr):
    if isinstance(expr, int):
        return expr
    if _node(expr) == "IntImm":
        return int(expr.value)
    return None


def _loop_extent(sch, loop):
    return _const_int(sch.get(loop).extent)


def _root_block(sch):
    func = sch.mod["main"]
    return sch.get_sblock(func.body.block.name_hint)


def _iter_kind(iv) -> str:
    if iv.iter_type == tirx.IterVar.DataPar:
        return "S"
    if iv.iter_type == tirx.IterVar.CommReduce:
        return "R"
    return "O"


def _block_kinds(sch, block) -> str:
    return "".join(_iter_kind(iv) for iv in sch.get(block).iter_vars)


def _is_spatial(sch, block) -> bool:
    return all(k == "S" for k in _block_kinds(sch, block))


def _loops_are_plain(sch, block) -> bool:
    """Loops map 1:1 to block iters (normalized nest), no annotations."""
    loops = sch.get_loops(block)
    return len(loops) == len(sch.get(block).iter_vars)


def _node(expr) -> str:
    # TVM 0.27 moved PrimExpr classes to tvm.ir.prim.expr; tirx.Add etc. are not
    # the classes of the nodes found in PrimFuncs, so compare class names.
    return type(expr).__name__


def _is_load(expr) -> bool:
    # TVM 0.27: tirx.BufferLoad is a factory returning ir.TensorLoad (buffer in
    # ``.source``); older versions have BufferLoad with ``.buffer``.
    return _node(expr) in ("TensorLoad", "BufferLoad") and hasattr(expr, "indices")


def _load_buffer(expr):
    return expr.buffer if hasattr(expr, "buffer") else expr.source


def _is_store(stmt) -> bool:
    return hasattr(stmt, "buffer") and hasattr(stmt, "indices") and hasattr(stmt, "value")


def _region_buffer(region):
    # TVM 0.27: read/write regions are ir.TensorRegion with the buffer in ``.source``.
    return region.buffer if hasattr(region, "buffer") else region.source


def _expr_vars(expr) -> set:
    """Free variables of a TIR expression."""
    try:
        return set(tirx.analysis.undefined_vars(expr, []))
    except Exception:  # pylint: disable=broad-except
        return set()


def _try_inline_spatial(sch, blocks):
    """Inline cheap injective blocks; return remaining blocks in order."""
    changed = True
    while changed:
        changed = False
        for blk in list(blocks):
            if not _is_spatial(sch, blk):
                continue
            # Keep blocks whose result feeds several consumers and that contain
            # transcendental math (e.g. softmax exp): inlining would recompute it.
            try:
                consumers = sch.get_consumers(blk)
            except Exception:
                consumers = []
            if len(consumers) > 1 and (_has_expensive_math(sch.get(blk)) or _is_big(sch.get(blk))):
                continue
            try:
                sch.compute_inline(blk)
                blocks.remove(blk)
                changed = True
                break
            except Exception:  # pylint: disable=broad-except
                pass
            try:
                sch.reverse_compute_inline(blk)
                blocks.remove(blk)
                changed = True
                break
            except Exception:  # pylint: disable=broad-except
                pass
    return blocks


_EXPENSIVE_OPS = ("exp", "log", "tanh", "erf", "sigmoid", "pow", "sqrt", "rsqrt", "sin", "cos")


def _is_big(block) -> bool:
    """Large expression (e.g. an expanded polynomial fast_exp): not worth recomputing."""
    try:
        return len(str(block.body)) > 600
    except Exception:  # pylint: disable=broad-except
        return True


def _has_expensive_math(block) -> bool:
    """Whether the block body calls transcendental math (or divides)."""
    try:
        text = str(block.body)
    except Exception:  # pylint: disable=broad-except
        return True
    return any(f"{k}(" in text for k in _EXPENSIVE_OPS) or " / " in text


def _vectorize_inner(sch, loop, lanes):
    """Split ``loop`` by ``lanes`` and vectorize the inner part, if worthwhile.

    Returns the outer loop (or the loop itself when nothing was done)."""
    ext = _loop_extent(sch, loop)
    if ext is not None:
        if ext <= 1:
            return loop
        if ext <= lanes:
            sch.vectorize(loop)
            return None
        if ext % lanes == 0:
            outer, inner = sch.split(loop, [None, lanes])
            sch.vectorize(inner)
            return outer
        # static but not divisible: vectorize the largest power-of-two divisor
        vec = 1
        while vec * 2 <= lanes and ext % (vec * 2) == 0:
            vec *= 2
        if vec >= 4:
            outer, inner = sch.split(loop, [None, vec])
            sch.vectorize(inner)
            return outer
        return loop
    # Dynamic extent: a split would put a lane-dependent predicate in the
    # vector body, which TVM's VectorizeLoop scalarizes (and TIR LoopPartition
    # does not peel non-`likely` block predicates).  Leave the loop serial:
    # LLVM's loop vectorizer handles runtime trip counts with its own epilogue.
    return loop


def _parallel_outer(sch, loops, min_chunk=1):
    """Fuse the given (outer, spatial) loops and parallelize the result."""
    loops = [l for l in loops if l is not None]
    if not loops:
        return None
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    sch.parallel(fused)
    return fused


# --------------------------------------------------------------------------------------
# Rule: generic injective fallback
# --------------------------------------------------------------------------------------
def _schedule_spatial_block(sch, block, lanes, parallel=True):
    loops = sch.get_loops(block)
    if not loops:
        return
    inner = loops[-1]
    rest = list(loops[:-1])
    ext = _loop_extent(sch, inner)
    # Vectorize the innermost loop when its extent is static (contiguous in
    # practice); for a dynamic innermost dim, split and vectorize with a tail.
    outer = _vectorize_inner(sch, inner, lanes)
    if outer is not None and outer is not inner:
        # keep outer part of the innermost dim serial inside the parallel loop
        pass
    if parallel and rest:
        _parallel_outer(sch, rest)
    elif parallel and outer is not None and ext is None:
        sch.parallel(outer)


# --------------------------------------------------------------------------------------
# Rule: matmul
# --------------------------------------------------------------------------------------
def _match_matmul(sch, block):
    """Return (batch_iters, i_var, j_var, k_var) if block is C[.., i, j] += A[.., i, k]*B[.., k, j]."""
    stmt = sch.get(block)
    kinds = _block_kinds(sch, block)
    if kinds.count("R") != 1 or not kinds.endswith("R") or "O" in kinds:
        return None
    if len(stmt.writes) != 1 or len(stmt.reads) < 2:
        return None
    if stmt.init is None:
        return None
    body = stmt.body
    if not _is_store(body):
        return None
    val = body.value
    if _node(val) != "Add":
        return None
    lhs, rhs = val.a, val.b
    if not (_is_load(lhs) and _load_buffer(lhs).same_as(body.buffer)):
        lhs, rhs = rhs, lhs
    if not (_is_load(lhs) and _load_buffer(lhs).same_as(body.buffer)):
        return None
    # strip casts
    while _node(rhs) == "Cast":
        rhs = rhs.value
    if _node(rhs) != "Mul":
        return None
    a, b = rhs.a, rhs.b
    while _node(a) == "Cast":
        a = a.value
    while _node(b) == "Cast":
        b = b.value
    if not (_is_load(a) and _is_load(b)):
        return None
    ivars = [iv.var for iv in stmt.iter_vars]
    k = ivars[-1]
    spatial = ivars[:-1]
    if len(spatial) < 2:
        return None
    out_idx = body.indices
    if len(out_idx) < 2 or not all(_node(x) == "Var" for x in out_idx):
        return None
    j = out_idx[-1]
    i = out_idx[-2]
    if not (j.same_as(spatial[-1]) and i.same_as(spatial[-2])):
        return None

    def _last_is(load, var):
        return _node(load.indices[-1]) == "Var" and load.indices[-1].same_as(var)

    def _uses(load, var):
        return any(var in _expr_vars(x) for x in load.indices)

    # B operand: last index j, uses k; A operand: uses i and k, not j.
    if _last_is(b, j) and _uses(b, k) and not _uses(a, j) and _uses(a, i):
        pass
    elif _last_is(a, j) and _uses(a, k) and not _uses(b, j) and _uses(b, i):
        a, b = b, a
    else:
        return None
    return spatial[:-2], i, j, k


def _schedule_matmul(sch, mm_block, other_blocks, target):
    lanes = _vector_lanes(target)
    loops = sch.get_loops(mm_block)
    if len(loops) != len(sch.get(mm_block).iter_vars):
        return False
    *batch, li, lj, lk = loops
    ext_j = _loop_extent(sch, lj)
    ext_i = _loop_extent(sch, li)

    # Register tile: MI rows x NJ columns (NJ = a few SIMD vectors).
    nj = 4 * lanes
    if ext_j is not None and ext_j < nj:
        nj = max(lanes, ext_j if ext_j % lanes == 0 else lanes)
    if ext_j is not None and ext_j % nj != 0 and ext_j % (2 * lanes) == 0:
        nj = 2 * lanes
    mi = 4
    if ext_i is not None and ext_i < mi:
        mi = ext_i

    # Dynamic / ragged extents: pad the iteration domain up to the tile size
    # (pad_einsum adds a zero-padded copy of the inputs and a cropping
    # consumer), so the micro-kernel runs without per-element predicates and
    # the accumulator compacts into an MI x NJ register tile.
    pad_i = mi if (ext_i is None or ext_i % mi) else 1
    pad_j = nj if (ext_j is None or ext_j % nj) else 1
    name = sch.get(mm_block).name_hint
    producers_before = {sch.get(b).name_hint for b in sch.get_child_blocks(_root_block(sch))}
    if pad_i > 1 or pad_j > 1:
        sch.pad_einsum(mm_block, [1] * len(batch) + [pad_i, pad_j, 1])
        mm_block = sch.get_sblock(name)
        new_blocks = [
            b for b in sch.get_child_blocks(_root_block(sch))
            if sch.get(b).name_hint not in producers_before
        ]
        all_blocks = list(sch.get_child_blocks(_root_block(sch)))
        pos = [sch.get(b).name_hint for b in all_blocks].index(name)
        pad_producers = [b for b in new_blocks if [sch.get(x).name_hint for x in all_blocks].index(sch.get(b).name_hint) < pos]
        crop = [b for b in new_blocks if b not in pad_producers]
        crop_names = [sch.get(b).name_hint for b in crop]
        if other_blocks:
            # fold the crop copy into the epilogue
            for c in crop_names:
                sch.compute_inline(sch.get_sblock(c))
        else:
            other_blocks = [sch.get_sblock(c) for c in crop_names]
        loops = sch.get_loops(mm_block)
        *batch, li, lj, lk = loops
    else:
        pad_producers = []

    # Pad copies of the row operand (indexed by i) are made per row tile, in
    # L1, right before the micro-kernel; the others run as their own nest.
    a_side = []
    b_side = []
    mm_stmt = sch.get(mm_block)
    i_var = mm_stmt.iter_vars[len(batch)].var
    for pb in pad_producers:
        out_buf = _region_buffer(sch.get(pb).writes[0])
        uses_i = any(
            _region_buffer(r).same_as(out_buf) and any(i_var in _expr_vars(rg.min) for rg in r.region)
            for r in mm_stmt.reads
        )
        (a_side if uses_i else b_side).append(pb)
    # (Measured: computing the row-operand pad per row tile (compute_at io) was
    # slower than one parallel copy nest, so all pad copies run on their own.)
    for pb in a_side + b_side:
        _schedule_spatial_block(sch, pb, lanes)

    io, ii = sch.split(li, [None, mi])
    jo, ji = sch.split(lj, [None, nj])
    sch.reorder(*batch, io, jo, lk, ii, ji)
    if pad_j > 1 and ext_j is None:
        # The vector (j) dim is dynamic: a per-tile epilogue would need a
        # lane-dependent tail predicate (scalarized).  Accumulate in a local
        # MI x NJ tile, write it to the padded result, and run the epilogue as
        # its own exact-extent loop nest over that result.
        wb = sch.cache_write(mm_block, 0, "local")
        sch.reverse_compute_at(wb, jo, preserve_unit_loops=True)
        wloops = sch.get_loops(wb)
        if len(wloops) > len(batch) + 2:
            _vectorize_inner(sch, wloops[-1], lanes)
        for blk in other_blocks:
            _schedule_spatial_block(sch, blk, lanes)
    else:
        # Epilogue (bias/scale/activation/residual/crop) computed per register tile.
        for blk in other_blocks:
            sch.reverse_compute_at(blk, jo, preserve_unit_loops=True)
            eloops = sch.get_loops(blk)
            inner = eloops[len(batch) + 2:]
            if inner:
                _vectorize_inner(sch, inner[-1], lanes)
    # parallel/unroll/vectorize first: once the reduction is decomposed the
    # update block is no longer a "reduction block" and parallel() refuses it.
    _parallel_outer(sch, list(batch) + [io])
    sch.unroll(ii)
    sch.vectorize(ji)
    init = sch.decompose_reduction(mm_block, lk)
    iloops = sch.get_loops(init)
    if iloops:
        sch.vectorize(iloops[-1])
    return True


# --------------------------------------------------------------------------------------
# Rule: row reductions (softmax / norms)
# --------------------------------------------------------------------------------------
def _schedule_reduction_chain(sch, blocks, target):
    lanes = _vector_lanes(target)
    out_block = blocks[-1]
    if not _is_spatial(sch, out_block):
        # terminal reduction (e.g. mean): just parallelize its spatial loops
        loops = sch.get_loops(out_block)
        kinds = _block_kinds(sch, out_block)
        if len(loops) != len(kinds):
            return False
        sp = [l for l, k in zip(loops, kinds) if k == "S"]
        n_lead = 0
        for k in kinds:
            if k != "S":
                break
            n_lead += 1
        if n_lead:
            _parallel_outer(sch, loops[:n_lead])
        for blk in reversed(blocks[:-1]):
            sch.compute_at(blk, sch.get_loops(out_block)[0], preserve_unit_loops=True)
        return True
    # number of leading spatial dims shared by all reduction blocks
    n_rows = None
    for blk in blocks[:-1]:
        kinds = _block_kinds(sch, blk)
        lead = 0
        for k in kinds:
            if k != "S":
                break
            lead += 1
        n_rows = lead if n_rows is None else min(n_rows, lead)
    if not n_rows:
        return False
    out_loops = sch.get_loops(out_block)
    if len(out_loops) < n_rows:
        n_rows = len(out_loops)
    if not n_rows:
        return False
    row = sch.fuse(*out_loops[:n_rows]) if n_rows > 1 else out_loops[0]
    sch.parallel(row)
    for blk in reversed(blocks[:-1]):
        sch.compute_at(blk, row, preserve_unit_loops=True)
    # vectorize the inner loops of spatial stages
    for blk in blocks:
        if _is_spatial(sch, blk):
            bl = sch.get_loops(blk)
            if len(bl) > 1:
                _vectorize_inner(sch, bl[-1], lanes)
    return True


# --------------------------------------------------------------------------------------
# Entry: schedule one PrimFunc
# --------------------------------------------------------------------------------------
def schedule_prim_func(func: tirx.PrimFunc, target) -> tirx.PrimFunc | None:
    """Return a scheduled copy of ``func`` or None when no rule applies."""
    sch = s_tir.Schedule(func)
    root = _root_block(sch)
    blocks = list(sch.get_child_blocks(root))
    if not blocks:
        return None
    lanes = _vector_lanes(target)
    # All blocks should be directly under root with a plain loop nest.
    for blk in blocks:
        if not _loops_are_plain(sch, blk):
            return None
    blocks = _try_inline_spatial(sch, blocks)

    mm = [(b, _match_matmul(sch, b)) for b in blocks]
    mm = [(b, m) for b, m in mm if m is not None]
    reductions = [b for b in blocks if not _is_spatial(sch, b)]
    if len(mm) == 1 and len(reductions) == 1:
        mm_block = mm[0][0]
        idx = blocks.index(mm_block)
        prologue = blocks[:idx]
        epilogue = blocks[idx + 1:]
        for blk in prologue:
            _schedule_spatial_block(sch, blk, lanes)
        if _schedule_matmul(sch, mm_block, epilogue, target):
            return sch.mod["main"]
        return None
    if reductions:
        if _schedule_reduction_chain(sch, blocks, target):
            return sch.mod["main"]
        return None
    for blk in blocks:
        _schedule_spatial_block(sch, blk, lanes)
    return sch.mod["main"]


def _lowers_ok(func, target) -> bool:
    """Dry-run the schedule-sensitive part of TIR lowering on one function."""
    try:
        mod = IRModule({"main": func})
        passes = [
            s_tir.transform.CanonicalizeLoop(),
            s_tir.transform.LowerInitBlock(),
            s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
            s_tir.transform.ConvertBlocksToOpaque(),
            s_tir.transform.CompactBufferAllocation(),
            s_tir.transform.LowerMatchBuffer(),
            s_tir.transform.LowerOpaqueBlock(),
            tirx.transform.FlattenBuffer(),
            tirx.transform.VectorizeLoop(True),
        ]
        if target is not None:
            with target:
                tvm.transform.Sequential(passes)(mod)
        else:
            tvm.transform.Sequential(passes)(mod)
        return True
    except Exception as err:  # pylint: disable=broad-except
        logger.debug("cpu_schedule: scheduled function failed to lower: %s", err)
        return False


# --------------------------------------------------------------------------------------
# Relax-level fast math (optional): vectorizable polynomial exp / erf / tanh
# --------------------------------------------------------------------------------------
# LLVM has no vector erf/exp for x86 without a vector math library, so a
# vectorized T.erf / T.exp is scalarized into libm calls (~20 cycles/element).
# TOPI's fast_* variants are polynomial/rational approximations (float32 error
# well under 1e-6) that vectorize.  Applied before legalization.
def _fast_gelu_te(x):
    from tvm import te, topi  # pylint: disable=import-outside-toplevel

    half = tvm.tirx.const(0.5, x.dtype)
    scaled = te.compute(x.shape, lambda *i: x(*i) * tvm.tirx.const(0.7071067811865476, x.dtype),
                        name="gelu_scaled")
    erf = topi.fast_erf(scaled)
    return te.compute(x.shape, lambda *i: x(*i) * (half + half * erf(*i)), name="gelu_out")


@relax.expr_functor.mutator
class _FastMathMutator(relax.PyExprMutator):  # pylint: disable=abstract-method
    def visit_call_(self, call):  # pylint: disable=arguments-renamed
        call = super().visit_call_(call)
        op = getattr(call, "op", None)
        name = getattr(op, "name", None)
        if name is None or not call.args:
            return call
        try:
            # TVM 0.27: Relax vars expose ``ty`` (TensorType), not ``struct_info``.
            arg = call.args[0]
            ty = getattr(arg, "struct_info", None) or getattr(arg, "ty", None)
            if ty is None or str(ty.dtype) != "float32":
                return call
        except Exception:  # pylint: disable=broad-except
            return call
        from tvm import topi  # pylint: disable=import-outside-toplevel

        if name == "relax.nn.gelu":
            return self.builder_.call_te(_fast_gelu_te, call.args[0], primfunc_name_hint="fast_gelu")
        if name == "relax.nn.softmax":
            return self.builder_.call_te(topi.nn.fast_softmax, call.args[0], int(call.attrs.axis),
                                         primfunc_name_hint="fast_softmax")
        if name == "relax.exp":
            return self.builder_.call_te(topi.fast_exp, call.args[0], primfunc_name_hint="fast_exp")
        if name == "relax.erf":
            return self.builder_.call_te(topi.fast_erf, call.args[0], primfunc_name_hint="fast_erf")
        if name == "relax.tanh":
            return self.builder_.call_te(topi.fast_tanh, call.args[0], primfunc_name_hint="fast_tanh")
        return call


@tvm.transform.module_pass(opt_level=0, name="CPUFastMath")
class CPUFastMath:  # pylint: disable=too-few-public-methods
    """Rewrite float32 gelu/softmax/exp/erf/tanh to vectorizable approximations."""

    def transform_module(self, mod: IRModule, _ctx) -> IRModule:
        mutator = _FastMathMutator(mod)
        for gv, func in mod.functions_items():
            if isinstance(func, relax.Function):
                try:
                    new_func = mutator.visit_expr(func)
                    mutator.builder_.update_func(gv, new_func)
                except Exception as err:  # pylint: disable=broad-except
                    logger.debug("cpu_schedule: fast math skipped for %s: %s", gv.name_hint, err)
        return mutator.builder_.get()


@tvm.transform.module_pass(opt_level=0, name="CPUDefaultSchedule")
class CPUDefaultSchedule:  # pylint: disable=too-few-public-methods
    """Apply the CPU schedule rules to every unscheduled PrimFunc of a module."""

    def __init__(self, target=None, validate: bool = True):
        self.target = target
        self.validate = validate

    def transform_module(self, mod: IRModule, _ctx) -> IRModule:
        updates = {}
        for gv, func in mod.functions_items():
            if not isinstance(func, tirx.PrimFunc):
                continue
            if func.attrs is not None and _SCHEDULED_ATTR in func.attrs and int(func.attrs[_SCHEDULED_ATTR]) == 1:
                continue
            target = self.target
            if func.attrs is not None and "target" in func.attrs:
                target = func.attrs["target"]
            if target is None:
                target = tvm.target.Target.current(allow_none=True)
            try:
                # Leave pure reshapes alone: RewriteDataflowReshape turns them
                # into zero-copy views, which needs the unscheduled pattern.
                if relax.analysis.has_reshape_pattern(func):
                    continue
            except Exception:  # pylint: disable=broad-except
                pass
            try:
                new_func = schedule_prim_func(func, target)
            except Exception as err:  # pylint: disable=broad-except
                logger.debug("cpu_schedule: leaving %s unscheduled: %s", gv.name_hint, err)
                new_func = None
            if new_func is not None and (not self.validate or _lowers_ok(new_func, target)):
                updates[gv] = new_func.with_attr(_SCHEDULED_ATTR, True)
        for gv, func in updates.items():
            mod[gv] = func
        return mod


def cpu_schedule_passes(target: "tvm.target.Target") -> list:
    """Passes that schedule every PrimFunc for CPU (insert after FuseTIR)."""
    return [CPUDefaultSchedule(target)]


def cpu_pipeline(target: "tvm.target.Target", fast_math: bool = True) -> tvm.transform.Pass:
    """Full Relax pipeline for CPU: the stock cpu_generic steps plus our schedules.

    ``fast_math`` rewrites float32 gelu/softmax/exp/erf/tanh to TOPI's vectorizable
    approximations before legalization (max abs error ~1e-7 on encoder outputs).
    """

    @tvm.transform.module_pass(opt_level=0, name="PortablePECPUPipeline")
    def _pipeline(mod: IRModule, _ctx) -> IRModule:
        passes = [
            # library dispatch
            relax.backend.DispatchSampling(),
            relax.backend.DispatchSortScan(),
            *([CPUFastMath()] if fast_math else []),
            # legalize + fuse
            relax.transform.LegalizeOps(),
            relax.transform.AnnotateTIROpPattern(),
            relax.transform.FoldConstant(),
            relax.transform.FuseOps(),
            relax.transform.FuseTIR(),
            # schedule (where the GPU pipelines run dlight)
            *cpu_schedule_passes(target),
            # dataflow lowering
            relax.transform.RewriteDataflowReshape(),
            relax.transform.ToNonDataflow(),
            relax.transform.RemovePurityChecking(),
            relax.transform.CallTIRRewrite(),
            # finalize
            relax.transform.StaticPlanBlockMemory(),
            relax.transform.LowerAllocTensor(),
            relax.transform.KillAfterLastUse(),
            relax.transform.LowerRuntimeBuiltin(),
            relax.transform.ComputePrimValue(),
            relax.transform.VMShapeLower(),
            relax.transform.AttachGlobalSymbol(),
        ]
        with target:
            return tvm.transform.Sequential(passes)(mod)

    return _pipeline
