"""Negative cases: each must lower, match eager, and fold nothing that breaks a rule.

Every rule's case also runs once with that rule removed (``test_rule_is_load_bearing``), and
must then fail: a negative test that passes without its rule would prove nothing.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from xnnfold.decision import Rule
from xnnfold.steps.fold.rules import DEFAULT_RULES

from conftest import (Fallback, Params, StockPte, UnexpectedFold, assert_all_delegated,
                      check_lowering, expect, expect_fold)

K = 12


# A part of a split weight feeds its linear and also a non-GEMM op (a reduction).
def part_also_used_elsewhere():
    def body(p, x):
        w1, w2 = p.weight.split(16)
        return F.linear(x, w1) + F.linear(x, w2) * w1.sum(1)
    return Params(body, weight=(32, K))


# Two linears on overlapping row blocks: together 24 rows of a 16-row param.
def overlapping_parts_module():
    return Params(lambda p, x: (F.linear(x, p.weight[:12]), F.linear(x, p.weight[4:])),
                  weight=(16, K))


# A packed bf16 weight and bias split between two linears: XNNPACK 1.5.1 takes neither.
def bf16_packed():
    def body(p, x):
        (w1, w2), (b1, b2) = p.weight.chunk(2), p.bias.chunk(2)
        return F.linear(x, w1, b1) + F.linear(x, w2, b2)
    return Params(body, weight=((32, K), torch.bfloat16), bias=((32,), torch.bfloat16))


# Two parts of a split weight; one goes through ``rand`` (not a fixed value to fold).
def random_in_one_part():
    def body(p, x):
        w1, w2 = p.weight.split(16)
        return F.linear(x, w1 + torch.rand(16, K) * 0.0), F.linear(x, w2)
    return Params(body, weight=(32, K))


# A bias computed through ``rand``: no dynamic input, but not a fixed value to fold.
def random_in_bias_module():
    return Params(lambda p, x: F.linear(x, p.weight, p.bias + torch.rand(16) * 0.0),
                  weight=(16, K), bias=(16,))


def _rows():
    torch.manual_seed(0)
    return torch.randn(5, K)


def part_also_used(rules=DEFAULT_RULES):
    checked = check_lowering(part_also_used_elsewhere(), (_rows(),), rules=rules)
    expect_fold({(o.status, o.rule) for o in checked.fold.operands}, {("declined", "size")})
    # Not folded, but delegated with their weights as run-time inputs.
    assert all(o.runtime_weight for o in checked.fold.operands)
    assert checked.folded.gemms_outside == []


def overlapping_parts(rules=DEFAULT_RULES):
    checked = check_lowering(overlapping_parts_module(), (_rows(),), rules=rules)
    expect_fold({(o.status, o.rule) for o in checked.fold.operands}, {("declined", "size")})


def group_taken_by_none(rules=DEFAULT_RULES):
    torch.manual_seed(0)
    checked = check_lowering(bf16_packed(), (torch.randn(5, K).bfloat16(),), tol=0.25,
                             rules=rules)
    assert len(checked.stock.gemms_outside) == 2, "XNNPACK was expected to decline bf16"
    expect_fold({(o.status, o.rule) for o in checked.fold.operands}, {("declined", "delegated")})
    # What stays on portable stays exactly as stock leaves it.
    expect(checked.folded.pte == checked.stock.pte, UnexpectedFold,
           f".pte differs from stock's: {checked.folded.pte_bytes:,} vs "
           f"{checked.stock.pte_bytes:,} bytes")


def part_declined_by_another_rule(rules=DEFAULT_RULES):
    checked = check_lowering(random_in_one_part(), (_rows(),), rules=rules)
    expect_fold({o.gemm: o.rule for o in checked.fold.operands},
                {"linear": "exact", "linear_1": "whole-group"}, "rules")


def random_in_bias(rules=DEFAULT_RULES):
    checked = check_lowering(random_in_bias_module(), (_rows(),), rules=rules)
    bias = next(o for o in checked.fold.operands if o.role == "bias")
    expect_fold((bias.status, bias.rule), ("declined", "exact"), "bias")


NEGATIVE_CASES = {
    "part used by a non-GEMM op": part_also_used,
    "parts larger than the param": overlapping_parts,
    "group XNNPACK takes none of": group_taken_by_none,
    "part declined by another rule": part_declined_by_another_rule,
    "random op in the cone": random_in_bias,
}


@pytest.mark.parametrize("name", NEGATIVE_CASES)
def test_negative_case(name):
    NEGATIVE_CASES[name]()


# What each negative case fails with once its rule is gone. A fold that stores a param twice
# is caught by the no-growth guard behind the rules (pipeline.check_no_growth), which sends the
# whole program back to stock (a Fallback): the rule is what keeps the rest of the fold.
STORED_TWICE = (Fallback, "more than the input")


@pytest.mark.parametrize("rule,name,failure", [
    (Rule.SIZE, "part used by a non-GEMM op", STORED_TWICE),
    (Rule.SIZE, "parts larger than the param", STORED_TWICE),
    (Rule.WHOLE_GROUP, "part declined by another rule", STORED_TWICE),
    # the bf16 parts are folded though XNNPACK takes neither (for nothing: both on portable)
    (Rule.DELEGATED, "group XNNPACK takes none of", (UnexpectedFold, "folded")),
    # the bias through rand is folded (a value of one draw, not the program's)
    (Rule.EXACT, "random op in the cone", (UnexpectedFold, "folded"))])
def test_rule_is_load_bearing(rule, name, failure):
    """With ``rule`` removed, its negative case must fail, with the failure the rule prevents."""
    failure_type, says = failure
    with pytest.raises(AssertionError) as raised:
        NEGATIVE_CASES[name](DEFAULT_RULES.without(rule))
    assert type(raised.value) is failure_type, f"{type(raised.value).__name__}: {raised.value}"
    # what happened, not the expected value the message also shows
    assert says in repr(getattr(raised.value, "actual", str(raised.value))), raised.value


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


def seven_dim_bias():
    """A packed bias computed through a 7-dim view: more dims than XNNPACK supports (6)."""
    def body(p, x):
        bias = (p.bias.view(1, 1, 1, 1, 1, 2, K) * 2.0).reshape(-1)
        (w1, w2), (b1, b2) = p.weight.chunk(2), bias.chunk(2)
        return F.linear(x, w1, b1), F.linear(x, w2, b2)
    return Params(body, weight=(2 * K, K), bias=(2 * K,))


def test_bias_computed_with_seven_dims():
    """Stock puts the 7-dim view in its delegate, which XNNPACK rejects at init (measured:
    "Failed to define tensor 0 ... xnn_status_unsupported_parameter"); folded, it runs."""
    checked = check_lowering(seven_dim_bias(), (_rows(),), stock_pte=StockPte.FAILS_AT_INIT)
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
