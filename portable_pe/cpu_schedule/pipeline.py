"""Rule dispatch per PrimFunc and the Relax passes / pipeline that apply it.

Every function is scheduled independently inside ``try``: if a rule raises, the
function is left unscheduled and the compile goes on; cpu_pipeline's report() names it
(failures.py says why that must not stay silent).
"""

from __future__ import annotations

import logging

import tvm
from tvm import relax, s_tir, tirx
from tvm.ir import IRModule

from .attention import FuseAttention
from .bf16_linear import LowerBF16Linear
from .bf16_plan import BF16_ATTENTION_PRECISIONS
from .amx_tiles import open_amx_scopes
from .bf16_matmul import is_bf16_matmul, schedule_bf16_matmul
from .dim_vars import WithNamedDims
from .f32_dense import schedule_f32_dense
from .f32_tiles import F32_KERNEL
from .failures import PipelineFailures
from .fast_math import CPUFastMath
from .flat_rows import FlattenDenseRows
from .head_reshapes import FusableHeadReshapes
from .int8_matmul import is_integer_matmul, schedule_int8_matmul
from .matmul import _match_matmul, _schedule_matmul
from .patch_stem import PatchStemAsMatmul
from .quant_matmul import LowerQuantizedMatmul
from .reduction import _schedule_reduction_chain
from .reshape_views import LEGALIZE_MAP as RESHAPE_VIEWS
from .rows_in_place import read_rows_in_place
from .transpose_8x8 import whole_tiles_in_registers
from .small_work import SerialWhenSmall
from .weight_packing import FoldWeightPacking, MarkConstantWeights, SplitWeightPacking
from .split_bias import HoistSplitBias
from .spatial import _schedule_spatial_block, _try_inline_spatial
from .tir_util import _is_spatial, _loops_are_plain, _root_block, _vector_lanes, without_extern_zero_fills

logger = logging.getLogger(__package__)  # the pre-split module's logger name

_SCHEDULED_ATTR = "tirx.is_scheduled"


# --------------------------------------------------------------------------------------
# Entry: schedule one PrimFunc
# --------------------------------------------------------------------------------------
def schedule_prim_func(func: tirx.PrimFunc, target) -> tirx.PrimFunc | None:
    """Return a scheduled copy of ``func`` or None when no rule applies."""
    scheduled = _schedule_rules(func, target)
    # transposed copies that transpose_tiles marked, whichever rule scheduled them
    return whole_tiles_in_registers(scheduled) if scheduled is not None else None


def _schedule_rules(func: tirx.PrimFunc, target) -> tirx.PrimFunc | None:
    """The rule that fits ``func``, applied; None when none does."""
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
        if is_integer_matmul(sch, mm_block) and schedule_int8_matmul(sch, mm_block, epilogue, target):
            return open_amx_scopes(sch.mod["main"])  # (AMX-INT8 marks its work items)
        if is_bf16_matmul(sch, mm_block) and schedule_bf16_matmul(sch, mm_block, epilogue, target):
            return open_amx_scopes(sch.mod["main"])
        if schedule_f32_dense(sch, mm_block, epilogue, target):
            return read_rows_in_place(without_extern_zero_fills(sch.mod["main"], (F32_KERNEL,)), F32_KERNEL)
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


def _lowering_error(func, target) -> Exception | None:
    """Dry-run the schedule-sensitive part of TIR lowering on one function: the error, if
    it fails."""
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
        return None
    except Exception as err:  # pylint: disable=broad-except
        logger.debug("cpu_schedule: scheduled function failed to lower: %s", err)
        return err


@tvm.transform.module_pass(opt_level=0, name="CPUDefaultSchedule")
class CPUDefaultSchedule:  # pylint: disable=too-few-public-methods
    """Apply the CPU schedule rules to every unscheduled PrimFunc of a module. A rule that
    raises, or whose schedule does not lower, leaves the function unscheduled and is
    recorded in ``failures`` (a PipelineFailures), when given."""

    def __init__(self, target=None, validate: bool = True, failures: PipelineFailures | None = None):
        self.target = target
        self.validate = validate
        self.failures = failures

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
                self._failed(gv, err)
                continue
            error = _lowering_error(new_func, target) if new_func is not None and self.validate else None
            if error is not None:
                self._failed(gv, error)
            elif new_func is not None:
                updates[gv] = new_func.with_attr(_SCHEDULED_ATTR, True)
        for gv, func in updates.items():
            mod[gv] = func
        return mod

    def _failed(self, gv, err: Exception) -> None:
        if self.failures is not None:
            self.failures.kernel(gv.name_hint, err)


def cpu_schedule_passes(target: "tvm.target.Target", failures: PipelineFailures | None = None) -> list:
    """Passes that schedule every PrimFunc for CPU (insert after FuseTIR)."""
    return [CPUDefaultSchedule(target, failures=failures)]


def fusion_passes(*, fast_math: bool = True, precision: str = "fp32", failures: PipelineFailures | None = None) -> list:
    """Everything before scheduling: tuning extracts its tasks after exactly these passes,
    so tuned workloads hash the same as the PrimFuncs a compile later looks up.
    `precision` "bf16": the constant-weight matmuls in bf16 (bf16_linear). A rewrite that
    raises (and is left out) is recorded in `failures`, when given."""
    # a pixel graph's compound dims (its token count) as variables first (dim_vars)
    return [WithNamedDims([
        # a vision stem (conv with stride = kernel) as the matmul it is
        PatchStemAsMatmul,
        # a split projection's per-part biases before the split, in the dense's epilogue
        # (an int8 one's too: its float epilogue after the integer matmul takes the add)
        *([HoistSplitBias()] if precision in ("fp32", "int8") else []),
        # float32 dense layers over batch * seq rows (one row tiling, not one per batch element)
        *([FlattenDenseRows()] if precision == "fp32" else []),
        # dequantize -> matmul with a constant int8 weight (QDQ graphs) as an integer matmul
        LowerQuantizedMatmul(failures),
        *([LowerBF16Linear(failures)] if precision == "bf16" else []),
        # attention as one kernel (CPU targets); before fast math rewrites its softmax.
        # int8 builds take the bf16 one too where the CPU has AMX (bf16_plan), and Q·Kᵀ
        # in int8 on AVX2 without VNNI (int8_attention)
        FuseAttention(bf16=precision in BF16_ATTENTION_PRECISIONS, int8=precision == "int8", failures=failures),
        # head splits/merges and q/k/v splits that FuseOps can fuse at a symbolic length
        FusableHeadReshapes(),
        # library dispatch
        relax.backend.DispatchSampling(),
        relax.backend.DispatchSortScan(),
        *([CPUFastMath(bf16=precision == "bf16")] if fast_math else []),
        # legalize + fuse
        # (reshapes over compound symbolic dims stay views: reshape_views.py)
        relax.transform.LegalizeOps(customize_legalize_map=RESHAPE_VIEWS),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
    ])]


@tvm.transform.module_pass(opt_level=0, name="ApplyTuningDatabase")
def ApplyTuningDatabase(mod: IRModule, _ctx) -> IRModule:  # pylint: disable=invalid-name
    """Apply the MetaSchedule database in scope, if any, to the static-shape PrimFuncs it has."""
    from tvm.s_tir import meta_schedule as ms
    if ms.database.Database.current() is None:
        return mod
    return relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(mod)


@tvm.transform.module_pass(opt_level=0, name="ShapeFuncsNoAlias")
def ShapeFuncsNoAlias(mod: IRModule, _ctx) -> IRModule:  # pylint: disable=invalid-name
    """Mark the VM's host shape functions `tirx.noalias` (each takes one buffer, the VM's
    shape heap, so nothing can alias). TVM's CPU codegen remembers the pointer arguments of
    a function without that attribute as aliasing across the functions of one LLVM module;
    a kernel codegen'd after it then loses the noinline/noalias compute function its body
    gets otherwise, and LLVM keeps the int8 kernels' register tiles in memory (half the
    vpdpbusd, 4x slower, seen in the sinusoidal and alibi graphs)."""
    marked = {gv: func.with_attr("tirx.noalias", True) for gv, func in mod.functions_items()
              if isinstance(func, tirx.PrimFunc) and func.attrs is not None and func.attrs.get("tirx.is_host_func")
              and not func.attrs.get("tirx.noalias") and len(func.params) <= 1}
    if not marked:
        return mod
    out = mod.clone()
    for gv, func in marked.items():
        out.update_func(gv, func)
    return out


def cpu_pipeline(target: "tvm.target.Target", fast_math: bool = True, precision: str = "fp32") -> tvm.transform.Pass:
    """Full Relax pipeline for CPU: the stock cpu_generic steps plus our schedules.

    ``fast_math`` rewrites float32 gelu/softmax/exp/erf/tanh to TOPI's vectorizable
    approximations before legalization (max abs error ~1e-7 on encoder outputs).
    ``precision`` (quant.PRECISIONS) "bf16" runs the constant-weight matmuls in bf16.
    The pass's report() is the manifest's "cpu_schedules" section: what its last run
    left unscheduled or unrewritten (failures.py), empty when everything went through.
    """

    @tvm.transform.module_pass(opt_level=0, name="PortablePECPUPipeline")
    class _Pipeline:
        def __init__(self):
            self.failures = PipelineFailures()

        def report(self) -> dict:
            return self.failures.to_manifest()

        def transform_module(self, mod: IRModule, _ctx) -> IRModule:
            self.failures = PipelineFailures()
            with target:
                return tvm.transform.Sequential(_cpu_passes(target, fast_math, precision, self.failures))(mod)

    return _Pipeline()


def _cpu_passes(target, fast_math: bool, precision: str, failures: PipelineFailures) -> list:
    """cpu_pipeline's passes, in order, recording into `failures`."""
    return [
        *fusion_passes(fast_math=fast_math, precision=precision, failures=failures),
        # tuned kernels first (a MetaSchedule database in scope, see tune.py), then
        # our rules for everything still unscheduled
        ApplyTuningDatabase,
        # which kernel arguments are constants (weights the schedules may repack);
        # after the database, whose workloads were hashed without this attribute
        MarkConstantWeights,
        *cpu_schedule_passes(target, failures),
        # packed weights: split the packing out of each kernel and run it now (in
        # numpy; FoldConstant for any packing kernel numpy does not recognise)
        SplitWeightPacking,
        FoldWeightPacking,
        relax.transform.FoldConstant(),
        # small nests skip the thread pool, whoever scheduled them
        SerialWhenSmall(),
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
        ShapeFuncsNoAlias,
        relax.transform.AttachGlobalSymbol(),
    ]
