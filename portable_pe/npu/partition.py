"""Partition the Relax module for the NPU with TVM's pattern-based BYOC flow.

The pattern table comes from the profile: each ONNX op the profile allows maps to the
Relax op(s) TVM's importer makes of it, and each becomes a pattern "npu.<OnnxOp>".
FuseOpsByPattern wraps every match in a composite function; MergeCompositeFunctions
then groups neighbouring composites into regions with Codegen="npu".

There is no "npu" codegen in TVM (vendor compilers take the NPU-ready ONNX instead), so
the partitioned module is an annotation: it reports which calls a BYOC NPU backend would
receive. The host build compiles the unpartitioned module, i.e. every op runs on the CPU.
"""

from __future__ import annotations

from collections import Counter

#: ONNX op -> the Relax ops the ONNX importer emits for it
RELAX_OPS = {
    "MatMul": ("relax.matmul",), "Gemm": ("relax.matmul",), "Add": ("relax.add",),
    "Sub": ("relax.subtract",), "Mul": ("relax.multiply",), "Div": ("relax.divide",),
    "Pow": ("relax.power",), "Sqrt": ("relax.sqrt",), "Tanh": ("relax.tanh",),
    "Sigmoid": ("relax.sigmoid",), "Erf": ("relax.erf",), "Exp": ("relax.exp",),
    "Gelu": ("relax.nn.gelu",), "Softmax": ("relax.nn.softmax",),
    "LayerNormalization": ("relax.nn.layer_norm",), "ReduceMean": ("relax.mean",),
    "ReduceSum": ("relax.sum",), "Reshape": ("relax.reshape",), "Transpose": ("relax.permute_dims",),
    "Concat": ("relax.concat",), "Slice": ("relax.strided_slice",), "Split": ("relax.split",),
    "Gather": ("relax.take",), "Squeeze": ("relax.squeeze",), "Unsqueeze": ("relax.expand_dims",),
    "QuantizeLinear": ("relax.quantize",), "DequantizeLinear": ("relax.dequantize",),
    "Where": ("relax.where",), "Clip": ("relax.clip",),
}


def pattern_table(profile, arities: dict[str, set[int]]) -> list[tuple[str, object]]:
    """One pattern per (allowed op, operand count seen in the module). Exact operand
    counts because TVM 0.27's varg_default_wildcard fails inside the matcher (IndexError)
    when a call has more operands than the pattern."""
    from tvm.relax.dpl import is_op, wildcard
    table = []
    for onnx_op in profile.ops:
        for relax_op in RELAX_OPS.get(onnx_op, ()):
            for arity in sorted(arities.get(relax_op, ())):
                table.append((f"npu.{onnx_op}.{relax_op.split('.')[-1]}",
                              is_op(relax_op)(*[wildcard() for _ in range(arity)])))
    return table


def _op_calls(func, *, with_arities: bool = False):
    import tvm
    from tvm import relax
    counts, arities = Counter(), {}

    @relax.expr_functor.visitor
    class _Count(relax.PyExprVisitor):
        def visit_call_(self, call):
            if isinstance(call.op, tvm.ir.Op):
                counts[call.op.name] += 1
                arities.setdefault(call.op.name, set()).add(len(call.args))
            super().visit_call_(call)
    _Count().visit_expr(func)
    return (counts, arities) if with_arities else counts


def partition(mod, profile):
    """(partitioned module, report): regions offloaded to "npu" and the ops left outside."""
    from tvm import relax
    total, arities = _op_calls(mod["main"], with_arities=True)
    table = pattern_table(profile, arities)
    fused = relax.transform.FuseOpsByPattern(table, bind_constants=True,
                                             annotate_codegen=False)(mod)
    merged = relax.transform.MergeCompositeFunctions()(fused)
    regions = [gv.name_hint for gv, f in merged.functions.items()
               if isinstance(f, relax.Function) and f.attrs and "Codegen" in f.attrs]
    # Offloaded = every call not left in main. Counting the calls inside the regions instead
    # undercounts: identical composites (same op on the same kind of operand) are defined
    # once and called from several places.
    outside = dict(_op_calls(merged["main"]))
    return merged, {"codegen": "npu", "patterns": len(table), "regions": len(regions),
                    "ops_offloaded": sum(total.values()) - sum(outside.values()), "ops_total": sum(total.values()),
                    "ops_on_host": outside,
                    "note": "annotation only: no 'npu' codegen exists; the host build runs every op"}
