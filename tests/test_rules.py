"""Negative cases: each must lower, match eager, and fold nothing that breaks a rule.

Every rule's case also runs once with that rule removed (``test_rule_is_load_bearing``), and
must then fail: a negative test that passes without its rule would prove nothing.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from xnnfold import plan

from conftest import assert_all_delegated, check_lowering

K = 12


class PartAlsoUsedElsewhere(nn.Module):
    """A part of a split weight feeds its linear and also a non-GEMM op (a reduction)."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(32, K))
        self.bias = nn.Parameter(torch.randn(32))

    def forward(self, x):
        w1, w2 = self.weight.split(16)
        return F.linear(x, w1) + F.linear(x, w2) * w1.sum(1)


class OverlappingParts(nn.Module):
    """Two linears on overlapping row blocks: together 24 rows of a 16-row param."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(16, K))

    def forward(self, x):
        return F.linear(x, self.weight[:12]), F.linear(x, self.weight[4:])


class Conv1dAndBf16Conv1d(nn.Module):
    """A packed weight split between two conv1d; XNNPACK declines the bf16 one (dtype)."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(16, 8, 3))
        self.bias = nn.Parameter(torch.randn(16))

    def forward(self, x, x16):
        w1, w2 = self.weight.chunk(2)
        b1, b2 = self.bias.chunk(2)
        return (F.conv1d(x, w1, b1, padding=1),
                F.conv1d(x16, w2.to(torch.bfloat16), b2.to(torch.bfloat16), padding=1))


class Bf16Part(nn.Module):
    """One part of a split weight goes, cast to bf16 (half the bytes), to a linear XNNPACK
    declines; the other to a plain fp32 linear XNNPACK would take."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(32, K))

    def forward(self, x, x16):
        w1, w2 = self.weight.split(16)
        return F.linear(x, w1), F.linear(x16, w2.to(torch.bfloat16))


class RandomInBias(nn.Module):
    """A bias computed through ``rand``: no dynamic input, but not a fixed value to fold."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(16, K))
        self.bias = nn.Parameter(torch.randn(16))

    def forward(self, x):
        return F.linear(x, self.weight, self.bias + torch.rand(16) * 0.0)


def _rows():
    torch.manual_seed(0)
    return torch.randn(5, K)


def part_also_used():
    checked = check_lowering(PartAlsoUsedElsewhere(), (_rows(),))
    assert {(o.status, o.rule) for o in checked.fold.operands} == {("declined", "size")}
    assert checked.folded.pte == checked.stock.pte


def overlapping_parts():
    checked = check_lowering(OverlappingParts(), (_rows(),))
    assert {(o.status, o.rule) for o in checked.fold.operands} == {("declined", "size")}


def conv_group_with_a_declined_conv():
    torch.manual_seed(0)
    x = torch.randn(1, 8, 10)
    checked = check_lowering(Conv1dAndBf16Conv1d(), (x, x.bfloat16()), tol=0.25)
    rules = {(o.gemm, o.role): o.rule for o in checked.fold.operands}
    assert rules[("conv1d_1", "weight")] == "delegated", rules
    assert rules[("conv1d", "weight")] == "whole-group", rules
    assert checked.folded.pte == checked.stock.pte


def bf16_part():
    torch.manual_seed(0)
    x = torch.randn(5, K)
    checked = check_lowering(Bf16Part(), (x, x.bfloat16()), tol=0.25)
    rules = {o.gemm: o.rule for o in checked.fold.operands}
    assert rules == {"linear_1": "delegated", "linear": "whole-group"}, rules
    # What stays on portable stays exactly as stock leaves it.
    assert checked.folded.pte == checked.stock.pte


def random_in_bias():
    checked = check_lowering(RandomInBias(), (_rows(),))
    bias = next(o for o in checked.fold.operands if o.role == "bias")
    assert (bias.status, bias.rule) == ("declined", "exact")


NEGATIVE_CASES = {
    "part used by a non-GEMM op": part_also_used,
    "parts larger than the param": overlapping_parts,
    "group with a conv XNNPACK declines": conv_group_with_a_declined_conv,
    "group with a bf16 linear": bf16_part,
    "random op in the cone": random_in_bias,
}


@pytest.mark.parametrize("name", NEGATIVE_CASES)
def test_negative_case(name):
    NEGATIVE_CASES[name]()


def _without(monkeypatch, rule):
    if rule == "size":
        monkeypatch.setattr(plan, "GROUP_RULES", [])
    elif rule == "exact":
        monkeypatch.setattr(plan, "MEMBER_RULES", [])
    elif rule == "whole-group":
        monkeypatch.setattr(plan, "GROUP_CLOSURE", [])
    elif rule == "delegated":
        monkeypatch.setattr(plan, "rule_delegated", lambda *args: None)


@pytest.mark.parametrize("rule,name", [("size", "part used by a non-GEMM op"),
                                       ("size", "parts larger than the param"),
                                       ("whole-group", "group with a conv XNNPACK declines"),
                                       ("delegated", "group with a bf16 linear"),
                                       ("exact", "random op in the cone")])
def test_rule_is_load_bearing(monkeypatch, rule, name):
    """With ``rule`` removed, its negative case must fail."""
    _without(monkeypatch, rule)
    with pytest.raises(AssertionError):
        NEGATIVE_CASES[name]()


# --------------------------------------------------------------------------------------------
# Cases that look risky but break no rule: they must fold and delegate.


class PortableOpBetween(nn.Module):
    """GEMM 1's output goes through an op XNNPACK does not take (cumsum) into GEMM 2."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(2 * K, K))
        self.bias = nn.Parameter(torch.randn(2 * K))

    def forward(self, x):
        w1, w2 = self.weight.chunk(2)
        b1, b2 = self.bias.chunk(2)
        return F.linear(torch.cumsum(F.linear(x, w1, b1), -1), w2, b2)


class PlainPortableOpBetween(nn.Module):
    def __init__(self, source: PortableOpBetween):
        super().__init__()
        self.first, self.second = nn.Linear(K, K), nn.Linear(K, K)
        with torch.no_grad():
            for layer, weight, bias in zip((self.first, self.second), source.weight.chunk(2),
                                           source.bias.chunk(2)):
                layer.weight.copy_(weight)
                layer.bias.copy_(bias)

    def forward(self, x):
        return self.second(torch.cumsum(self.first(x), -1))


def test_portable_op_between_two_gemms_of_a_group():
    model = PortableOpBetween()
    checked = check_lowering(model, (_rows(),), tol=1e-4, ideal=PlainPortableOpBetween(model))
    assert_all_delegated(checked, packed_shapes=[(2 * K, K), (2 * K,)])
    assert checked.folded.ops_outside == ["aten.cumsum.default"]
    assert checked.folded.delegate_calls == 2


class SevenDimBias(nn.Module):
    """A packed bias computed through a 7-dim view: more dims than XNNPACK supports (6)."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(2 * K, K))
        self.bias = nn.Parameter(torch.randn(2 * K))

    def forward(self, x):
        bias = (self.bias.view(1, 1, 1, 1, 1, 2, K) * 2.0).reshape(-1)
        w1, w2 = self.weight.chunk(2)
        b1, b2 = bias.chunk(2)
        return F.linear(x, w1, b1), F.linear(x, w2, b2)


def test_bias_computed_with_seven_dims():
    """Stock puts the 7-dim view in its delegate, which XNNPACK rejects at init (measured:
    "Failed to define tensor 0 ... xnn_status_unsupported_parameter"); folded, it runs."""
    checked = check_lowering(SevenDimBias(), (_rows(),), stock_run="raises")
    assert_all_delegated(checked, packed_shapes=[(2 * K,)], part_shapes=[(K,), (K, K)])


class DynamicConv1dPair(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(16, 8, 3))

    def forward(self, x, y):
        w1, w2 = self.weight.chunk(2)
        return F.conv1d(x, w1, padding=1), F.conv1d(y, w2, padding=1)


class PlainConv1dPair(nn.Module):
    def __init__(self, source: DynamicConv1dPair):
        super().__init__()
        self.w1 = nn.Parameter(source.weight[:8].detach().clone())
        self.w2 = nn.Parameter(source.weight[8:].detach().clone())

    def forward(self, x, y):
        return F.conv1d(x, self.w1, padding=1), F.conv1d(y, self.w2, padding=1)


def test_conv1d_pair_with_a_dynamic_length():
    """executorch 1.5.1 delegates a conv1d with a dynamic length: both parts fold."""
    torch.manual_seed(0)
    model = DynamicConv1dPair()
    length = torch.export.Dim("length", min=4, max=64)
    checked = check_lowering(model, (torch.randn(1, 8, 10), torch.randn(1, 8, 12)),
                             dynamic_shapes=({}, {2: length}), ideal=PlainConv1dPair(model),
                             run_inputs=[(torch.randn(1, 8, 10), torch.randn(1, 8, 30))])
    assert_all_delegated(checked, packed_shapes=[(16, 8, 3)], part_shapes=[(8, 8, 3)])
    assert checked.folded.pte_bytes == checked.ideal.pte_bytes
