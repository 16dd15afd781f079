"""Idioms of model code nobody on the project wrote (issue 13): same-dtype casts, transposed
weights, tied output heads, weights computed from inputs, groups XNNPACK takes only in part.

Each case goes through the shared helper (stock and xnnfold lowered, both .pte run on the
runtime and compared with eager, tensor bytes and GEMMs outside never above stock's), and each
guard it relies on is removed once to check that the case then fails.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from xnnfold import analysis, canonical, fold, pipeline, plan, runtime_weight

from conftest import assert_all_delegated, check_lowering

E = 16


class SameDtypeCasts(nn.Module):
    """``F.linear(x, w.to(x.dtype), b.to(x.dtype))``: a mixed-precision idiom, a no-op in fp32."""

    def __init__(self):
        super().__init__()
        self.first, self.second = nn.Linear(E, E), nn.Linear(E, E)

    def forward(self, x):
        for layer in (self.first, self.second):
            x = F.linear(x, layer.weight.to(x.dtype), layer.bias.type_as(x))
        return x


def _same_dtype_casts():
    checked = check_lowering(SameDtypeCasts().eval(), (torch.randn(3, E),))
    assert checked.statuses() == {"plain"}
    assert all("removed by decomposition" in o.reason for o in checked.fold.operands)
    assert checked.folded.pte == checked.stock.pte
    return checked


def test_same_dtype_casts_are_left_for_stock():
    _same_dtype_casts()


def test_same_dtype_casts_guard_is_load_bearing(monkeypatch):
    monkeypatch.setattr(analysis, "removed_by_decomposition", lambda node: None)
    with pytest.raises(AssertionError, match="plain"):
        _same_dtype_casts()


class CastThenScaled(nn.Module):
    """``w.to(x.dtype) * s``: the cast's ``_assert_tensor_metadata`` reads the *param*."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(E, E))

    def forward(self, x):
        return F.linear(x, self.weight.to(x.dtype) * 0.5)


def _cast_then_scaled():
    checked = check_lowering(CastThenScaled().eval(), (torch.randn(3, E),))
    assert checked.fold.freed_params == ["weight"], checked.fold.freed_params
    assert_all_delegated(checked)
    return checked


def test_metadata_assertion_on_a_param_goes_with_the_fold():
    _cast_then_scaled()


def test_metadata_assertion_fix_is_load_bearing(monkeypatch):
    # Without it the param stays for its assertion: the no-growth guard sends us back to stock.
    monkeypatch.setattr(fold, "is_metadata_assertion", lambda node: False)
    with pytest.raises(AssertionError, match="more than the input"):
        _cast_then_scaled()


class RepeatedWeight(nn.Module):
    def __init__(self):
        super().__init__()
        self.tile = nn.Parameter(torch.randn(2, E))

    def forward(self, x):
        return F.linear(x, self.tile.repeat(8, 1))


def test_no_growth_guard_catches_what_the_rules_miss(monkeypatch, xnnfold_log):
    """Without the size rule the fold would store the tiled weight; the guard declines it."""
    ep = torch.export.export(RepeatedWeight(), (torch.randn(3, E),))
    monkeypatch.setattr(plan, "GROUP_RULES", [])
    result = pipeline.run(ep, probe=None)
    assert result.program is ep and "more than the input" in result.fallback
    assert len(xnnfold_log.records) == 1
    monkeypatch.setattr(pipeline, "check_no_growth", lambda ep, result: None)
    grown = pipeline.run(ep, probe=None)
    assert pipeline.stored_bytes(grown.program) > pipeline.stored_bytes(ep)


# --------------------------------------------------------------------------------------------
# Transposed weights


class LinearAndTransposedAddmm(nn.Module):
    """The chunks of one packed weight and bias feed ``linear`` and ``addmm(b, x, w.t())``."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(2 * E, E))
        self.bias = nn.Parameter(torch.randn(2 * E))

    def forward(self, x, x2):
        (w1, w2), (b1, b2) = self.weight.chunk(2), self.bias.chunk(2)
        return (F.linear(x, w1, b1) + F.linear(x, w2, b2),
                torch.addmm(b1, x2, w1.t()) + torch.addmm(b2, x2, w2.t()))


def _linear_and_addmm():
    torch.manual_seed(0)
    checked = check_lowering(LinearAndTransposedAddmm().eval(),
                             (torch.randn(3, E), torch.randn(3, E)))
    assert_all_delegated(checked, packed_shapes=[(2 * E, E), (2 * E,)], part_shapes=[(E, E)])
    assert len(checked.stock.gemms_outside) == 4
    assert [r.was for r in checked.fold.canonical] == ["aten.addmm.default"] * 2
    return checked


def test_one_constant_serves_linear_and_transposed_addmm():
    _linear_and_addmm()


def test_canonical_gemms_are_load_bearing(monkeypatch):
    # Kept as addmm, each part would be folded twice (W and W.t()): the size rule declines.
    monkeypatch.setattr(canonical, "linear_args", lambda node: None)
    with pytest.raises(AssertionError, match="aten.addmm"):
        _linear_and_addmm()


class TransposedForms(nn.Module):
    def __init__(self):
        super().__init__()
        self.weights = nn.ParameterList([nn.Parameter(torch.randn(8, E)) for _ in range(4)])
        self.bias = nn.Parameter(torch.randn(8))

    def forward(self, x, x3):
        a, b, c, d = self.weights
        return (torch.mm(x, a.t()), x3 @ b.T, torch.matmul(x, c.transpose(0, 1)),
                torch.addmm(self.bias, x, d.t()), torch.addmm(self.bias, x, d.t(), beta=0.5))


def test_transposed_forms_become_linear_except_a_scaled_addmm():
    torch.manual_seed(0)
    checked = check_lowering(TransposedForms().eval(), (torch.randn(3, E), torch.randn(2, 3, E)))
    assert len(checked.stock.gemms_outside) == 5
    # addmm with beta=0.5 is not a linear: it stays as stock leaves it.
    assert checked.folded.gemms_outside == ["aten.addmm.default"], checked.folded.ops_outside
    assert [r.gemm for r in checked.fold.canonical] == ["mm", "matmul", "matmul_1", "addmm"]


# --------------------------------------------------------------------------------------------
# Run-time weights


class TiedHead(nn.Module):
    """A token lookup and an output head that share one table, as a speech decoder writes it:
    ``x @ torch.transpose(embedding.weight.to(x.dtype), 0, 1)``."""

    def __init__(self, vocab=300):
        super().__init__()
        self.embedding = nn.Embedding(vocab, E)
        self.mix = nn.Linear(E, E)

    def forward(self, tokens):
        x = torch.relu(self.mix(self.embedding(tokens)))
        return x @ torch.transpose(self.embedding.weight.to(x.dtype), 0, 1)


def _tied_head():
    torch.manual_seed(0)
    checked = check_lowering(TiedHead().eval(), (torch.tensor([[1, 7, 42, 299]]),))
    assert checked.stock.gemms_outside, "stock was expected to leave the head on portable"
    assert_all_delegated(checked)
    (head,) = [o for o in checked.fold.operands if o.gemm == "matmul"]
    assert head.runtime_weight and "also read by embedding" in head.reason
    return checked


def test_tied_head_is_delegated_with_a_runtime_weight():
    _tied_head()


def test_runtime_weight_is_load_bearing(monkeypatch):
    # As a constant the table would be stored twice: in the delegate and for the lookup.
    monkeypatch.setattr(runtime_weight, "_needs_runtime_weight", lambda *args: None)
    with pytest.raises(AssertionError, match=r"^\(\d+, \d+\)"):
        _tied_head()


class WeightFromInput(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(8, 1))

    def forward(self, x, w):
        return F.linear(x, w * self.scale)


def test_weight_computed_from_an_input_is_delegated_with_a_runtime_weight():
    torch.manual_seed(0)
    checked = check_lowering(WeightFromInput().eval(), (torch.randn(3, E), torch.randn(8, E)))
    assert len(checked.stock.gemms_outside) == 1
    assert_all_delegated(checked)
    assert [(o.status, o.rule, o.runtime_weight) for o in checked.fold.operands] == [
        ("declined", "static", True)]


# --------------------------------------------------------------------------------------------
# A group of which XNNPACK takes some GEMMs


class Fp32AndBf16Parts(nn.Module):
    """One part of a split weight goes to an fp32 linear, the other, cast to bf16 (half the
    bytes), to a linear XNNPACK declines."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(2 * E, E))

    def forward(self, x, x16):
        w1, w2 = self.weight.split(E)
        return F.linear(x, w1), F.linear(x16, w2.to(torch.bfloat16))


def _partly_taken_group():
    torch.manual_seed(0)
    x = torch.randn(5, E)
    checked = check_lowering(Fp32AndBf16Parts().eval(), (x, x.bfloat16()), tol=0.25)
    rows = {o.gemm: (o.status, o.delegated) for o in checked.fold.operands}
    assert rows == {"linear": ("folded", True), "linear_1": ("folded", False)}, rows
    assert checked.folded.splits_outside == []
    assert checked.folded.gemms_outside == ["aten.mm.default"]     # the bf16 one, on portable
    return checked


def test_group_taken_in_part_is_folded_whole():
    _partly_taken_group()


def test_group_taken_in_part_is_load_bearing(monkeypatch):
    # The old rule: any member XNNPACK declines takes its whole group down.
    monkeypatch.setattr(plan, "rule_delegated", lambda group: None if all(
        m.delegated for m in group.members) else plan.Decline("delegated", "x", "old rule"))
    with pytest.raises(AssertionError, match="declined"):
        _partly_taken_group()
