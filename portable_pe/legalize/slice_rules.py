"""Slice rules of the graph rewriter (rewrite._Rewriter): Slices whose bounds TVM's
importer would turn into a dim no other tensor has, written so the dim survives.

Each rule takes the rewriter (its symbolic values ``rw.sym``, constants ``rw.const`` and
dim programs ``rw.dims``) and a Slice node, and returns the replacement or None.
"""

from __future__ import annotations

import copy

import numpy as np
import sympy
from onnx import helper

from .bounds import nonnegative
from .shapes import INT_BIG


def _at_least(dim, start, bounds) -> bool:
    """dim >= start for every input: linear forms by bounds.nonnegative, and a sum of terms
    that cannot be negative (products of dims, floors of them, positive constants: a patch
    grid's gh * gw + 1 >= 1)."""
    if nonnegative(dim - start, bounds):
        return True
    terms = sympy.Add.make_args(sympy.expand(dim - start))
    return all(_never_negative(t) for t in terms)


def _never_negative(e) -> bool:
    if e.is_number:
        return bool(e >= 0)
    if e.is_Symbol:
        return bool(e.is_nonnegative)
    if isinstance(e, (sympy.Mul, sympy.Add)):
        return all(_never_negative(a) for a in e.args)
    if isinstance(e, (sympy.floor, sympy.ceiling)):
        return _never_negative(e.args[0])
    if isinstance(e, sympy.Pow):
        return _never_negative(e.base) and e.exp.is_number
    return False


def slice_as_take(rw, node):
    """A Slice of a few leading elements of a symbolic axis (Swin's cyclic shift back:
    x[:, :s] beside x[:, s:]) as a Gather of those indices. With constant bounds TVM
    writes the slice's length min(s, dim) - the axis might be shorter - and the Concat
    after it a dim no other tensor has; a Gather of s constant indices has length s,
    and the axis is known to be at least that long."""
    bounds = [rw.sym.val.get(i) if i else None for i in node.input[1:5]]
    if len(node.input) < 4 or any(b is None or b.size != 1 for b in bounds[:3]) \
            or (len(bounds) > 3 and bounds[3] is not None and int(bounds[3].ravel()[0]) != 1):
        return None
    start, end, axis = (b.ravel()[0] for b in bounds[:3])
    shape = rw.sym.shape.get(node.input[0])
    if shape is None or not all(e.is_number for e in (start, end, axis)):
        return None
    axis = int(axis) % len(shape)
    dim = shape[axis]
    if dim.is_number or not rw.sym.followed(dim) or not 0 <= int(start) < int(end) <= int(start) + 64 \
            or not _at_least(dim, end, rw.sym.bounds):
        return None
    index = rw.const(np.arange(int(start), int(end), dtype=np.int64))
    return [helper.make_node("Gather", [node.input[0], index], list(node.output), axis=axis, name=node.name)]

def clamp_slice_ends(rw, node):
    """A Slice's "to the end" ends (>= INT_BIG) written as the axis length, or None, where
    TVM's converter would otherwise lose a dim: once one bound is symbolic it takes every
    bound as in range (``assume_inbound``), so an end of 2**63 - 1 makes a dim of about
    2**63; and with constant bounds on a symbolic axis its dim becomes min(2**63 - 2, T),
    which no later broadcast can match with T. ONNX clamps such an end to the axis
    length, so this is exact."""
    sym = rw.sym
    bounds = [sym.val.get(i) if i else None for i in list(node.input[1:5]) + [""] * (5 - len(node.input))]
    starts, ends, axes, steps = bounds
    shape = sym.shape.get(node.input[0])
    if starts is None or ends is None or shape is None:
        return None
    ends = list(ends.ravel())
    axes = list(range(len(ends))) if axes is None and not node.input[3:4] else axes
    steps = [1] * len(ends) if steps is None and not node.input[4:5] else steps
    if axes is None or steps is None:
        return None
    out_shape = dict(enumerate(sym.shape.get(node.output[0]) or []))
    begun, clamped, symbolic_axis, in_range = [], [], False, True
    for start, end, axis, step in zip(list(starts.ravel()), ends, np.ravel(axes), np.ravel(steps)):
        axis, step = sympy.sympify(axis), sympy.sympify(step)  # the defaults are plain ints
        if not (axis.is_number and step.is_number):
            return None
        axis = int(axis) + len(shape) if int(axis) < 0 else int(axis)
        dim = shape[axis]
        if int(step) > 0 and sym.followed(dim) and not dim.is_number:
            # counted from the end on a symbolic axis (Swin's cyclic shift: x[:, -s:] and
            # x[:, :-s]): dim - s, exact where the axis is at least s long; TVM would
            # write min(max(dim - s, 0), dim) and lose the dim
            if start.is_number and int(start) < 0 and _at_least(dim, -int(start), sym.bounds):
                start = sympy.expand(dim + start)
            if end.is_number and -INT_BIG < int(end) < 0 and _at_least(dim, -int(end), sym.bounds):
                end = sympy.expand(dim + end)
        if end.is_number and int(end) >= INT_BIG and int(step) > 0 and sym.followed(dim):
            symbolic_axis |= not dim.is_number
            # with every bound taken as in range, a start must be one: not from the end
            # (x[:, -4:]) and not past the axis for any input
            in_range &= (not start.is_number or int(start) >= 0) and _at_least(dim, start, sym.bounds)
            end = dim
            length = out_shape.get(axis)
            if int(step) > 1 and length is not None and sym.followed(length) and not length.is_number:
                # the last element taken, plus one: TVM's (end - start + step - 1) // step is then
                # the exact count in every slice (Swin's x[:, 0::2] and x[:, 1::2] both H/8),
                # where the axis length would give (H/4 + 1) // 2 and (H/4) // 2, unequal to it
                end = sympy.expand(start + step * (length - 1) + 1)
        begun.append(start)
        clamped.append(end)
    symbolic_bound = not all(e.is_number for e in list(starts.ravel()) + ends)
    # once a bound is symbolic TVM takes every bound as in range: none may count from the end
    in_range &= all(not b.is_number or int(b) >= 0 for b in begun + clamped)
    symbolic_axis |= begun != list(starts.ravel()) or any(not e.is_number for e in clamped if e not in ends)
    unchanged = clamped == ends and begun == list(starts.ravel())
    if unchanged or not (symbolic_bound or (symbolic_axis and in_range)) \
            or not all(sym.followed(e) for e in begun + clamped):
        return None
    new = copy.deepcopy(node)
    new.input[1] = rw.dims.vector(begun)
    new.input[2] = rw.dims.vector(clamped)
    return new
