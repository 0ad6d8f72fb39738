"""The constants of a torch.fx program after const_fold: what a node reads when it reads
a constant.

torch.fx's const_fold (split_const_subgraphs + run_folding) leaves each folded tensor as
an item of one ParameterList attribute, so a constant shows up either as a `get_attr`
node or as `getitem(get_attr, i)`; the Ethos-U export's passes (npu/vela.py's sharing of
equal constants, npu/constant_concat.py) need both forms.
"""

from __future__ import annotations

import operator


def folded_constant(gm, node):
    """The tensor `node` reads if it is a constant of `gm` (a get_attr, or an item of
    const_fold's folded list); None for anything else."""
    if node.op == "get_attr":
        return attribute(gm, node.target)
    if node.op == "call_function" and node.target is operator.getitem and node.args[0].op == "get_attr":
        holder = attribute(gm, node.args[0].target)
        if not hasattr(holder, "shape"):  # the folded list, not a tensor being indexed
            return holder[node.args[1]]
    return None


def attribute(gm, target: str):
    """`gm`'s attribute at a dotted get_attr target."""
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj
