"""npu/constant_concat.py: a concatenation with a constant part becomes zero-padded parts
that are added, in a const-folded torch.fx program; the output is unchanged bit for bit."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.fx.experimental.const_fold import split_const_subgraphs

from portable_pe.npu.constant_concat import pad_constant_concats


class ClsPrefix(torch.nn.Module):
    """transformers' ViT way: cat([cls.expand(B, 1, D), patches], 1)."""

    def __init__(self):
        super().__init__()
        self.cls = torch.nn.Parameter(torch.randn(1, 1, 8))
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.proj(torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1))


class ConstantInTheMiddle(torch.nn.Module):
    """A constant between two computed parts, on the last axis."""

    def __init__(self):
        super().__init__()
        self.register_buffer("middle", torch.arange(12.0).reshape(1, 3, 4))

    def forward(self, x):
        return torch.cat([x * 2, self.middle + 1, x.flip(-1)], dim=-1)


class NoConstant(torch.nn.Module):
    def forward(self, x):
        return torch.cat([x, x * 3], dim=1)


def folded(module, example):
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        gm = split_const_subgraphs(torch.export.export(module.eval(), (example,)).module())
        gm.run_folding()
    return gm


def cats(gm) -> int:
    return sum(n.op == "call_function" and n.target in (torch.ops.aten.cat.default, torch.cat) for n in gm.graph.nodes)


@pytest.mark.parametrize("module, shape, parts", [(ClsPrefix(), (2, 5, 8), 2), (ConstantInTheMiddle(), (1, 3, 6), 3)])
def test_a_concatenation_with_a_constant_part_becomes_padded_parts_with_the_same_output(module, shape, parts):
    torch.manual_seed(0)
    x = torch.randn(shape)
    gm = folded(module, x)
    assert cats(gm) == 1
    assert pad_constant_concats(gm) == 1
    assert cats(gm) == 0
    pads = [n for n in gm.graph.nodes if n.target is torch.ops.aten.constant_pad_nd.default]
    assert len(pads) == parts
    with torch.no_grad():
        (out,) = gm(x)  # export's graph returns a tuple
        assert torch.equal(out, module(x))
        # the rewritten program exports again (what the Ethos-U path converts)
        (again,) = torch.export.export(gm, (x,)).module()(x)
        assert torch.equal(again, module(x))


def test_a_concatenation_of_computed_parts_is_left_as_it_is():
    x = torch.randn(1, 4, 8)
    gm = folded(NoConstant(), x)
    assert pad_constant_concats(gm) == 0 and cats(gm) == 1
