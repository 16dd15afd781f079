"""Unusual programs: each lowers, runs on the runtime and matches eager (the helper's checks)."""

import copy

import torch
import torch.nn.functional as F
from torch import nn

from conftest import assert_all_delegated, check_lowering

K = 12


class KvCache(nn.Module):
    """A mutable buffer updated in place (a KV cache), beside a packed weight."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(2 * K, K))
        self.register_buffer("cache", torch.zeros(4, K))

    def forward(self, x):
        self.cache.mul_(0.5).add_(x)
        w_k, w_v = self.weight.chunk(2)
        return F.linear(self.cache, w_k), F.linear(x, w_v)


def test_mutable_buffer_is_never_folded():
    torch.manual_seed(0)
    model, x = KvCache(), torch.randn(4, K)
    ep = torch.export.export(copy.deepcopy(model), (x,))
    checked = check_lowering(copy.deepcopy(model), (x,), ep=ep,
                             reference=lambda *a: copy.deepcopy(model)(*a))
    assert_all_delegated(checked, packed_shapes=[(2 * K, K)])
    assert "cache" not in {c.source for c in checked.fold.constants}


class InPlaceOnParamCopy(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(K, K))

    def forward(self, x):
        weight = self.weight.clone()
        weight.mul_(2.0)
        return F.linear(x, weight)


def test_in_place_op_on_a_param_copy():
    torch.manual_seed(0)
    check_lowering(InPlaceOnParamCopy(), (torch.randn(5, K),))


class PackedHalf(nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(2 * K, K, dtype=dtype))
        self.bias = nn.Parameter(torch.randn(2 * K, dtype=dtype))

    def forward(self, x):
        (w1, w2), (b1, b2) = self.weight.chunk(2), self.bias.chunk(2)
        return F.linear(x, w1, b1) + F.linear(x, w2, b2)


def test_fp16_params():
    torch.manual_seed(0)
    checked = check_lowering(PackedHalf(torch.float16), (torch.randn(5, K).half(),), tol=2e-2)
    assert checked.folded.pte_bytes <= checked.stock.pte_bytes + 64


class Tied(nn.Module):
    """One param read by a plain linear, by a computed-weight linear, and by an embedding."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(K, K)
        self.head = nn.Linear(K, K, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens, x):
        return self.head(self.embed(tokens)) + x @ (self.embed.weight.t() * 0.5)


def test_params_tied_across_modules():
    torch.manual_seed(0)
    checked = check_lowering(Tied(), (torch.tensor([1, 3, 5]), torch.randn(3, K)))
    computed = [o for o in checked.fold.operands if o.status != "plain"]
    # Folding the scaled transpose would store the tied table twice: the size rule declines.
    assert [(o.status, o.rule) for o in computed] == [("declined", "size")]
