"""fp32 cases that must end fully delegated: no GEMM and no split left outside delegates."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from xnnfold import models
from conftest import assert_all_delegated, assert_matches_ideal, check_lowering

N, K, ROWS = 8, 12, 5


def _gemm(kind, x, weight, bias):
    if kind == "linear":
        return F.linear(x, weight, bias)
    return torch.addmm(bias, x, weight.t())


class Packed(nn.Module):
    """Two GEMMs on parts of a packed weight and bias, made by ``how``."""

    def __init__(self, how: str, kinds=("linear", "linear"), packed=("weight", "bias")):
        super().__init__()
        self.how, self.kinds, self.packed = how, kinds, packed
        if how == "cat_chunk":
            self.w_a, self.w_b = nn.Parameter(torch.randn(N, K)), nn.Parameter(torch.randn(N, K))
            self.b_a, self.b_b = nn.Parameter(torch.randn(N)), nn.Parameter(torch.randn(N))
        else:
            self.weight = nn.Parameter(torch.randn(2 * N, K))
            self.bias = nn.Parameter(torch.randn(2 * N))
        self.plain_w = nn.ParameterList([nn.Parameter(torch.randn(N, K)) for _ in range(2)])
        self.plain_b = nn.ParameterList([nn.Parameter(torch.randn(N)) for _ in range(2)])

    def _parts(self, name):
        if self.how == "cat_chunk":
            return torch.cat([getattr(self, f"{name[0]}_a"), getattr(self, f"{name[0]}_b")]
                             ).chunk(2)
        packed = getattr(self, name)
        return packed.split(N) if self.how == "split" else packed.chunk(2)

    def forward(self, x):
        weights = self._parts("weight") if "weight" in self.packed else list(self.plain_w)
        biases = self._parts("bias") if "bias" in self.packed else list(self.plain_b)
        return tuple(_gemm(kind, x, w, b) for kind, w, b in zip(self.kinds, weights, biases))


@pytest.mark.parametrize("kind", ["linear", "addmm"])
@pytest.mark.parametrize("how", ["split", "chunk", "cat_chunk"])
def test_packed_weight_and_bias(how, kind):
    torch.manual_seed(0)
    checked = check_lowering(Packed(how, (kind, kind)), (torch.randn(ROWS, K),))
    # addmm(b, x, w.t()) is rewritten as linear(x, w, b): the part is folded untransposed.
    assert_all_delegated(checked, packed_shapes=[(2 * N, K), (2 * N,)],
                         part_shapes=[(N, K), (N,)])
    assert checked.statuses() == {"folded"}
    assert len(checked.stock.gemms_outside) == 2
    assert len(checked.fold.of("canonical")) == (2 if kind == "addmm" else 0)


@pytest.mark.parametrize("how,kind,packed", [("split", "linear", ("weight",)),
                                              ("chunk", "addmm", ("bias",))])
def test_packed_weight_or_bias_alone(how, kind, packed):
    torch.manual_seed(0)
    checked = check_lowering(Packed(how, (kind, kind), packed), (torch.randn(ROWS, K),))
    shape = (2 * N, K) if packed == ("weight",) else (2 * N,)
    assert_all_delegated(checked, packed_shapes=[shape])
    assert len(checked.stock.gemms_outside) == 2


def test_parts_feed_gemms_of_different_kinds():
    torch.manual_seed(0)
    checked = check_lowering(Packed("split", ("linear", "addmm")), (torch.randn(ROWS, K),))
    assert_all_delegated(checked, packed_shapes=[(2 * N, K), (2 * N,)],
                         part_shapes=[(N, K)])
    assert (K, N) not in checked.folded.constant_shapes()


class ThreeBiases(nn.Module):
    """Three biases concatenated, split again, each given to its own GEMM."""

    def __init__(self, kind, how):
        super().__init__()
        self.sizes = [4, 6, 8] if how == "split_with_sizes" else [6, 6, 6]
        self.kind, self.how = kind, how
        self.weights = nn.ParameterList([nn.Parameter(torch.randn(n, K)) for n in self.sizes])
        self.biases = nn.ParameterList([nn.Parameter(torch.randn(n)) for n in self.sizes])

    def forward(self, x):
        packed = torch.cat(list(self.biases))
        if self.how == "split_with_sizes":
            parts = packed.split_with_sizes(self.sizes)
        elif self.how == "split":
            parts = packed.split(self.sizes[0])
        else:
            parts = packed.chunk(3)
        return tuple(_gemm(self.kind, x, w, b) for w, b in zip(self.weights, parts))


@pytest.mark.parametrize("kind", ["linear", "addmm"])
@pytest.mark.parametrize("how", ["split", "split_with_sizes", "chunk"])
def test_three_biases_cat_then_split(kind, how):
    torch.manual_seed(0)
    checked = check_lowering(ThreeBiases(kind, how), (torch.randn(ROWS, K),))
    assert checked.folded.ops_outside == [], checked.folded.ops_outside
    assert checked.folded.delegate_calls == 1
    assert_all_delegated(checked, packed_shapes=[(18,)])


# --------------------------------------------------------------------------------------------
# nn.MultiheadAttention and the decoder layer, at SPEC's E=16 shapes.

IN_PROJ = (48, 16)


# The ideal (plain q/k/v linears in MHA's own body) bounds delegate calls and .pte bytes: the
# packed projections are split into one linear per part (xnnfold.steps.projections).


def test_cross_attention():
    case = models.attention_case("cross")
    checked = check_lowering(case.model, case.inputs, ideal=case.ideal)
    assert_all_delegated(checked, packed_shapes=[IN_PROJ, (48,), (32, 16), (32,)],
                         part_shapes=[(16, 16), (16,)])
    assert_matches_ideal(checked)
    assert len(checked.stock.gemms_outside) == 2


def test_cross_attention_dynamic_lengths():
    case = models.attention_case("cross", dynamic=True)
    others = [(torch.randn(1, 9, 16), torch.randn(1, 3, 16)),
              (torch.randn(1, 2, 16), torch.randn(1, 40, 16))]
    checked = check_lowering(case.model, case.inputs, dynamic_shapes=case.dynamic_shapes,
                             run_inputs=others, ideal=case.ideal)
    assert_all_delegated(checked, packed_shapes=[IN_PROJ, (48,)])
    assert_matches_ideal(checked)


def test_different_key_and_value():
    case = models.attention_case("kv")
    checked = check_lowering(case.model, case.inputs, ideal=case.ideal)
    assert_all_delegated(checked, packed_shapes=[IN_PROJ, (48,)],
                         part_shapes=[(16, 16), (16,)])
    assert_matches_ideal(checked)
    assert len(checked.stock.gemms_outside) == 3


def test_kdim_vdim():
    case = models.attention_case("kv", kdim=12, vdim=10)
    checked = check_lowering(case.model, case.inputs, ideal=case.ideal)
    assert_all_delegated(checked, packed_shapes=[(48,)], part_shapes=[(16,)])
    assert_matches_ideal(checked)
    assert len(checked.stock.gemms_outside) == 3


@pytest.mark.parametrize("norm_first", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_decoder_layer(norm_first):
    case = models.decoder_case(norm_first=norm_first)
    checked = check_lowering(case.model, case.inputs, ideal=case.ideal)
    assert_all_delegated(checked, packed_shapes=[IN_PROJ, (48,)])
    assert_matches_ideal(checked)
    assert len(checked.stock.gemms_outside) == 2


# --------------------------------------------------------------------------------------------
# Other computed params.


def test_weight_norm_conv1d():
    case = models.weight_norm_case()
    checked = check_lowering(case.model, case.inputs, ideal=case.ideal)
    assert_all_delegated(checked, part_shapes=[(8, 8, 3)])
    assert checked.status("conv1d", "weight") == "folded"
    assert checked.stock.gemms_outside, "stock was expected to leave the conv on portable"


def test_lora_merged_linear():
    case = models.lora_case()
    checked = check_lowering(case.model, case.inputs, tol=1e-4)
    assert_all_delegated(checked, part_shapes=[(16, 16)])
    # W, A and B are freed: the delegate holds one merged 16x16 weight and the bias.
    assert checked.folded.constant_shapes() == [(16,), (16, 16)]
