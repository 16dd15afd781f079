"""Layers beyond the named cases: parametrizations, more attention and conv variants, size traps.

Each goes through the shared helper (lowered stock and xnnfold, both .pte run on the runtime and
compared with eager, bytes and counts against stock).
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrizations

from conftest import (NOT_CORE_ATEN, Params, assert_all_delegated, check_lowering,
                      check_where_stock_fails_to_lower)

E = 16


def test_top_level_layer_whose_forward_takes_input():
    # nn.Linear.forward(self, input): fx renames a node called "input" when it copies a graph;
    # the fold must still find the user input (it fell back to stock before).
    torch.manual_seed(0)
    model = parametrizations.weight_norm(nn.Linear(E, 8)).eval()
    checked = check_lowering(model, (torch.randn(3, E),))
    assert checked.statuses() == {"folded", "plain"}
    assert_all_delegated(checked)
    assert len(checked.stock.gemms_outside) == 1


@pytest.mark.parametrize("orthogonal_map", ["matrix_exp", "cayley", "householder"])
def test_orthogonal_parametrization_lowers_where_stock_cannot(orthogonal_map):
    # Its weight is computed with linalg ops outside the Core ATen opset: stock's lowering
    # raises; folded, the linear takes a constant. The matmul inside it (static times static)
    # is a step of the computation, not a GEMM to fold for.
    torch.manual_seed(0)
    model = parametrizations.orthogonal(nn.Linear(8, 8), orthogonal_map=orthogonal_map).eval()
    checked = check_where_stock_fails_to_lower(model, (torch.randn(3, 8),), tol=1e-5,
                                               stock_error=NOT_CORE_ATEN)
    assert [(o.gemm, o.status) for o in checked.fold.operands] == [("linear", "folded"),
                                                                  ("linear", "plain")]
    assert_all_delegated(checked)


class SpectralNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.utils.spectral_norm(nn.Linear(E, 8))

    def forward(self, x):
        return self.linear(x)


def test_spectral_norm_is_folded_where_stock_computes_it_wrong():
    # Stock delegates the whole sigma computation (its delegate holds dot decomposed into mul
    # and sum.dim_IntList with dims=[], a full reduction in ATen), and its .pte is off by 7.0
    # at these shapes. Folded, the linear takes the exact weight.
    torch.manual_seed(0)
    checked = check_lowering(SpectralNorm().eval(), (torch.randn(3, E),))
    assert checked.stock_diff > 1.0
    assert checked.statuses() == {"folded", "plain"}
    assert_all_delegated(checked)


class WeightNormConvTranspose(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = parametrizations.weight_norm(nn.ConvTranspose2d(4, 3, 3, stride=2))

    def forward(self, x):
        return self.conv(x)


class LoraDepthwiseConv(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 3, groups=8, padding=1)
        self.lora_a = nn.Parameter(torch.randn(2, 9) * 0.1)
        self.lora_b = nn.Parameter(torch.randn(8, 2) * 0.1)

    def forward(self, x):
        weight = self.conv.weight + (self.lora_b @ self.lora_a).view(8, 1, 3, 3) * 0.5
        return F.conv2d(x, weight, self.conv.bias, padding=1, groups=8)


class GroupedQueryProjection(nn.Module):
    """One packed q/k/v linear with k and v narrower than q, split by size."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(E, E + 8 + 8)

    def forward(self, x):
        weights, biases = self.qkv.weight.split([E, 8, 8]), self.qkv.bias.split([E, 8, 8])
        return tuple(F.linear(x, w, b) for w, b in zip(weights, biases))


FOLDED_CASES = {
    "weight_norm conv_transpose2d": (WeightNormConvTranspose, (1, 4, 5, 5)),
    "LoRA depthwise conv2d": (LoraDepthwiseConv, (1, 8, 6, 6)),
    "grouped-query q/k/v split": (GroupedQueryProjection, (3, E)),
}


@pytest.mark.parametrize("name", FOLDED_CASES)
def test_computed_weight_is_folded_and_delegated(name):
    torch.manual_seed(0)
    make, shape = FOLDED_CASES[name]
    checked = check_lowering(make().eval(), (torch.randn(shape),), tol=1e-5)
    assert "folded" in checked.statuses() and "declined" not in checked.statuses()
    assert len(checked.stock.gemms_outside) >= 1
    assert_all_delegated(checked)


def test_attention_with_bias_kv_and_zero_attn():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(E, 2, add_bias_kv=True, add_zero_attn=True)
    nn.init.normal_(mha.in_proj_bias)

    class Cross(nn.Module):
        def __init__(self):
            super().__init__()
            self.mha = mha

        def forward(self, query, memory):
            return self.mha(query, memory, memory, need_weights=False)[0]

    checked = check_lowering(Cross().eval(), (torch.randn(5, 1, E), torch.randn(7, 1, E)))
    assert len(checked.stock.gemms_outside) == 2
    assert_all_delegated(checked)


# A 4x64 param tiled into a 256x64 weight (folding it would store 64 times the param), and
# a 1x64 row expanded to 128 rows.
LARGER_THAN_PARAMS = {
    "repeat": lambda: Params(lambda p, x: F.linear(x, p.tile.repeat(64, 1)), tile=(4, 64)),
    "expand": lambda: Params(lambda p, x: F.linear(x, p.row.expand(128, 64)), row=(1, 64)),
}


@pytest.mark.parametrize("how", LARGER_THAN_PARAMS)
def test_weight_larger_than_its_params_is_declined(how):
    torch.manual_seed(0)
    checked = check_lowering(LARGER_THAN_PARAMS[how]().eval(), (torch.randn(2, 64),), tol=1e-4)
    assert [(o.status, o.rule, o.runtime_weight) for o in checked.fold.operands] == [
        ("declined", "size", True)]
    # Not folded: computed on every call as stock does, and handed to the delegate.
    assert checked.folded.gemms_outside == [] and checked.fold.constants == []


class LearnedMemoryAttention(nn.Module):
    """Cross-attention over a learned memory: the k/v projections have only static inputs."""

    def __init__(self):
        super().__init__()
        self.mha = nn.MultiheadAttention(E, 2)
        nn.init.normal_(self.mha.in_proj_bias)
        self.memory = nn.Parameter(torch.randn(7, 1, E))

    def forward(self, query):
        return self.mha(query, self.memory, self.memory, need_weights=False)[0]


class LearnedPositionProjection(nn.Module):
    """A weight-normed linear applied to a learned position table, added to the input."""

    def __init__(self):
        super().__init__()
        self.positions = nn.Parameter(torch.randn(5, E))
        self.project = parametrizations.weight_norm(nn.Linear(E, E))

    def forward(self, x):
        return x + self.project(self.positions)


@pytest.mark.parametrize("make,shape", [(LearnedMemoryAttention, (5, 1, E)),
                                        (LearnedPositionProjection, (5, E))],
                         ids=["learned memory", "position table"])
def test_gemm_with_only_static_inputs_is_still_a_gemm(make, shape):
    # Static GEMMs are skipped only inside another operand's computation (LoRA's B @ A); these
    # feed the rest of the model and must be folded and delegated like any other.
    torch.manual_seed(0)
    checked = check_lowering(make().eval(), (torch.randn(shape),))
    assert len(checked.stock.gemms_outside) >= 1
    assert "folded" in checked.statuses()
    assert_all_delegated(checked)
