"""Dense layers over [batch, seq, K] as one matmul over batch * seq rows.

The float32 dense (f32_dense) computes C in tiles of 12 rows and pads its row count to
a multiple of 12. Given ``x [B, T, K] @ W``, the row dim is T, so every batch element is
padded on its own: at T = 128, 8 x 132 rows instead of 1024 (3.1% more multiply-adds in
every dense); over ``[B * T, K]`` it is 1032 (0.8%). DINOv3-S at 224 x 224 (T = 201): 8 x
204 against 1608.

This pass, before legalization, writes ``matmul(x, W)`` (W a constant [K, N], x float32
of rank 3) as ``reshape(matmul(reshape(x, [B * T, K]), W), [B, T, N])`` and moves the
output's reshape down through the elementwise epilogue (bias, activation, residual add:
unary ops, and binary ones whose other operand is a scalar, a [N] row, or a [B, T, N]
tensor), so the epilogue still fuses into the dense kernel and the reshapes are views.
A [B, T, N] operand that is not itself a flattened result comes in as a memory view:
a reshape kernel there would be fused with the add and take it out of the dense's
kernel. The row count B * T is bound to a variable of its own (a match_cast), as
dim_vars names a vision graph's token count: the kernels see one row dim, as they saw T,
and a vision graph's matmuls do not take its height and width again.

Measured (2 threads, one process, alternating blocks, outputs bit for bit equal): the
learned graph B = 8, T = 128 28.25 -> 27.68 ms, B = 8, T = 512 146.96 -> 146.82, B = 1
within 0.5%; DINOv3-S at 224 x 224, B = 8: 307.3 -> 305.9 and 310.1 -> 305.1 (two runs).

Float32 builds only: the bf16 attention reads K straight from a [batch, keys, width]
q/k/v projection (bf16_pack_k), which a flattened projection is not, and AMX's row tiles
(16) divide the sequence lengths that matter.
"""

from __future__ import annotations

import tvm
from tvm import relax, tirx
from tvm.ir import IRModule

from .relax_util import _mutate_relax_functions, _tensor_type, same_dims
from .tir_util import _const_int

#: elementwise ops of one tensor the flattened result passes through
_UNARY = {"relax.nn.gelu", "relax.nn.gelu_tanh", "relax.nn.silu", "relax.nn.relu", "relax.erf", "relax.tanh",
          "relax.sigmoid", "relax.exp"}
#: elementwise ops of two tensors (the other operand: _row_operand)
_BINARY = {"relax.add", "relax.subtract", "relax.multiply", "relax.divide"}


def _op_name(value) -> str | None:
    return getattr(value.op, "name", None) if isinstance(value, relax.Call) else None


@relax.expr_functor.mutator
class _FlattenRows(relax.PyExprMutator):  # pylint: disable=abstract-method
    def __init__(self, mod: IRModule):
        super().__init__(mod)
        self.flattened = 0
        self.row_vars: list = []  # (B * T, its variable), one per distinct product
        # each [B, T, N] result this pass emitted -> (its [B * T, N] form, [B, T, N])
        self.flat: dict = {}

    def visit_function_(self, func):  # pylint: disable=arguments-renamed
        # a row-count variable is defined by a match_cast in its own function
        self.flat, self.row_vars = {}, []
        return super().visit_function_(func)

    def visit_var_binding_(self, binding):
        # (a function's output binding keeps its form: its var is used outside the block)
        if not isinstance(binding.var, relax.DataflowVar):
            return super().visit_var_binding_(binding)
        value = self.visit_expr(binding.value)
        found = self._rewrite(value)
        if found is None:
            return super().visit_var_binding_(binding)
        flat, shape = found
        out = self.builder_.emit(relax.op.reshape(flat, shape), name_hint=binding.var.name)
        self.flat[out] = (flat, shape)
        self.set_var_remap(binding.var, out)

    def _rewrite(self, value):
        """(the [B * T, N] value, [B, T, N]) for a binding this pass flattens, else None."""
        name = _op_name(value)
        if name == "relax.matmul":
            return self._flat_matmul(value)
        if name in _UNARY and value.args[0] in self.flat:
            flat, shape = self.flat[value.args[0]]
            return self.builder_.emit(relax.Call(value.op, [flat], value.attrs)), shape
        if name in _BINARY:
            for left in (True, False):
                mine, other = value.args if left else value.args[::-1]
                if mine not in self.flat:
                    continue
                flat, shape = self.flat[mine]
                operand = self._row_operand(other, shape)
                if operand is not None:
                    args = [flat, operand] if left else [operand, flat]
                    return self.builder_.emit(relax.Call(value.op, args, value.attrs)), shape
        return None

    def _flat_matmul(self, value):
        x, weight = value.args
        x_type, w_type = _tensor_type(x), _tensor_type(weight)
        # TVM 0.27: Relax constants are tvm.ir.GenericConst
        if not isinstance(weight, tvm.ir.GenericConst) or x_type is None or w_type is None:
            return None
        if x_type[0] != "float32" or len(x_type[1]) != 3 or len(w_type[1]) != 2:
            return None
        batch, seq, k = x_type[1]
        rows = self._row_count(batch * seq)
        flat_x = self.builder_.emit(relax.op.reshape(x, [batch * seq, k]))
        if not isinstance(rows, tirx.IntImm):
            flat_x = self.builder_.match_cast(flat_x, relax.TensorType([rows, k], "float32"))
        self.flattened += 1
        return self.builder_.emit(relax.op.matmul(flat_x, weight)), [batch, seq, w_type[1][1]]

    def _row_count(self, count):
        """B * T as the kernels see it: a constant, or one variable per distinct product
        (bound by a match_cast, as dim_vars names a vision graph's token count): over
        ``batch * seq`` itself TVM's simplifier keeps a matmul's tile indices symbolic."""
        count = tvm.sym.Analyzer().simplify(count)
        if _const_int(count) is not None:
            return tirx.IntImm("int64", _const_int(count))
        for expr, var in self.row_vars:
            if tvm.sym.Analyzer().can_prove_equal(expr, count):
                return var
        var = tirx.Var("rows", "int64")
        self.row_vars.append((count, var))
        return var

    def _row_operand(self, other, shape):
        """`other` as an operand of the flattened [B * T, N] value, or None: a scalar or a
        [N] row as it is, a [1, 1, N] row as [N], a flattened result as its flat form, a
        [B, T, N] tensor as a [B * T, N] view."""
        if other in self.flat and same_dims(self.flat[other][1], shape):
            return self.flat[other][0]
        info = _tensor_type(other)
        if info is None:
            return None
        dims = info[1]
        if len(dims) <= 1:
            return other
        if len(dims) <= 3 and all(_const_int(d) == 1 for d in dims[:-1]):
            return self.builder_.emit(relax.op.reshape(other, [dims[-1]]))
        if same_dims(dims, shape):
            view = relax.op.memory.view(other, relax.ShapeExpr([self._row_count(shape[0] * shape[1]), shape[2]]))
            return self.builder_.emit(view)
        return None


@tvm.transform.module_pass(opt_level=0, name="FlattenDenseRows")
class FlattenDenseRows:  # pylint: disable=too-few-public-methods
    """Rank-3 float32 matmuls over constant weights as matmuls over batch * seq rows, their
    elementwise epilogue with them (the module docstring)."""

    def transform_module(self, mod: IRModule, _ctx) -> IRModule:
        flattener = _FlattenRows(mod)
        rewritten = _mutate_relax_functions(flattener, mod, skip_failures="dense rows")
        if not flattener.flattened:
            return mod
        return relax.transform.DeadCodeElimination()(rewritten)
