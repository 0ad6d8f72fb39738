"""The GPU schedule rules of a cuda build: dlight's, falling through, with a Fallback that
does not pad.

dlight tries its rules in order (Matmul, GEMV, Reduction, GeneralReduction, Fallback) and
takes the first that returns a schedule; a rule that raises fails the whole build. Vision
graphs met that: their token count is ``H // P * (W // P) + extras``. The cuda pipeline now
names that count first (cpu_schedule/dim_vars.py, as on CPU), which cured most kernels, but
two failures remained on the shipped graphs: dlight's Matmul on the video stem's conv3d
("CanProveEqual(sum_expr->args[i - 1]->scale, expected_scale)"), and Fallback's kernels over
(batch, heads, n + 5, 64), whose fused loop it splits in blocks of 1024 that the per-head
extent does not provably divide, so TVM's lowering fails ("The padding factor ... is not
divisible by n * 64 + 320"). Here a rule that raises hands the kernel to the next one (the
log names the kernel and the error, for the manifest's "cuda_schedules"), and
BindSpatialLoops takes Fallback's place. Where dim_vars could not name the count (BEiT's
H // 16 * (W // 16) + 1), dlight's Matmul built kernels that CUDA's code generator refused
("Can only handle constant size stack allocation for now"): for such kernels each schedule
is lowered first, and one with a kernel-side buffer of non-constant size falls through
like a rule that raised (_check_device_allocations).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import tvm
from tvm import s_tir, tirx
from tvm.s_tir import dlight as dl
from tvm.s_tir.dlight.base import ScheduleRule, max_threads_per_block, try_inline
from tvm.s_tir.dlight.analysis import normalize_prim_func
# dlight's Fallback asks the same of a block (TVM 0.27; private, so a TVM that drops it fails here)
from tvm.s_tir.dlight.gpu.fallback import _has_internal_thread_env as launches_own_threads

from ..cpu_schedule.failures import error_summary


@dataclass
class FallThroughLog:
    """What fell through in one build: {kernel: [(rule, first line of its error), ...]}."""
    failures: dict[str, list[tuple[str, str]]] = field(default_factory=dict)

    def record(self, name: str, rule: ScheduleRule, error: Exception) -> None:
        self.failures.setdefault(name, []).append((type(rule).__name__, error_summary(error)))

    def to_manifest(self) -> dict[str, list[str]]:
        return {kernel: [f"{rule}: {reason}" for rule, reason in rows] for kernel, rows in sorted(self.failures.items())}


def _fuse_longest_suffix(sch, loops):
    """(fused loop, the loops before it): the innermost run of `loops` that TVM can fuse,
    longest first; a single loop always 'fuses'."""
    for start in range(len(loops)):
        if start == len(loops) - 1:
            return loops[start], loops[:start]
        try:
            return sch.fuse(*loops[start:]), loops[:start]
        except RuntimeError:  # ScheduleError, or an InternalError from TVM's iterator analysis
            continue
    raise ValueError("no loops to fuse")


def _dividing_thread_count(extent, most: int) -> int:
    """The largest power of two up to `most` (and at least 32, a warp) that provably divides
    `extent`, else `most`. A split that needs no padding keeps the kernel's index arithmetic
    exact: over (H // P * (W // P) + 5) * 256 elements, a 256-thread split divides the
    index by the token count cleanly, where a padded 1024-thread one makes TVM's lowering
    fail ("The padding factor ... is not divisible")."""
    analyzer = tvm.sym.Analyzer()
    count = most
    while count >= 32:
        if analyzer.can_prove_equal(tvm.tirx.floormod(extent, count), 0):
            return count
        count //= 2
    return most


def _constant_suffix(sch, loops, most: int) -> int:
    """Where the innermost run of `loops` with constant extents, at most `most` elements
    together, starts (len(loops) when the innermost loop is symbolic)."""
    start, product = len(loops), 1
    while start > 0:
        extent = sch.get(loops[start - 1]).extent
        if not isinstance(extent, tirx.IntImm) or product * int(extent) > most:
            break
        start, product = start - 1, product * int(extent)
    return start


def _bind_spatial(sch, spatial, most: int):
    """Bind `spatial` (a block's spatial loops, outermost first) to the grid.

    Threads take the innermost loops of constant extent (a head's 64 channels), however
    few: the block index is then the fused outer loops, unsplit, and the kernel divides it
    by the token count exactly; splitting the fused loops at a count that the per-head
    extent (tokens x 64) does not provably divide makes TVM's lowering fail. Where the
    innermost loop is symbolic, the innermost loops that fuse are split into blocks of the
    largest power of two that divides them (_dividing_thread_count). Up to two outer loops
    that do not fuse with the rest become blockIdx.y and blockIdx.z; any further ones run
    serially inside the thread."""
    start = _constant_suffix(sch, spatial, most)
    if start < len(spatial):
        tx = sch.fuse(*spatial[start:]) if len(spatial) - start > 1 else spatial[start]
        if start == 0:
            bx, outer = sch.add_unit_loop(tx), []
        else:
            bx, outer = _fuse_longest_suffix(sch, spatial[:start])
    else:
        inner, outer = _fuse_longest_suffix(sch, spatial)
        bx, tx = sch.split(inner, factors=[None, _dividing_thread_count(sch.get(inner).extent, most)])
    bound = [bx]
    for axis, loop in zip(("blockIdx.y", "blockIdx.z"), reversed(outer[-2:])):
        sch.bind(loop, axis)
        bound.insert(0, loop)
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    serial = outer[:-2]
    if serial:
        # a loop outside the kernel's bound loops would run on the host: move it in
        sch.reorder(*bound, tx, *serial)


class BindSpatialLoops(ScheduleRule):
    """dlight's Fallback (inline what inlines, bind each remaining block's spatial loops,
    reductions serial in each thread) without its two failures on a vision graph's token
    count: it fuses only the loops TVM's iterator analysis can fuse, and splits without
    padding where it can (_bind_spatial)."""

    def apply(self, func, target, tunable):
        if not isinstance(func, tirx.PrimFunc):
            return None
        most = max_threads_per_block(target)
        sch = s_tir.Schedule(func)
        blocks = normalize_prim_func(sch)
        if blocks is None:
            return None
        blocks = try_inline(sch, blocks)
        reductions = []
        for info in blocks:
            block = info.block_rv
            loops = sch.get_loops(block)
            if any(sch.get(loop).thread_binding is not None for loop in loops):
                continue
            if not loops and launches_own_threads(sch.get(block).body):
                continue  # TOPI's GPU scatter_nd, sort: binding them again nests two grids
            kinds = info.dom_kind()
            spatial = [loop for loop, kind in zip(loops, kinds) if kind == "S"]
            reduce = [loop for loop, kind in zip(loops, kinds) if kind == "R"]
            other = [loop for loop, kind in zip(loops, kinds) if kind not in "SR"]
            if not spatial:
                spatial = [sch.add_unit_loop(block)]
            sch.reorder(*spatial, *reduce, *other)
            _bind_spatial(sch, spatial, most)
            if reduce:
                reductions.append((block, reduce[0]))
        for block, loop in reductions:
            sch.decompose_reduction(block, loop)
        return sch


@tvm.transform.module_pass(opt_level=0, name="PortablePEGPUSchedule")
class GPUSchedule:
    """dlight's ApplyDefaultSchedule with its GPU rules in its order, Fallback replaced by
    BindSpatialLoops; a rule that raises on a kernel hands it to the next rule, and the
    log names the kernel, the rule and its error."""

    def __init__(self, log: FallThroughLog):
        self.log = log
        self.rules = (dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(), BindSpatialLoops())

    def transform_module(self, mod, _ctx):
        scheduled = {}
        for gvar, func in mod.functions_items():
            if not isinstance(func, tirx.PrimFunc) or (func.attrs is not None and func.attrs.get("tirx.is_scheduled")):
                continue
            target = (func.attrs.get("target") if func.attrs is not None else None) or tvm.target.Target.current()
            sch = self._schedule(gvar.name_hint, func, target)
            if sch is not None:
                scheduled[gvar] = sch.mod["main"].with_attr("tirx.is_scheduled", True)
        for gvar, func in scheduled.items():
            mod[gvar] = func
        return mod

    def _schedule(self, name, func, target):
        check = _has_compound_dims(func)
        for rule in self.rules:
            try:
                sch = rule.apply(func, target, False)
                sch = sch[0] if isinstance(sch, list) else sch
                if sch is not None and check and rule is not self.rules[-1]:
                    _check_device_allocations(sch.mod["main"], target)
            except Exception as error:  # noqa: BLE001 - any rule failure: the next rule decides
                if rule is self.rules[-1]:
                    raise
                self.log.record(name, rule, error)
                continue
            if sch is not None:
                return sch
        return None


def _has_compound_dims(func) -> bool:
    """Whether a buffer of `func` has a dim that is an expression of variables, not one
    variable: a token count that dim_vars could not name (BEiT's H // 16 * (W // 16) + 1)."""
    # (TVM 0.27: a PrimFunc's params are its buffers, scalar params are Vars)
    return any(not isinstance(dim, (tirx.IntImm, tirx.Var))
               for param in func.params if hasattr(param, "shape") for dim in param.shape)


def _check_device_allocations(func, target) -> None:
    """Raise where `func`, lowered as the build lowers it, allocates a kernel-side buffer
    (local, shared) of a size that is not a constant, which CUDA's code generator refuses
    ("Can only handle constant size stack allocation for now"). dlight's Matmul leaves
    one over a compound token count: its padded accumulator is sized by the expression,
    which no compaction turns into a constant. Checked on the lowered kernel, since good
    schedules also have symbolic scratch buffers before compaction. About 0.1 s a kernel,
    so only kernels with compound dims are checked."""
    from tvm.target import Target
    from tvm.tirx.build import split_host_device_mods
    from tvm_ffi.structural import structural_walk
    mod = tvm.IRModule({"kernel": func.with_attr("global_symbol", "kernel")})
    host = target.host if target.host is not None else Target("llvm")
    mod = tirx.transform.BindTarget(target.with_host(host))(mod)
    lower, _, finalize_device = tirx.get_default_tir_pipeline(target)
    with target:
        _, device_mods = split_host_device_mods(lower(mod))
    sized = []

    def note(alloc):
        if alloc.buffer.scope() not in ("global", "shared.dyn") and not all(
                isinstance(dim, tirx.IntImm) for dim in alloc.buffer.shape):
            sized.append(f"{alloc.buffer.name} ({alloc.buffer.scope()})")
    for device_mod in device_mods.values():
        for _, kernel in finalize_device()(device_mod).functions_items():
            structural_walk(kernel.body, [(tirx.AllocBuffer, note)])
    if sized:
        raise ValueError(f"kernel-side buffers of non-constant size, which CUDA code cannot declare: "
                         f"{', '.join(sized)}")
