"""The attention step, lowered: no safe-softmax / expand / scale glue left on portable, outputs
equal to eager within stock's tolerance, fully masked rows included (eager gives zeros).

Each case goes through the shared helper (stock and xnnfold lowered, both .pte run and compared
with eager). The glue check reads the helper's xnnfold lowering: no op outside a delegate may
produce a tensor as large as the attention's scores ``[B, H, L, S]``; what the masks leave on
portable is computed on the mask, not on the scores.
"""

import pytest
import torch
from torch import nn

from conftest import LAYOUT_OPS, Sdpa, check_lowering, check_lowering_if_modified
from test_quantized import activation_bound, quantize
from xnnfold import models
E, HEADS, B, L, S = 16, 2, 2, 5, 7
SCORES = B * HEADS * L * S
# The ops stock's decomposition of SDPA leaves on portable (safe softmax, broadcast, scale).
GLUE = frozenset({"aten.eq.Scalar", "aten.where.self", "aten.any.dim", "aten.logical_not.default",
                  "aten.full_like.default", "aten.expand_copy.default", "aten.mul.Scalar"})


def assert_no_glue(checked, proven):
    """The attentions were rewritten as ``proven`` says and nothing the size of the scores is
    left outside delegates; MHA's in-projection layout chain (``LAYOUT_OPS``: self-attention's
    packed projection, which nothing splits) is stock's and not attention glue."""
    assert [a.proven for a in checked.fold.of("attention")] == proven, checked.fold.of("attention")
    big = {op: n for op, n in checked.folded.largest_outside.items()
           if n >= SCORES and op not in LAYOUT_OPS}
    assert big == {}, big
    # The same measure finds the glue in stock's lowering, at the scores' size.
    stock_big = {op for op, n in checked.stock.largest_outside.items() if n >= SCORES}
    assert GLUE & stock_big, checked.stock.largest_outside
    assert checked.folded.delegate_calls < checked.stock.delegate_calls


class Mha(nn.Module):
    """nn.MultiheadAttention, self or cross, with a random in_proj_bias."""

    def __init__(self, need_weights=False, **kwargs):
        super().__init__()
        self.mha = nn.MultiheadAttention(E, HEADS, batch_first=True)
        nn.init.normal_(self.mha.in_proj_bias)
        self.need_weights, self.kwargs = need_weights, kwargs

    def forward(self, x, memory=None, key_padding_mask=None, attn_mask=None):
        memory = x if memory is None else memory
        out = self.mha(x, memory, memory, need_weights=self.need_weights,
                       key_padding_mask=key_padding_mask, attn_mask=attn_mask)
        return out if self.need_weights else out[0]


def _padding():
    padding = torch.zeros(B, S, dtype=torch.bool)
    padding[0, 4:] = True
    padding[1] = True                      # batch 1: every key padded, eager gives zeros
    return padding


def _float_mask():
    mask = torch.randn(L, S)
    mask[2] = float("-inf")                # row 2 blocked entirely
    mask[:, 5:] = float("-inf")
    return mask


def _bool_mask():
    mask = torch.rand(B, 1, L, S) > 0.4
    mask[0, 0, 1] = False                  # row 1 of batch 0 blocked entirely
    return mask


def _heads(n):
    return torch.randn(B, HEADS, n, E // HEADS)


CASES = {
    "mha-self": (lambda: Mha(), lambda: (torch.randn(B, L, E),), ["no mask"]),
    "mha-cross-key-padding": (lambda: Mha(), lambda: (torch.randn(B, L, E), torch.randn(B, S, E),
                                                      _padding()),
                              ["mask: fully-masked rows handled by keep factor"]),
    "mha-cross-float-mask": (lambda: Mha(), lambda: (torch.randn(B, L, E), torch.randn(B, S, E),
                                                     None, _float_mask()),
                             ["mask: fully-masked rows handled by keep factor"]),
    "sdpa-bool-mask": (lambda: Sdpa(), lambda: (_heads(L), _heads(S), _heads(S), _bool_mask()),
                       ["mask: fully-masked rows handled by keep factor"]),
    "sdpa-causal": (lambda: Sdpa(is_causal=True), lambda: (_heads(L), _heads(S), _heads(S)),
                    ["causal, no empty row"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_attention_glue_leaves_portable(case):
    torch.manual_seed(0)
    make, make_inputs, proven = CASES[case]
    model, inputs = make().eval(), make_inputs()
    checked = check_lowering(model, inputs)
    assert_no_glue(checked, proven)
    with torch.no_grad():
        expected = model(*inputs)
    if case == "mha-cross-key-padding":
        assert (expected[1] == 0).all()     # the fully masked batch is in the comparison


class MaskBufferSdpa(nn.Module):
    """SDPA with a bool mask buffer sliced to [L, S] per call, as executorch's llama example
    holds its causal mask. ``mask`` is stored byte for byte."""

    def __init__(self, mask):
        super().__init__()
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, q, k, v):
        mask = self.mask[:q.shape[-2], :k.shape[-2]]
        return nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def test_bool_mask_bytes_other_than_0_and_1_are_true():
    # executorch's llama example builds its model on the meta device and materializes it with
    # ``to_empty``: its causal-mask buffer holds whatever the heap held, bool bytes like 0x5A.
    # Eager and stock's ``where`` take any non-zero byte as True; the runtime's logical ops and
    # casts take its bits as they are (the rewrite that ran them on the raw mask gave all-NaN
    # outputs in executorch's own llama test, depending on the tests run before it).
    torch.manual_seed(0)
    raw = torch.randint(2, 256, (L + 1, S + 1), dtype=torch.uint8)
    raw[:, 5:] = 0
    raw[2] = 0                             # row 2 blocked entirely: eager gives zeros there
    model = MaskBufferSdpa(raw.view(torch.bool)).eval()
    inputs = (_heads(L), _heads(S), _heads(S))
    ep = torch.export.export(model, inputs)
    assert ep.constants["mask"].view(torch.uint8).max() > 1     # the bytes reach the program
    checked = check_lowering(model, inputs, ep=ep, reference=MaskBufferSdpa(raw != 0).eval())
    assert_no_glue(checked, ["mask: fully-masked rows handled by keep factor"])


class EagerAttention(nn.Module):
    """Attention as transformers' eager path writes it: 4-D matmuls around a plain softmax."""

    def forward(self, q, k, v, mask):
        weights = torch.softmax(torch.matmul(q, k.transpose(2, 3)) * 0.3 + mask, dim=-1)
        return torch.matmul(weights, v)


def test_eager_attention_matmuls_leave_no_expand():
    torch.manual_seed(0)
    model, inputs = EagerAttention(), (_heads(L), _heads(S), _heads(S), torch.randn(B, 1, L, S))
    checked = check_lowering(model, inputs)
    assert [a.proven for a in checked.fold.of("attention")] == ["same batch dims, no expand"] * 2
    assert "aten.expand_copy.default" in checked.stock.ops_outside
    assert checked.folded.ops_outside == [] and checked.folded.delegate_calls == 1


def test_need_weights_does_not_call_sdpa_and_leaves_no_glue():
    # need_weights=True computes the averaged weights with bmm + softmax itself (no SDPA);
    # only the head average (mean over dim 1, which XNNPACK's mean.dim does not take) stays.
    torch.manual_seed(0)
    checked = check_lowering(Mha(need_weights=True).eval(),
                             (torch.randn(B, L, E), torch.randn(B, S, E)))
    assert checked.fold.of("attention") == []
    assert not GLUE & set(checked.folded.ops_outside), checked.folded.ops_outside
    assert checked.folded.ops_outside == ["aten.mean.dim"], checked.folded.ops_outside


@pytest.mark.parametrize("layer", ["encoder", "decoder"])
def test_transformer_layers(layer):
    torch.manual_seed(0)
    if layer == "encoder":
        model = nn.TransformerEncoderLayer(E, HEADS, dim_feedforward=32, batch_first=True)
        inputs, proven = (torch.randn(B, L, E),), ["no mask"]
    else:
        model = nn.TransformerDecoderLayer(E, HEADS, dim_feedforward=32, batch_first=True)
        inputs, proven = (torch.randn(B, L, E), torch.randn(B, S, E)), ["no mask", "no mask"]
    checked = check_lowering(model.eval(), inputs)
    assert_no_glue(checked, proven)


@pytest.mark.parametrize("bounded", [True, False], ids=["Dim-2-32", "Dim.DYNAMIC"])
def test_dynamic_length(bounded):
    # Each reshape has one dynamic dim, written -1, which XNNPACK's reshape infers. Unbounded
    # (Dim.DYNAMIC: upper bound torch's int_oo), the probe's export must not take the bound
    # for a number (it did: an internal failure, so a fallback to stock).
    torch.manual_seed(0)
    length = torch.export.Dim("length", min=2, max=32) if bounded else torch.export.Dim.DYNAMIC
    model, inputs = Mha().eval(), (torch.randn(B, L, E),)
    ep = torch.export.export(model, inputs, dynamic_shapes={"x": {1: length}})
    # Unbounded, ExecuTorch plans memory for the example's size (stock's .pte too): the second
    # run is shorter.
    second = 9 if bounded else 3
    checked = check_lowering(model, inputs, ep=ep, run_inputs=[(torch.randn(B, second, E),)])
    assert [a.proven for a in checked.fold.of("attention")] == ["no mask"]
    # MHA's own views to [L, B * heads, head_dim] stay outside, with a symbolic shape, as in
    # stock; the glue does not.
    assert not GLUE & set(checked.folded.ops_outside), checked.folded.ops_outside
    assert GLUE & set(checked.stock.ops_outside), checked.stock.ops_outside
    assert checked.folded.delegate_calls < checked.stock.delegate_calls


@pytest.mark.parametrize("dynamic", [True, False], ids=["dynamic-int8", "static-int8"])
def test_quantized_attention(dynamic):
    # PT2E: the q/dq pairs sit around the linears; the attention between them reads fp32
    # activations (static: dequantized, through MHA's layout chain) and is rewritten like an
    # fp32 one.
    torch.manual_seed(0)
    model, inputs = Mha().eval(), (torch.randn(B, L, E),)
    converted = quantize(model, inputs, dynamic=dynamic)
    tol = 4 * activation_bound(inputs, [model.mha.in_proj_weight, model.mha.out_proj.weight]) \
        if dynamic else 1e-5
    checked = check_lowering(converted, inputs, tol=tol)
    static = "; reads dequantized int8: the attention in fp32, as the converted module"
    assert_no_glue(checked, ["no mask" + ("" if dynamic else static)])


def test_without_the_step_the_glue_comes_back():
    # The negative test: the same lowering with the step turned off keeps stock's glue.
    torch.manual_seed(0)
    checked = check_lowering_if_modified(Mha().eval(), (torch.randn(B, L, E),),
                                         partitioner_kwargs={"attention": False})
    assert checked.fold.of("attention") == []
    assert {"aten.eq.Scalar", "aten.where.self", "aten.mul.Scalar"} <= \
        set(checked.folded.ops_outside), checked.folded.ops_outside


def test_a_view_that_relies_on_sdpa_output_layout_lowers():
    # Heads laid out as MHA lays them out, then ``.permute(2, 0, 1, 3).contiguous().view()``
    # (the ideal rewrite's own body, and common hand-written attention): traced on SDPA's
    # output strides, where the contiguous is a no-op. Before the users were restrided, the
    # rewrite's contiguous output made run_decompositions raise ("Cannot view a tensor ...")
    # inside to_edge_transform_and_lower, where stock lowers.
    case = models.attention_case("self")
    checked = check_lowering(case.ideal, case.inputs)
    assert [a.proven for a in checked.fold.of("attention")] == ["no mask"]
    assert checked.folded.delegate_calls == 1
