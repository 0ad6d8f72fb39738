"""Graph rewriting from the symbolic values: importer-friendly shape operands and Ranges.

``_Rewriter`` finds the places where a small integer value that is a function of the
input dims leaves the shape computation: a shape or index operand (``SHAPE_INPUTS``:
Reshape, Expand, ConstantOfShape, Tile, Slice, Pad, Split, ...) gets a dim program
(``dimexpr.DimEmitter.vector``) the importer reads as a ShapeExpr; any other operand (a
position offset, a mask bound) gets the same values as a plain tensor. Input-dependent
``Range`` becomes ``ConstantOfShape -> CumSum -> Add``, which keeps its length tied to the
input dims. Small constant integer computations fold into initializers. What fed the
rewritten operands is left for dead-code removal.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import onnx
import sympy
from onnx import helper, numpy_helper

from ..spec.pixel_inputs import PINNED_IMAGE
from .dimexpr import DimEmitter, NotExpressible
from .slice_rules import clamp_slice_ends, slice_as_take
from .symbolic import _rational, _Sym

SHAPE_INPUTS = {  # op_type -> input indices read as shapes, bounds or sizes
    "Reshape": (1,),
    "Expand": (1,),
    "ConstantOfShape": (0,),
    "Tile": (1,),
    "Slice": (1, 2, 3, 4),
    "Pad": (3,),  # symbolic pads: rewrite_pad
    "Split": (1,),
    "TopK": (1,),
    "OneHot": (1,),
    "Resize": (3,),
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
        self._init_names = {i.name for i in self.g.initializer}
        self.dims = DimEmitter(self)
        self.unexpressed: list[tuple[onnx.NodeProto, int, str]] = []  # (node, input, why)

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

    # ------------------------------------------------------------------
    def run(self) -> bool:
        return self._apply(self.rewrite) > 0

    def run_only(self, op_type: str) -> int:
        """Only the rule for `op_type` ("If": inline_if); how many nodes it replaced."""
        rule = {"If": self.inline_if}[op_type]
        return self._apply(lambda node: rule(node) if node.op_type == op_type else None)

    def _apply(self, rewrite) -> int:
        new_nodes, replaced = [], 0
        for node in self.g.node:
            repl = rewrite(node)
            if repl is None:
                new_nodes.append(node)
            else:
                new_nodes.extend(repl)
                replaced += 1
        self.changed |= replaced > 0
        if self.changed or self.prefix:
            del self.g.node[:]
            self.g.node.extend(self.prefix + new_nodes)
            self.g.initializer.extend(self.inits)
        return replaced

    def pin_multiples(self) -> bool:
        """Each graph input with a dim known to be a multiple m reshaped to m * (dim // m)
        ahead of its consumers (the same tensor, for the sizes the bundle takes), so that
        TVM derives every later shape from dim // m, the form the dim programs are written
        in (``DimEmitter._in_dims``)."""
        # only where a multiple is coarser than the patch (Swin's windows): a ViT's grid
        # floor(H / patch) is the form TVM's conv gives already
        quotients = {q for q, (_, m, patch) in self.sym.quotients.items() if m > patch}
        pinned, reshapes = {}, []
        for vi in self.g.input:
            shape = self.sym.shape.get(vi.name)
            if not shape or not any(isinstance(d, sympy.Expr) and d.free_symbols & quotients for d in shape):
                continue
            pinned[vi.name] = self.fresh(PINNED_IMAGE[len("ppe_"):])
            reshapes.append(helper.make_node("Reshape", [vi.name, self.dims.vector(shape)], [pinned[vi.name]],
                                             name=pinned[vi.name]))
        if not pinned:
            return False
        for node in self.g.node:  # dims are read from the input itself, as before
            if node.op_type != "Shape":
                node.input[:] = [pinned.get(i, i) for i in node.input]
        nodes = self.prefix + reshapes + list(self.g.node)
        del self.g.node[:]
        self.g.node.extend(nodes)
        self.g.initializer.extend(self.inits)
        return True

    def dry_run(self) -> dict[int, tuple[int, str]]:
        """{node index: (input index, why)} for operands no dim program expresses; the
        graph is not changed."""
        found = {}
        for index, node in enumerate(self.g.node):
            before = len(self.unexpressed)
            self.rewrite(node)
            if len(self.unexpressed) > before:
                _, k, why = self.unexpressed[before]
                found[index] = (k, why)
        return found

    def rewrite(self, node: onnx.NodeProto):
        if node.domain not in ("", "ai.onnx") or node.op_type in ("Shape", "Constant"):
            return None
        if node.op_type == "Range":
            return self.rewrite_range(node)
        if node.op_type == "Pad":
            padded = self.rewrite_pad(node)
            if padded is not None:
                return padded
        if node.op_type == "If":
            return self.inline_if(node)
        if node.op_type == "Split":
            sliced = self.rewrite_split(node)
            if sliced is not None:
                return sliced
        if all(o in self.sym.val for o in node.output if o):
            return None  # inside a shape computation: its consumers are rewritten instead
        if node.op_type == "Slice":
            taken = slice_as_take(self, node)
            if taken is not None:
                return taken
        clamped = clamp_slice_ends(self, node) if node.op_type == "Slice" else None
        new, changed = copy.deepcopy(clamped or node), clamped is not None
        for k, name in enumerate(node.input):
            val = self.sym.val.get(name)
            if not name or val is None or not self.sym.isint.get(name):
                continue
            if name.startswith("ppe_") or (name in self._init_names and not self._expand_shape(node, k)):
                continue
            try:
                operand = self.operand(node, k, val)
            except NotExpressible as err:
                self.unexpressed.append((node, k, str(err)))
                continue
            if operand is not None and operand != name:
                new.input[k] = operand
                changed = True
        return [new] if changed else None

    def operand(self, node: onnx.NodeProto, k: int, val: np.ndarray) -> str | None:
        """The importer-friendly replacement of input k (known to hold val), or None."""
        name, op = node.input[k], node.op_type
        elem = self.sym.elem.get(name, onnx.TensorProto.INT64)
        numbers = all(e.is_number for e in val.ravel())
        if self._expand_shape(node, k):
            # TVM's Expand with a constant shape needs a static input shape; a shape
            # that is a Concat becomes a ShapeExpr, which takes symbolic inputs.
            out = self.sym.shape.get(node.output[0])
            dims = out if out is not None and all(self.sym.followed(d) for d in out) else list(val)
            if not all(self.sym.followed(d) for d in dims):
                raise NotExpressible(f"Expand shape {list(val)}")
            return self.dims.vector(dims)  # a Concat even when every dim is a number
        if numbers:
            dtype = helper.tensor_dtype_to_np_dtype(elem)
            if not np.issubdtype(dtype, np.integer):
                return None
            return self.const(np.array([int(e) for e in val.ravel()], dtype=dtype).reshape(val.shape))
        if not all(self.sym.followed(e) for e in val.ravel()):
            raise NotExpressible(f"value {_show(val)} depends on dims no graph input has")
        if k in SHAPE_INPUTS.get(op, ()) and val.ndim == 1:
            dims = list(val)
            if op == "Reshape":  # the exact output dims: no 0 or -1 left for the importer
                out = self.sym.shape.get(node.output[0])
                if out is not None and all(self.sym.followed(d) for d in out):
                    dims = out
            return self.dims.vector(dims)
        return self.dims.tensor(val, elem)

    def _expand_shape(self, node, k) -> bool:
        """Input k is the shape of an Expand whose input has a symbolic shape."""
        return node.op_type == "Expand" and k == 1 and not _static(self.sym.shape.get(node.input[0]))

    def rewrite_range(self, node):
        sym = self.sym
        vals = [sym.val.get(i) for i in node.input]
        if any(v is None for v in vals):
            return None
        start, limit, delta = (_rational(v.ravel()[0]) for v in vals)
        out = node.output[0]
        elem = sym.elem.get(node.input[0], onnx.TensorProto.INT64)
        np_dtype = helper.tensor_dtype_to_np_dtype(elem)
        if start.is_number and limit.is_number and delta.is_number:
            n = max(int(np.ceil((float(limit) - float(start)) / float(delta))), 0)
            arr = (np.arange(n) * np.asarray(delta, dtype=np_dtype) + np.asarray(start, dtype=np_dtype))
            return [
                helper.make_node("Identity", [self.const(arr.astype(np_dtype))], [out], name=node.name)
            ]
        if not delta.is_number or not all(sym.followed(e) for e in (start, limit)):
            self.unexpressed.append((node, 1, f"Range({start}, {limit}, {delta})"))
            return None
        try:
            count = self.dims.vector([sympy.ceiling((limit - start) / delta)])
            offset = start - delta
            base = (self.const(np.asarray(float(offset)).astype(np_dtype)) if offset.is_number
                    else self.dims.tensor(np.array(offset, dtype=object), elem))
        except NotExpressible as err:
            self.unexpressed.append((node, 1, str(err)))
            return None
        ones, csum = self.fresh("ones"), self.fresh("cumsum")
        fill = numpy_helper.from_array(np.asarray(delta, dtype=np_dtype).reshape(1), "value")
        return [
            helper.make_node("ConstantOfShape", [count], [ones], value=fill, name=ones),
            helper.make_node("CumSum", [ones, self.const(np.array(0, np.int64))], [csum], name=csum),
            helper.make_node("Add", [csum, base], [out], name=node.name or out),
        ]

    def inline_if(self, node):
        """An If whose condition the dims decide, as the nodes of the branch taken: TVM's
        importer cannot follow shapes into a branch, and onnxsim's folding of such an If
        (DINOv3's rope in a TorchScript export: a test of a tensor's rank) can fail."""
        cond = self.sym.val.get(node.input[0])
        if cond is None or cond.size != 1 or not sympy.sympify(cond.ravel()[0]).is_number:
            return None
        branch = next(helper.get_attribute_value(a) for a in node.attribute
                      if a.name == ("then_branch" if bool(cond.ravel()[0]) else "else_branch"))
        self.inits.extend(branch.initializer)
        nodes = [copy.deepcopy(n) for n in branch.node]
        for inner, outer in zip(branch.output, node.output):
            nodes.append(helper.make_node("Identity", [inner.name], [outer], name=self.fresh("if_out")))
        return nodes

    def rewrite_split(self, node):
        """Split by symbolic sizes as one Slice per piece: TVM's Split takes constant sizes
        only, and its importer refuses a ShapeExpr there ("cannot handle ShapeExpr inputs");
        a Slice takes one. (A vision tower splits its tokens into prefix and patches, the
        patches h * w of them.)"""
        sizes = self.sym.val.get(node.input[1]) if len(node.input) > 1 and node.input[1] else None
        if sizes is None or all(e.is_number for e in sizes.ravel()) or not all(self.sym.followed(e) for e in sizes.ravel()):
            return None
        axis = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "axis"), 0)
        shape = self.sym.shape.get(node.input[0])
        total = shape[axis] if shape is not None else None
        if total is None or not self.sym.followed(total):
            return None
        nodes, start = [], sympy.Integer(0)
        for size, out in zip(sizes.ravel(), node.output):
            end = sympy.expand(start + size)
            if out:
                # a constant end on a symbolic axis: TVM's Slice would write the piece as
                # min(end, total), which no later broadcast matches; total - (total - end) is
                # the same number in a form it keeps, and then takes as in range
                ends = self.dims.unsimplified(end, total) if end.is_number else self.dims.vector([end])
                nodes.append(helper.make_node("Slice", [node.input[0], self.dims.vector([start]), ends,
                                                        self.const(np.array([axis], np.int64))], [out], name=out))
            start = end
        return nodes

    def rewrite_pad(self, node):
        """Constant Pad by symbolic amounts as Concat with ConstantOfShape blocks: TVM's
        Pad takes constant pads only ("Dynamic pads are not supported yet"), and its
        importer refuses a ShapeExpr there."""
        sym = self.sym
        pads = sym.val.get(node.input[1]) if len(node.input) > 1 else None
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        data_shape = sym.shape.get(node.input[0])
        if pads is not None and all(e.is_number for e in pads.ravel()) and node.input[1] not in self._init_names:
            # amounts computed from dims that the multiples decide (Swin pads H and W up to
            # whole windows: nothing, when the image is in whole windows); TVM's Pad would
            # see a computation, not constants, and lose the output's shape
            if not any(int(e) for e in pads.ravel()):
                return [helper.make_node("Identity", [node.input[0]], [node.output[0]], name=node.name)]
            fixed = copy.deepcopy(node)
            fixed.input[1] = self.const(np.array([int(e) for e in pads.ravel()], np.int64))
            return [fixed]
        if (pads is None or all(e.is_number for e in pads.ravel()) or attrs.get("mode", b"constant") != b"constant"
                or (len(node.input) > 3 and node.input[3]) or data_shape is None):
            return None
        value = 0
        if len(node.input) > 2 and node.input[2]:
            fill = sym.val.get(node.input[2])
            if fill is None or not fill.ravel()[0].is_number:
                return None
            value = fill.ravel()[0]
        pads, rank = list(pads.ravel()), len(data_shape)
        if not all(sym.followed(d) for d in data_shape + pads):
            self.unexpressed.append((node, 1, f"Pad pads {pads} of a {_show(np.array(data_shape, dtype=object))} input"))
            return None
        elem = sym.elem.get(node.input[0], onnx.TensorProto.FLOAT)
        fill_value = numpy_helper.from_array(np.array([value], dtype=helper.tensor_dtype_to_np_dtype(elem)), "value")
        current, shape, nodes = node.input[0], list(data_shape), []
        for axis in range(rank):
            before, after = pads[axis], pads[axis + rank]
            if before == 0 and after == 0:
                continue
            parts = []
            for amount in (before, after):
                if amount == 0:
                    parts.append(None)
                    continue
                block = self.fresh("pad_block")
                nodes.append(helper.make_node("ConstantOfShape", [self.dims.vector(shape[:axis] + [amount] + shape[axis + 1:])],
                                              [block], value=fill_value, name=block))
                parts.append(block)
            joined = self.fresh("padded")
            nodes.append(helper.make_node("Concat", [p for p in (parts[0], current, parts[1]) if p], [joined],
                                          axis=axis, name=joined))
            current, shape[axis] = joined, sympy.expand(shape[axis] + before + after)
        if not nodes:
            return [helper.make_node("Identity", [current], [node.output[0]], name=node.name)]
        nodes[-1].output[0] = node.output[0]
        return nodes


def _show(val) -> str:
    return str(val.tolist() if val.ndim else val.item())


def _static(shape) -> bool:
    return shape is not None and all(d is not None and d.is_number for d in shape)
