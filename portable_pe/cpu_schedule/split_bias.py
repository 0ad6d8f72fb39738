"""A bias added to each part of a split projection, added before the split instead.

An encoder with one q/k/v projection writes ``split(x @ W_qkv)`` and adds each part's
bias after the split: ``add(b_q, q)``, ``add(b_k, k)``, ``add(b_v, v)``. The dense's kernel
cannot take those adds (its result has three readers, the split's parts), so each part's
add lands in the kernel that copies the part out, and the parts can only be read as
copies. Here the three biases become one [N] row added to the projection before the
split, where FlattenDenseRows sinks it into the dense's epilogue, and the parts are plain
column ranges of the projection: the attention kernel reads Q and V there in place
(head_layouts.py).

Rewritten only where every part of the split is read by exactly one add of a constant row
of its width (a part without a bias, or read elsewhere too, leaves the split as it was),
and where the add's result stays inside the dataflow block. The sums are the same float32
additions in the same order: the outputs are bit for bit equal.
"""

from __future__ import annotations

import numpy as np

import tvm
from tvm import relax
from tvm.ir import IRModule

from .head_reshapes import split_bounds
from .relax_util import _mutate_relax_functions, _tensor_type, call_of


def _bias_row(value, part, width: int):
    """The constant [width] float32 row `value` adds to `part`, or None."""
    if call_of(value, "relax.add") is None:
        return None
    for mine, other in (value.args, value.args[::-1]):
        if mine.same_as(part) and isinstance(other, tvm.ir.GenericConst):  # TVM 0.27's Relax constant
            row = other.value.numpy()
            if row.dtype == np.float32 and row.shape == (width,):
                return row
    return None


def _plan(block) -> tuple[dict, dict]:
    """({split var: its parts' biases concatenated}, {add var: the part it adds a bias to})
    for the splits of `block` that the module docstring's rule rewrites."""
    values = {b.var: b.value for b in block.bindings if isinstance(b, relax.VarBinding)}
    users = relax.analysis.udchain(block)
    biases, parts = {}, {}
    for var, value in values.items():
        if call_of(value, "relax.split") is None:
            continue
        info = _tensor_type(value.args[0])
        if info is None or info[0] != "float32":
            continue
        axis = int(value.attrs.axis) % len(info[1])
        bounds = split_bounds(value, info[1][axis])
        if axis != len(info[1]) - 1 or bounds is None:
            continue
        rows, adds = [None] * (len(bounds) - 1), {}
        for part in users.get(var, []):
            item = values.get(part)
            readers = users.get(part, [])
            if not isinstance(item, relax.TupleGetItem) or len(readers) != 1:
                break
            i, add = int(item.index), readers[0]
            row = _bias_row(values.get(add), part, bounds[i + 1] - bounds[i])
            if row is None or rows[i] is not None or not isinstance(add, relax.DataflowVar):
                break
            rows[i], adds[add] = row, part
        else:
            if all(r is not None for r in rows):
                biases[var] = np.concatenate(rows)
                parts.update(adds)
    return biases, parts


@relax.expr_functor.mutator
class _SplitBiasHoister(relax.PyExprMutator):  # pylint: disable=abstract-method
    def __init__(self, mod: IRModule):
        super().__init__(mod)
        self.biases: dict = {}  # split var -> the bias added before it (_plan)
        self.parts: dict = {}  # add var -> the part var it adds the bias to
        self.hoisted = 0

    def visit_dataflow_block_(self, block):  # pylint: disable=arguments-renamed
        self.biases, self.parts = _plan(block)
        return super().visit_dataflow_block_(block)

    def visit_var_binding_(self, binding):
        if binding.var in self.biases:
            split = binding.value
            source = self.visit_expr(split.args[0])
            biased = self.builder_.emit(relax.op.add(source, relax.const(self.biases[binding.var])))
            new = self.builder_.emit(relax.Call(split.op, [biased], split.attrs), name_hint=binding.var.name)
            self.set_var_remap(binding.var, new)
            self.hoisted += 1
            return
        if binding.var in self.parts:  # the part already carries its bias
            self.set_var_remap(binding.var, self.visit_expr(self.parts[binding.var]))
            return
        super().visit_var_binding_(binding)


@tvm.transform.module_pass(opt_level=0, name="HoistSplitBias")
class HoistSplitBias:  # pylint: disable=too-few-public-methods
    """Per-part biases of a split projection as one bias before the split (module docstring)."""

    def transform_module(self, mod: IRModule, _ctx) -> IRModule:
        hoister = _SplitBiasHoister(mod)
        rewritten = _mutate_relax_functions(hoister, mod, skip_failures="split bias")
        if not hoister.hoisted:
            return mod
        return relax.transform.DeadCodeElimination()(rewritten)
