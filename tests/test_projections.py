"""Packed projections (issue 7): MHA's in-projection split into one linear per part.

Every test lowers with stock and xnnfold, runs both .pte files and compares with eager (the
shared helper); the attention cases are also bounded by the ideal (plain q/k/v linears in
MHA's own body): no more delegate calls and .pte bytes, no layout op left on portable.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import xnnfold
from conftest import (LAYOUT_OPS, GemmsOutside, assert_all_delegated, assert_matches_ideal,
                      check_lowering)
from xnnfold.steps import projections
from xnnfold.steps.fold import rules
from xnnfold import models
E = 16


def _split_sites(checked) -> list:
    return projections.split_in(checked.fold)


def test_self_attention_matches_ideal():
    case = models.attention_case("self")
    checked = check_lowering(case.model, case.inputs, ideal=case.ideal)
    assert LAYOUT_OPS & set(checked.stock.ops_outside), "stock was expected to cut the chain"
    assert_all_delegated(checked, packed_shapes=[(3 * E, E), (3 * E,)],
                         part_shapes=[(E, E), (E,)])
    assert_matches_ideal(checked)
    (site,) = _split_sites(checked)
    assert sorted(site.part_linears) == [0, 1, 2]
    assert {checked.status(part, role) for part in site.part_linears.values()
            for role in ("weight", "bias")} == {"folded"}
    # The split is a rewrite of MHA's layout, not a change of math: outputs as close as stock's.
    assert checked.folded_diff <= 1e-5


class Transformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.t = nn.Transformer(E, 2, num_encoder_layers=1, num_decoder_layers=1,
                                dim_feedforward=24, dropout=0.0, batch_first=True)
        for module in self.t.modules():
            if isinstance(module, nn.MultiheadAttention):
                nn.init.normal_(module.in_proj_bias)

    def forward(self, src, tgt):
        return self.t(src, tgt)


def test_transformer_encoder_and_decoder():
    torch.manual_seed(0)
    checked = check_lowering(Transformer().eval(),
                             (torch.randn(1, 7, E), torch.randn(1, 5, E)))
    assert_all_delegated(checked, packed_shapes=[(3 * E, E), (3 * E,), (2 * E, E)])
    # encoder self-attention, decoder self-attention (q/k/v), decoder cross-attention (k/v)
    assert sorted(len(s.part_linears) for s in _split_sites(checked)) == [2, 3, 3]
    assert not LAYOUT_OPS & set(checked.folded.ops_outside), checked.folded.ops_outside
    assert checked.folded.delegate_calls < checked.stock.delegate_calls
    assert checked.folded.pte_bytes < checked.stock.pte_bytes


class SelfAttention(nn.Module):
    def __init__(self, bias: bool):
        super().__init__()
        self.mha = nn.MultiheadAttention(E, 2, bias=bias, batch_first=True)
        if bias:
            nn.init.normal_(self.mha.in_proj_bias)

    def forward(self, x):
        return self.mha(x, x, x, need_weights=False)[0]


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("shape", [(1, 5, E), (5, E)], ids=["batched", "unbatched"])
def test_self_attention_variants(bias, shape):
    """Unbatched, MHA unsqueezes q, k and v separately: the packed weight is chunked (a fold)
    instead of projected whole (a split); either way nothing is left on portable."""
    torch.manual_seed(0)
    checked = check_lowering(SelfAttention(bias).eval(), (torch.randn(*shape),))
    assert_all_delegated(checked, packed_shapes=[(3 * E, E)], part_shapes=[(E, E)])
    assert len(_split_sites(checked)) == (1 if len(shape) == 3 else 0)
    # (unbatched, MHA's own unsqueeze of the input and squeeze of the output stay outside)
    assert "aten.select_copy.int" not in checked.folded.ops_outside, checked.folded.ops_outside


class PackedLayout(nn.Module):
    """MHA's in-projection and layout chain, written out, with options to break the pattern."""

    def __init__(self, dtype=torch.float32, use_whole=False):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(3 * E, E, dtype=dtype))
        self.bias = nn.Parameter(torch.randn(3 * E, dtype=dtype))
        self.use_whole = use_whole

    def forward(self, x):
        projected = F.linear(x, self.weight, self.bias)
        parts = projected.unflatten(-1, (3, E)).unsqueeze(0).transpose(0, -2).squeeze(-2)
        parts = parts.contiguous()
        out = parts[0] * parts[1] + parts[2]
        return (out, projected.sum(-1)) if self.use_whole else out


def test_projection_also_used_whole_is_not_split():
    torch.manual_seed(0)
    checked = check_lowering(PackedLayout(use_whole=True).eval(), (torch.randn(5, E),))
    assert projections.found_in(checked.fold) == []
    assert checked.folded.pte == checked.stock.pte


# (products of two projections: values up to ~100, so an absolute tolerance of 1e-4)
@pytest.mark.parametrize("shape", [(E,), (5, E), (2, 5, E)], ids=["1d", "2d", "3d"])
def test_written_out_layout_is_split(shape):
    torch.manual_seed(0)
    checked = check_lowering(PackedLayout().eval(), (torch.randn(*shape),), tol=1e-4)
    assert len(_split_sites(checked)) == 1
    assert not LAYOUT_OPS & set(checked.folded.ops_outside), checked.folded.ops_outside
    assert checked.folded.delegate_calls <= checked.stock.delegate_calls


@pytest.fixture(scope="module")
def bf16_layout():
    torch.manual_seed(0)
    model = PackedLayout(torch.bfloat16).eval()
    return model, (torch.randn(5, E, dtype=torch.bfloat16),)


def _check_bf16(bf16_layout):
    model, inputs = bf16_layout
    return check_lowering(model, inputs, tol=0.5)


def test_split_undone_when_parts_are_not_delegated(bf16_layout):
    """XNNPACK declines bf16 linears: the split would only add row blocks on portable."""
    checked = _check_bf16(bf16_layout)
    (site,) = projections.found_in(checked.fold)
    assert site.kept_because is not None and "delegated" in site.kept_because.reason
    assert site.part_linears == {}
    assert checked.folded.pte == checked.stock.pte
    text = xnnfold.format_explanation(checked.fold.operands, records=checked.fold.records)
    assert "kept as is" in text


def test_undo_is_load_bearing(bf16_layout, monkeypatch):
    monkeypatch.setattr(rules, "split_kept", lambda site, rows: None)
    with pytest.raises(AssertionError) as raised:
        checked = _check_bf16(bf16_layout)
        assert checked.folded.pte == checked.stock.pte
    assert type(raised.value) is GemmsOutside, f"{type(raised.value).__name__}: {raised.value}"


def test_explain_names_the_split():
    case = models.attention_case("cross")
    ep = torch.export.export(case.model, case.inputs)
    text = xnnfold.format_explanation(xnnfold.explain(ep))
    assert "packed projection of 2 parts split into" in text, text
    assert "linear_1_part0" in text and "linear_1_part1" in text, text
