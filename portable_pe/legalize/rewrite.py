"""Graph rewriting from the symbolic values: importer-friendly shape operands and Ranges.

``_Rewriter`` rebuilds shape operands as ``Concat(Shape(input, start=i, end=i+1) |
constant ...)``, turns input-dependent ``Range`` into ``ConstantOfShape -> CumSum ->
Add``, and folds small constant integer computations into initializers.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import onnx
import sympy
from onnx import helper, numpy_helper

from .symbolic import _is_int_elem, _rational, _Sym

_SHAPE_OPERANDS = {  # op_type -> input indices that are shapes
    "Reshape": (1,),
    "Expand": (1,),
    "ConstantOfShape": (0,),
    "Tile": (1,),
}


# --------------------------------------------------------------------------- #
# rewriting
# --------------------------------------------------------------------------- #
class _Rewriter:
    def __init__(self, model: onnx.ModelProto, sym: _Sym):
        self.model = model
        self.g = model.graph
        self.sym = sym
        self.prefix: list[onnx.NodeProto] = []  # nodes that depend only on graph inputs
        self.inits: list[onnx.TensorProto] = []
        self.cache: dict[Any, str] = {}
        self.changed = False
        used = {n for node in self.g.node for n in list(node.input) + list(node.output)}
        used |= {i.name for i in self.g.initializer} | {i.name for i in self.g.input}
        self._names = used
        self._k = 0
        self._forced = {n: True for n in used if n.startswith("ppe_shape_")}

    def fresh(self, base: str) -> str:
        while True:
            self._k += 1
            name = f"ppe_{base}_{self._k}"
            if name not in self._names:
                self._names.add(name)
                return name

    def const(self, arr: np.ndarray) -> str:
        arr = np.asarray(arr)
        key = ("c", arr.dtype.str, arr.shape, arr.tobytes())
        if key not in self.cache:
            name = self.fresh("const")
            self.inits.append(numpy_helper.from_array(arr, name))
            self.cache[key] = name
        return self.cache[key]

    def dim_piece(self, e) -> str | None:
        """1-element int64 tensor holding dim expression e, in an importer-friendly form."""
        if e.is_number:
            return self.const(np.array([int(e)], np.int64))
        if isinstance(e, sympy.Symbol) and e in self.sym.src:
            src, ax = self.sym.src[e]
            key = ("dim", src, ax)
            if key not in self.cache:
                name = self.fresh("dim")
                self.prefix.append(
                    helper.make_node("Shape", [src], [name], start=ax, end=ax + 1, name=name)
                )
                self.cache[key] = name
            return self.cache[key]
        return None

    def shape_tensor(self, dims: list, force_concat: bool = False) -> str | None:
        if force_concat and all(d.is_number for d in dims):
            key = ("forced", tuple(int(d) for d in dims))
            if key not in self.cache:
                name = self.fresh("shape")
                c = self.const(np.array([int(d) for d in dims], np.int64))
                self.prefix.append(helper.make_node("Concat", [c], [name], axis=0, name=name))
                self.cache[key] = name
            return self.cache[key]
        if all(d.is_number for d in dims):
            return self.const(np.array([int(d) for d in dims], np.int64))
        pieces = [self.dim_piece(d) for d in dims]
        if any(p is None for p in pieces):
            return None
        key = ("shape", tuple(pieces))
        if key not in self.cache:
            name = self.fresh("shape")
            if len(pieces) == 1:
                self.cache[key] = pieces[0]
                return pieces[0]
            self.prefix.append(helper.make_node("Concat", pieces, [name], axis=0, name=name))
            self.cache[key] = name
        return self.cache[key]

    # ------------------------------------------------------------------
    def run(self) -> bool:
        new_nodes = []
        for node in self.g.node:
            repl = self.rewrite(node)
            if repl is None:
                new_nodes.append(node)
            else:
                new_nodes.extend(repl)
                self.changed = True
        if self.changed or self.prefix:
            del self.g.node[:]
            self.g.node.extend(self.prefix + new_nodes)
            self.g.initializer.extend(self.inits)
        return self.changed

    def rewrite(self, node: onnx.NodeProto):
        if node.domain not in ("", "ai.onnx"):
            return None
        sym = self.sym
        op = node.op_type
        if op == "Range":
            return self.rewrite_range(node)
        if op in _SHAPE_OPERANDS:
            idx = _SHAPE_OPERANDS[op][0]
            if idx >= len(node.input) or not node.input[idx]:
                return None
            name = node.input[idx]
            val = sym.val.get(name)
            if val is None or val.ndim != 1:
                return None
            # TVM's Expand with a constant shape needs a static input shape; a shape
            # that is a Concat becomes a ShapeExpr, which handles symbolic inputs.
            force = op == "Expand" and not _static(sym.shape.get(node.input[0]))
            if _is_initializer_like(self.g, name, self.cache) and not force:
                return None
            if force and self._forced.get(name) is not None:
                return None
            dims = list(val)
            if op == "Reshape":
                dims = self.fix_reshape_dims(node, dims)
            elif op == "Expand":
                dims = self.fix_expand_dims(node, dims)
            if dims is None:
                return None
            t = self.shape_tensor(dims, force_concat=force)
            if force:
                self._forced[t] = True
            if t is None or t == name:
                return None
            new = copy.deepcopy(node)
            new.input[idx] = t
            return [new]
        # fold small constant int computations consumed elsewhere (e.g. Slice ends)
        changed = False
        new = copy.deepcopy(node)
        for k, name in enumerate(node.input):
            val = sym.val.get(name)
            if (
                name
                and val is not None
                and sym.isint.get(name)
                and all(e.is_number for e in val.ravel())
                and not _is_initializer_like(self.g, name, self.cache)
                and op not in ("Shape", "Constant")
            ):
                dtype = helper.tensor_dtype_to_np_dtype(sym.elem.get(name, onnx.TensorProto.INT64))
                if not np.issubdtype(dtype, np.integer):
                    continue
                arr = np.array([int(e) for e in val.ravel()], dtype=dtype).reshape(val.shape)
                new.input[k] = self.const(arr)
                changed = True
        return [new] if changed else None

    def fix_reshape_dims(self, node, dims):
        data_shape = self.sym.shape.get(node.input[0])
        allowzero = any(a.name == "allowzero" and a.i for a in node.attribute)
        out = []
        for i, d in enumerate(dims):
            if d == 0 and not allowzero:
                if data_shape is None or i >= len(data_shape) or data_shape[i] is None:
                    return None
                d = data_shape[i]
            out.append(d)
        if any(d == -1 for d in out) and data_shape is not None and None not in data_shape:
            known = [d for d in out if d != -1]
            rest = sympy.simplify(sympy.Mul(*data_shape) / sympy.Mul(*known))
            if self._expressible(rest):
                out = [rest if d == -1 else d for d in out]
        # at most one dim may be unknown to the importer: that one becomes -1
        bad = [i for i, d in enumerate(out) if not self._expressible(d)]
        if len(bad) > 1:
            return None
        if bad:
            if any(d == -1 for d in out):
                return None
            out[bad[0]] = sympy.Integer(-1)
        return out

    def fix_expand_dims(self, node, dims):
        data_shape = self.sym.shape.get(node.input[0])
        out = []
        for i, d in enumerate(dims):
            if not self._expressible(d):
                # Expand keeps the input dim where the target says 1
                j = i - (len(dims) - len(data_shape)) if data_shape is not None else -1
                if data_shape is None or j < 0 or data_shape[j] is None:
                    return None
                if sympy.simplify(data_shape[j] - d) != 0:
                    return None
                d = sympy.Integer(1)
            out.append(d)
        return out

    def _expressible(self, d) -> bool:
        return d.is_number or (isinstance(d, sympy.Symbol) and d in self.sym.src)

    def rewrite_range(self, node):
        sym = self.sym
        vals = [sym.val.get(i) for i in node.input]
        if any(v is None for v in vals):
            return None
        start, limit, delta = (_rational(v.ravel()[0]) for v in vals)
        out = node.output[0]
        elem = sym.elem.get(node.input[0], onnx.TensorProto.INT64)
        if not _is_int_elem(elem):
            elem = sym.elem.get(node.input[0]) or onnx.TensorProto.FLOAT
        np_dtype = helper.tensor_dtype_to_np_dtype(elem)
        if start.is_number and limit.is_number and delta.is_number:
            n = max(int(np.ceil((float(limit) - float(start)) / float(delta))), 0)
            arr = (np.arange(n) * np.asarray(delta, dtype=np_dtype) + np.asarray(start, dtype=np_dtype))
            return [
                helper.make_node("Identity", [self.const(arr.astype(np_dtype))], [out], name=node.name)
            ]
        if not (start.is_number and delta.is_number):
            return None
        n = sympy.simplify(sympy.ceiling((limit - start) / delta))
        count = self.shape_tensor([n])
        if count is None:
            return None
        ones = self.fresh("ones")
        csum = self.fresh("cumsum")
        step = np.asarray(delta, dtype=np_dtype)
        fill = numpy_helper.from_array(step.reshape(1), "value")
        nodes = [
            helper.make_node("ConstantOfShape", [count], [ones], value=fill, name=ones),
            helper.make_node(
                "CumSum", [ones, self.const(np.array(0, np.int64))], [csum], name=csum
            ),
            helper.make_node(
                "Add",
                [csum, self.const(np.asarray(float(start) - float(delta)).astype(np_dtype))],
                [out],
                name=node.name or out,
            ),
        ]
        return nodes


def _static(shape) -> bool:
    return shape is not None and all(d is not None and d.is_number for d in shape)


def _is_initializer_like(graph, name, cache) -> bool:
    if name.startswith("ppe_"):
        return True
    return any(i.name == name for i in graph.initializer)
