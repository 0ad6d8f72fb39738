"""Where the float32 attention kernel reads Q and writes its output.

An encoder hands attention its heads as ``permute_dims(reshape(x, [B, T, H, D]), [0, 2, 1, 3])``
of a projection's columns, and takes the result back the same way round:
``reshape(permute_dims(o, [0, 2, 1, 3]), [B, T, H * E])``. Each of those is a kernel that
copies a whole [B, T, H * D] tensor. The attention kernel reads Q one element at a time (a
broadcast), so it can read Q where the projection wrote it: head h of query i is columns
``offset + h * D`` onward of row i. It writes the merged output the same way, for the next
dense to read as it is.

Measured on the kernel alone (B = 8, T = 512, 4 heads of 64, 2 threads): 15.76 ms as
before, 16.02 reading Q in place and writing merged heads, against 0.46 ms for Q's copy
and 0.34 for the merge. V stays a copy: read in place, V's rows sit a projection row
apart (3 KiB in the learned graph) instead of 256 bytes, and the kernel took 16.79 ms,
more than V's copy saves. Kᵀ stays a copy: the score tile reads keys as contiguous
vectors.

``projection_rows`` finds the projection behind a head split (a split or a slice of its
columns gives the offset); ``merged_output`` finds the merge a result goes to.
"""

from __future__ import annotations

from tvm import relax

from .head_reshapes import split_bounds
from .relax_util import _tensor_type, call_of, same_dims
from .tir_util import _const_int

_HEADS_FIRST = [0, 2, 1, 3]  # [B, T, H, D] <-> [B, H, T, D]


def _column_range(lookup, part):
    """(source, offset) where `part` is columns offset.. of `source` along its last axis (a
    split's part or a unit-stride slice), else (part, 0)."""
    item = lookup(part)
    if isinstance(item, relax.TupleGetItem) and isinstance(item.tuple_value, relax.Var):
        split = call_of(lookup(item.tuple_value), "relax.split")
        info = _tensor_type(split.args[0]) if split is not None else None
        if info is not None and int(split.attrs.axis) % len(info[1]) == len(info[1]) - 1:
            bounds = split_bounds(split, info[1][-1])
            if bounds is not None:
                return split.args[0], bounds[int(item.index)]
    sliced = call_of(item, "relax.strided_slice")
    info = _tensor_type(sliced.args[0]) if sliced is not None else None
    if info is not None:
        # TVM 0.27: axes, begin, end (and strides) are the call's tuple arguments
        axes, begins = sliced.args[1].fields, sliced.args[2].fields
        strides = sliced.args[4].fields if len(sliced.args) > 4 else []
        axis, begin = (_const_int(axes[0]), _const_int(begins[0])) if len(axes) == 1 else (None, None)
        if axis is not None and axis % len(info[1]) == len(info[1]) - 1 and begin is not None and begin >= 0 \
                and (not strides or _const_int(strides[0]) == 1):
            return sliced.args[0], begin
    return part, 0


def projection_rows(lookup, heads_first, *, heads: int, dim: int, batch, length):
    """(source, (width, offset)) where `heads_first` [B, H, L, dim] is a head split of
    columns offset.. of `source` [B, L, width]; None otherwise. `lookup` is the mutator's
    lookup_binding."""
    perm = call_of(lookup(heads_first), "relax.permute_dims") if isinstance(heads_first, relax.Var) else None
    if perm is None or [int(a) for a in perm.attrs.axes] != _HEADS_FIRST or not isinstance(perm.args[0], relax.Var):
        return None
    split_heads = call_of(lookup(perm.args[0]), "relax.reshape")
    if split_heads is None or not isinstance(split_heads.args[0], relax.Var):
        return None
    part, split_type = split_heads.args[0], _tensor_type(perm.args[0])
    part_type = _tensor_type(part)
    if part_type is None or split_type is None or part_type[0] != "float32" or len(part_type[1]) != 3:
        return None
    if not same_dims(split_type[1][:2], part_type[1][:2]) or [_const_int(d) for d in split_type[1][2:]] != [heads, dim]:
        return None
    source, offset = _column_range(lookup, part)
    info = _tensor_type(source)
    width = _const_int(info[1][-1]) if info is not None and len(info[1]) == 3 else None
    if width is None or not same_dims(info[1][:2], [batch, length]) or offset + heads * dim > width:
        return None
    return source, (width, offset)


def merged_output(var, values: dict, users: dict, *, heads: int, dim: int, batch, length):
    """The binding var of ``reshape(permute_dims(var, [0, 2, 1, 3]), [B, T, heads * dim])``
    when that merge is the one reader of `var` [B, heads, T, dim] and of the transpose;
    None otherwise. `values` and `users`: the block's bindings and relax.analysis.udchain.
    A reshape of `var` to its own shape on the way (DINOv3's export has one) is looked
    through: it moves nothing."""
    readers = users.get(var, [])
    if len(readers) == 1 and call_of(values.get(readers[0]), "relax.reshape") is not None \
            and _same_shape(readers[0], var):
        readers = users.get(readers[0], [])
    perm = call_of(values.get(readers[0]), "relax.permute_dims") if len(readers) == 1 else None
    if perm is None or [int(a) for a in perm.attrs.axes] != _HEADS_FIRST:
        return None
    readers = users.get(readers[0], [])
    merge = readers[0] if len(readers) == 1 and isinstance(readers[0], relax.DataflowVar) else None
    if merge is None or call_of(values.get(merge), "relax.reshape") is None:
        return None
    info = _tensor_type(merge)
    if info is None or len(info[1]) != 3 or _const_int(info[1][2]) != heads * dim \
            or not same_dims(info[1][:2], [batch, length]):
        return None
    return merge


def _same_shape(a, b) -> bool:
    ta, tb = _tensor_type(a), _tensor_type(b)
    return ta is not None and tb is not None and same_dims(ta[1], tb[1])
