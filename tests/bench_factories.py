"""Factories for ``xnnfold lower package.module:function`` in the CLI tests."""

import torch
from torch import nn


class MeanHead(nn.Module):
    """A linear, then ops XNNPACK declines with a logged reason: a mean over a 2-D tensor and
    a fourth power (its pow config takes power 2 only; xnnfold's powers step writes only a cube
    or a float square as products); and a sum, which has no config at all."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x):
        y = self.linear(x)
        return y.mean(dim=-1) + (y ** 4).sum(dim=-1)


def mean_head():
    torch.manual_seed(0)
    return MeanHead(), (torch.randn(2, 8),)


def not_a_pair():
    return nn.Linear(2, 2)


def raises():
    raise ValueError("no model today")


def not_exportable():
    class Branchy(nn.Module):
        def forward(self, x):
            if x.sum() > 0:      # data-dependent control flow: torch.export refuses it
                return x + 1
            return x - 1
    return Branchy(), (torch.randn(3),)


NOT_CALLABLE = 3


class WhereMask(nn.Module):
    """``mask[torch.where(...)] = False``, as transformers' Mask2Former query decoder writes
    it: executorch 1.5.1 lowers it (with or without a partitioner) to a portable
    ``slice_copy`` between tensors of different dim orders, and the .pte fails at run time
    (error 0x12)."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(5, 5)

    def forward(self, x, mask):
        mask = mask.clone()
        mask[torch.where(mask.sum(-1) == mask.shape[-1])] = False
        return self.linear(x).masked_fill(mask, 0.0)


def where_mask():
    torch.manual_seed(0)
    mask = torch.rand(2, 4, 5) > 0.3
    mask[0, 1] = True
    return WhereMask(), (torch.randn(2, 4, 5), mask)
