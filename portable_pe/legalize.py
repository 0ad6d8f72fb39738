"""ONNX -> ONNX rewrites that let TVM's Relax ONNX importer follow dynamic shapes.

TVM's importer tracks shapes symbolically (``relax.ShapeExpr``) only through a few
patterns: ``Shape`` (with start/end) of a tensor whose shape it knows, ``Gather``
of one element, ``Concat`` of shape-like pieces, ``Squeeze``/``Unsqueeze``.  Anything
else (``Range`` with a computed limit, arithmetic on shape values, ``Shape`` of a
tensor whose shape it lost) yields fresh, unrelated symbolic variables; a later
broadcast against the real sequence axis then loses the shape and a ``-1`` reshape
fails ("Reshape expects the input tensor to have known shape").

``legalize`` evaluates every small integer/shape computation of the graph
symbolically (sympy, dims of the graph inputs as symbols), then:

* folds computations whose value is a plain constant into initializers;
* rebuilds every shape operand (Reshape/Expand/ConstantOfShape/Tile shape inputs)
  as ``Concat(Shape(input, start=i, end=i+1) | constant ...)`` -- the form the
  importer turns into a ``ShapeExpr`` over the graph inputs' symbolic dims
  (a dim that is a compound expression becomes ``-1`` in Reshape or ``1`` in Expand
  when that is exact);
* replaces ``Range(start, limit, delta)`` whose length depends on an input dim by
  ``ConstantOfShape([n]) -> CumSum -> Add``, which keeps the length tied to the
  input's dim (TVM's Range converter always invents a fresh length variable);
* removes the dead remains.

Nothing is fixed to a size: batch and sequence axes stay dynamic.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import numpy as np
import onnx
import sympy
from onnx import helper, numpy_helper

__all__ = ["legalize", "blocking_nodes"]

_MAX_ELEMS = 64  # only small tensors are evaluated symbolically
_SHAPE_OPERANDS = {  # op_type -> input indices that are shapes
    "Reshape": (1,),
    "Expand": (1,),
    "ConstantOfShape": (0,),
    "Tile": (1,),
}
_DIM_EXPR_RE = re.compile(r"^[A-Za-z0-9_+\-*/() ]+$")


# --------------------------------------------------------------------------- #
# symbolic values
# --------------------------------------------------------------------------- #
class _Sym:
    """Symbolic evaluation state for one graph."""

    def __init__(self, graph: onnx.GraphProto):
        self.graph = graph
        self.val: dict[str, np.ndarray] = {}  # object arrays of sympy exprs
        self.isint: dict[str, bool] = {}
        self.shape: dict[str, list | None] = {}
        self.elem: dict[str, int] = {}
        self.src: dict[sympy.Symbol, tuple[str, int]] = {}  # symbol -> (graph input, axis)

        for vi in list(graph.input) + list(graph.value_info) + list(graph.output):
            t = vi.type.tensor_type
            if vi.type.HasField("tensor_type"):
                self.elem[vi.name] = t.elem_type
                self.shape[vi.name] = _dims(t) if t.HasField("shape") else None
        init_names = {i.name for i in graph.initializer}
        for vi in graph.input:
            if vi.name in init_names:
                continue
            for ax, d in enumerate(self.shape.get(vi.name) or []):
                if isinstance(d, sympy.Symbol) and d not in self.src:
                    self.src[d] = (vi.name, ax)
        for init in graph.initializer:
            arr = numpy_helper.to_array(init)
            self.elem[init.name] = init.data_type
            self.shape[init.name] = [sympy.Integer(d) for d in arr.shape]
            self._set_const(init.name, arr)

    def _set_const(self, name, arr):
        arr = np.asarray(arr)
        if arr.size <= _MAX_ELEMS and (
            np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)
        ):
            isint = bool(np.issubdtype(arr.dtype, np.integer))
            conv = (lambda v: sympy.Integer(int(v))) if isint else (lambda v: sympy.Float(float(v)))
            self.val[name] = np.vectorize(conv, otypes=[object])(arr) if arr.size else arr.astype(object)
            self.isint[name] = isint

    def run(self):
        for node in self.graph.node:
            try:
                self._eval(node)
            except Exception:  # pylint: disable=broad-except
                pass  # value unknown: the node is left as it is

    # one node -------------------------------------------------------------
    def _eval(self, node: onnx.NodeProto):
        op, ins, outs = node.op_type, list(node.input), list(node.output)
        if node.domain not in ("", "ai.onnx"):
            return
        a = {x.name: helper.get_attribute_value(x) for x in node.attribute}
        v = [self.val.get(i) if i else None for i in ins]
        out = None
        isint = self.isint.get(ins[0]) if ins else True

        if op == "Constant":
            if "value" in a:
                arr = numpy_helper.to_array(a["value"])
            elif "value_int" in a:
                arr = np.array(a["value_int"], np.int64)
            elif "value_ints" in a:
                arr = np.array(a["value_ints"], np.int64)
            elif "value_float" in a:
                arr = np.array(a["value_float"], np.float32)
            else:
                return
            self.shape[outs[0]] = [sympy.Integer(d) for d in arr.shape]
            self._set_const(outs[0], arr)
            return
        if op == "Shape":
            shp = self.shape.get(ins[0])
            if shp is None:
                return
            # unknown dims become fresh placeholders: picking a known dim still works
            shp = [sympy.Dummy("unk", integer=True, positive=True) if d is None else d for d in shp]
            start, end = a.get("start", 0), a.get("end", None)
            out, isint = _arr(shp[start:end]), True
        elif op == "Size":
            shp = self.shape.get(ins[0])
            if shp is None or any(d is None for d in shp):
                return
            out, isint = np.array(sympy.Mul(*shp), dtype=object), True
        elif any(x is None for x, i in zip(v, ins) if i) and op != "Range":
            return
        elif op in ("Identity", "Cast", "CastLike"):
            out = v[0]
            to = a.get("to") if op == "Cast" else self.elem.get(ins[1])
            if to is not None:
                isint = _is_int_elem(to)
                if isint and not self.isint.get(ins[0], True):
                    out = _vmap(lambda e: sympy.Integer(int(e)) if e.is_number else e, out)
                elif not isint:
                    out = _vmap(lambda e: sympy.Float(float(e)) if e.is_number else e, out)
        elif op == "Gather":
            out = np.take(v[0], v[1].astype(np.int64), axis=a.get("axis", 0))
        elif op == "Slice":
            data = v[0]
            starts, ends = _ints(v[1]), _ints(v[2])
            axes = _ints(v[3]) if len(v) > 3 and v[3] is not None else list(range(len(starts)))
            steps = _ints(v[4]) if len(v) > 4 and v[4] is not None else [1] * len(starts)
            sl = [slice(None)] * data.ndim
            for s, e, ax, st in zip(starts, ends, axes, steps):
                sl[ax] = slice(s, e, st)
            out = data[tuple(sl)]
        elif op == "Concat":
            out = np.concatenate([x for x in v], axis=a.get("axis", 0))
        elif op in ("Unsqueeze", "Squeeze"):
            axes = a.get("axes") or (_ints(v[1]) if len(v) > 1 and v[1] is not None else None)
            if op == "Unsqueeze":
                out = v[0]
                rank = out.ndim + len(axes)
                for ax in sorted(x % rank for x in axes):
                    out = np.expand_dims(out, ax)
            else:
                out = np.squeeze(v[0], axis=tuple(axes) if axes is not None else None)
        elif op == "Reshape":
            shp = [int(x) for x in _ints(v[1])]
            shp = [v[0].shape[i] if d == 0 else d for i, d in enumerate(shp)]
            out = v[0].reshape(shp)
        elif op in ("Add", "Sub", "Mul", "Div", "Mod", "Max", "Min", "Pow"):
            x, y = np.broadcast_arrays(v[0], v[1])
            fn = {
                "Add": lambda p, q: p + q,
                "Sub": lambda p, q: p - q,
                "Mul": lambda p, q: p * q,
                "Div": (lambda p, q: sympy.floor(p / q)) if isint else (lambda p, q: p / q),
                "Mod": lambda p, q: sympy.Mod(p, q),
                "Max": lambda p, q: sympy.Max(p, q),
                "Min": lambda p, q: sympy.Min(p, q),
                "Pow": lambda p, q: p**q,
            }[op]
            out = np.array([fn(p, q) for p, q in zip(x.ravel(), y.ravel())], dtype=object)
            out = out.reshape(x.shape)
        elif op in ("Neg", "Abs", "Floor", "Ceil", "Sqrt"):
            fn = {
                "Neg": lambda p: -p,
                "Abs": sympy.Abs,
                "Floor": sympy.floor,
                "Ceil": sympy.ceiling,
                "Sqrt": sympy.sqrt,
            }[op]
            out = _vmap(fn, v[0])
        elif op == "Equal":
            x, y = np.broadcast_arrays(v[0], v[1])
            res = []
            for p, q in zip(x.ravel(), y.ravel()):
                z = sympy.simplify(p - q).is_zero  # dims are positive symbols
                if z is None:
                    return
                res.append(sympy.Integer(int(z)))
            out, isint = np.array(res, dtype=object).reshape(x.shape), True
        elif op == "Where":
            c, x, y = np.broadcast_arrays(v[0], v[1], v[2])
            out = np.array(
                [p if bool(cc) else q for cc, p, q in zip(c.ravel(), x.ravel(), y.ravel())],
                dtype=object,
            ).reshape(c.shape)
            isint = self.isint.get(ins[1], True)
        elif op == "ConstantOfShape":
            dims = _ints(v[0])
            if int(np.prod(dims)) > _MAX_ELEMS:
                return
            fill = numpy_helper.to_array(a["value"]).ravel()[0] if "value" in a else np.float32(0)
            isint = bool(np.issubdtype(np.asarray(fill).dtype, np.integer))
            e = sympy.Integer(int(fill)) if isint else sympy.Float(float(fill))
            out = np.full([int(d) for d in dims], e, dtype=object)
        elif op == "Range":
            if any(x is None for x in v):
                return
            s, lim, d = (_rational(x.ravel()[0]) for x in v)
            if not (s.is_number and lim.is_number and d.is_number):
                n = sympy.ceiling((lim - s) / d)
                self.shape[outs[0]] = [sympy.simplify(n)]
                return
            n = max(int(np.ceil((float(lim) - float(s)) / float(d))), 0)
            if n > _MAX_ELEMS:
                return
            out = np.array([s + d * k for k in range(n)], dtype=object)
        else:
            return
        if out is None:
            return
        out = np.asarray(out, dtype=object)
        if out.size > _MAX_ELEMS:
            return
        out = _vmap(sympy.simplify, out) if out.size else out
        self.val[outs[0]] = out
        self.isint[outs[0]] = bool(isint)
        self.shape[outs[0]] = [sympy.Integer(d) for d in out.shape]


def _vmap(fn, arr):
    arr = np.asarray(arr, dtype=object)
    flat = [fn(x) for x in arr.ravel()]
    res = np.empty(len(flat), dtype=object)
    res[:] = flat
    return res.reshape(arr.shape)


def _rational(e):
    """Exact form of e: floats holding integers (from Cast to float) become Integers."""
    return sympy.nsimplify(e, rational=True)


def _arr(seq):
    res = np.empty(len(seq), dtype=object)
    res[:] = list(seq)
    return res


def _ints(arr) -> list[int]:
    res = []
    for e in np.asarray(arr, dtype=object).ravel():
        if not e.is_number:
            raise ValueError("symbolic")
        res.append(int(e))
    return res


def _is_int_elem(elem: int) -> bool:
    return elem in (
        onnx.TensorProto.INT64,
        onnx.TensorProto.INT32,
        onnx.TensorProto.INT16,
        onnx.TensorProto.INT8,
        onnx.TensorProto.UINT8,
        onnx.TensorProto.UINT16,
        onnx.TensorProto.UINT32,
        onnx.TensorProto.UINT64,
        onnx.TensorProto.BOOL,
    )


def _dims(t) -> list:
    res = []
    for d in t.shape.dim:
        if d.HasField("dim_value"):
            res.append(sympy.Integer(d.dim_value))
        elif d.HasField("dim_param") and not d.dim_param.startswith("unk__"):
            p = d.dim_param
            if p.isidentifier():
                res.append(sympy.Symbol(p, integer=True, positive=True))
            elif _DIM_EXPR_RE.match(p):
                try:
                    names = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", p))
                    loc = {n: sympy.Symbol(n, integer=True, positive=True) for n in names}
                    res.append(sympy.sympify(p.replace("//", "/"), locals=loc))
                except Exception:  # pylint: disable=broad-except
                    res.append(None)
            else:
                res.append(None)
        else:
            res.append(None)
    return res


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


def _dce(graph: onnx.GraphProto):
    needed = {o.name for o in graph.output}
    keep = []
    for node in reversed(graph.node):
        if any(o in needed for o in node.output) or _has_subgraph(node):
            keep.append(node)
            needed.update(i for i in node.input if i)
            for a in node.attribute:
                for sg in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                    needed.update(_subgraph_inputs(sg))
    keep.reverse()
    del graph.node[:]
    graph.node.extend(keep)
    inits = [i for i in graph.initializer if i.name in needed]
    del graph.initializer[:]
    graph.initializer.extend(inits)
    vis = [v for v in graph.value_info if v.name in needed]
    del graph.value_info[:]
    graph.value_info.extend(vis)


def _has_subgraph(node):
    return any(a.HasField("g") or len(a.graphs) for a in node.attribute)


def _subgraph_inputs(g):
    names = set()
    for n in g.node:
        names.update(i for i in n.input if i)
        for a in n.attribute:
            for sg in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                names |= _subgraph_inputs(sg)
    return names


def _infer(model: onnx.ModelProto) -> onnx.ModelProto:
    # Start from scratch on intermediate shapes: exporter-written value_info may
    # carry stale or unparseable dims; keep graph input/output declarations.
    m = copy.deepcopy(model)
    del m.graph.value_info[:]
    try:
        return onnx.shape_inference.infer_shapes(m, data_prop=True)
    except Exception:  # pylint: disable=broad-except
        try:
            return onnx.shape_inference.infer_shapes(m)
        except Exception:  # pylint: disable=broad-except
            return m


def _set_input_shapes(model: onnx.ModelProto, input_shapes: dict[str, list]):
    for vi in model.graph.input:
        if vi.name not in input_shapes:
            continue
        dims = vi.type.tensor_type.shape.dim
        new = input_shapes[vi.name]
        del dims[:]
        for d in new:
            dim = dims.add()
            if isinstance(d, str):
                dim.dim_param = d
            elif d is None or int(d) < 0:
                dim.dim_param = f"{vi.name}_dim{len(dims) - 1}"
            else:
                dim.dim_value = int(d)


def legalize(
    model: onnx.ModelProto, *, input_shapes: dict[str, list[int | str]] | None = None
) -> onnx.ModelProto:
    """Rewrite ``model`` (a copy) so that TVM's Relax ONNX importer can follow its shapes.

    ``input_shapes`` optionally overrides graph input dims: ints fix a dim, strings
    name a symbolic dim (the same name in two inputs means the same size).
    Dynamic dims stay dynamic.
    """
    model = copy.deepcopy(model)
    if model.functions:
        from onnx import inliner  # pylint: disable=import-outside-toplevel

        model = inliner.inline_local_functions(model)
    if input_shapes:
        _set_input_shapes(model, input_shapes)
    # unnamed dynamic input dims get a name so that they are traceable symbols
    for vi in model.graph.input:
        for ax, d in enumerate(vi.type.tensor_type.shape.dim):
            if not d.HasField("dim_value") and not d.HasField("dim_param"):
                d.dim_param = f"{re.sub(r'[^A-Za-z0-9_]', '_', vi.name)}_dim{ax}"
    for _ in range(8):
        inferred = _infer(model)
        sym = _Sym(inferred.graph)
        sym.run()
        changed = _Rewriter(model, sym).run()
        _dce(model.graph)
        if not changed:
            break
    out = _infer(model)
    return out


# --------------------------------------------------------------------------- #
# blocking nodes
# --------------------------------------------------------------------------- #
def blocking_nodes(model: onnx.ModelProto) -> list[dict]:
    """Nodes that TVM's ONNX import (with portable_pe's converters) would reject.

    Computed statically from the converter tables; nothing is compiled.
    """
    from . import onnx_ops  # pylint: disable=import-outside-toplevel

    return onnx_ops.unsupported_nodes(model)
