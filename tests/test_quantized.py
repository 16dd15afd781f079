"""PT2E quantization (XNNPACK quantizer, per-channel): packed params end up delegated the way
stock delegates a plain quantized linear, with int8 weights, no quantize/dequantize left out."""

import pytest
import torch
from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
    XNNPACKQuantizer,
    get_symmetric_quantization_config,
)
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

import xnnfold
from xnnfold import models
from conftest import (GemmsOutside, LargerPte, StockPte, assert_all_delegated, check_lowering,
                      expect)
from test_fp32_positive import K, N, ROWS, Packed


def quantize(model, inputs, dynamic: bool, fold_quantize: bool = True):
    config = get_symmetric_quantization_config(is_per_channel=True, is_dynamic=dynamic)
    module = torch.export.export(model, inputs).module()
    module = prepare_pt2e(module, XNNPACKQuantizer().set_global(config))
    module(*inputs)
    return convert_pt2e(module, fold_quantize=fold_quantize)


def activation_bound(inputs, weights) -> float:
    """Worst output error of int8 activations: half a quantization step (max|x| / 127 / 2 with
    symmetric ranges; asymmetric dynamic ranges are at most twice that) per input, times the
    largest row L1 norm of the weight. Identical int8 weights add nothing."""
    step = max(float(x.abs().max()) for x in inputs) * 2 / 255
    return step * max(float(w.abs().sum(dim=-1).max()) for w in weights)


def _assert_quantized_delegated(checked, int8_shapes):
    assert_all_delegated(checked, packed_shapes=[(2 * N,)])
    assert checked.folded.quant_ops_outside == [], checked.folded.ops_outside
    held = {(tuple(c.shape), c.dtype) for c in checked.folded.delegate_constants}
    for shape in int8_shapes:
        assert (shape, torch.int8) in held, held
        assert (shape, torch.float32) not in held, f"{shape} delegated as fp32: {held}"


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("packed", [("bias",), ("weight", "bias")], ids=["bias", "weight+bias"])
def test_packed_linear_quantized(dynamic, packed):
    torch.manual_seed(0)
    model = Packed("split", ("linear", "linear"), packed).eval()
    inputs = (torch.randn(ROWS, K),)
    converted = quantize(model, inputs, dynamic)
    ep = torch.export.export(converted, inputs)
    weights = model.weight.split(N) if "weight" in packed else list(model.plain_w)
    tol = activation_bound(inputs, weights) if dynamic else 1e-5
    checked = check_lowering(converted, inputs, ep=ep, tol=tol)
    _assert_quantized_delegated(checked, [(N, K)])
    assert len(checked.stock.gemms_outside) == 2
    assert checked.stock_diff <= tol


def test_quantize_of_a_split_part_is_folded_and_its_dequantize_kept():
    """convert_pt2e(fold_quantize=False) leaves quantize(split(W)[i]) -> dequantize -> linear:
    the quantize is folded into an int8 constant, the dequantize stays for XNNPACK. Stock's
    .pte cannot run it: the portable quantize_per_channel asserts a double scale and aborts
    (measured: op_quantize.cpp:427, "scale.scalar_type() 6 is not double type")."""
    torch.manual_seed(0)
    model = Packed("split").eval()
    inputs = (torch.randn(ROWS, K),)
    converted = quantize(model, inputs, dynamic=False, fold_quantize=False)
    ep = torch.export.export(converted, inputs)
    checked = check_lowering(converted, inputs, ep=ep, stock_pte=StockPte.NOT_RUN)
    _assert_quantized_delegated(checked, [(N, K)])
    weights = [c for c in checked.fold.constants if c.dtype == torch.int8]
    assert [c.shape for c in weights] == [(N, K), (N, K)]
    assert all("dequantize" in c.consumers[0] for c in weights)


def test_cross_attention_dynamically_quantized():
    case = models.attention_case("cross")
    converted = quantize(case.model, case.inputs, dynamic=True)
    ep = torch.export.export(converted, case.inputs)
    mha = case.model.mha
    # Two quantized GEMMs in a row: bound each by its own activation range.
    tol = 2 * (activation_bound(case.inputs, [mha.in_proj_weight])
               + activation_bound(case.inputs, [mha.out_proj.weight]))
    checked = check_lowering(converted, case.inputs, ep=ep, tol=tol)
    assert checked.folded.gemms_outside == [] and checked.folded.splits_outside == []
    assert checked.folded.quant_ops_outside == []
    # the k/v projection split in two (issue 30): each part's int8 weight is its rows of the
    # packed int8 tensor, which is not stored
    held = [(tuple(c.shape), c.dtype) for c in checked.folded.delegate_constants]
    assert held.count(((16, 16), torch.int8)) == 4, held
    assert not {((32, 16), torch.int8), ((48, 16), torch.int8), ((48,), torch.float32)} & \
        set(held)
    assert checked.folded.delegate_calls == 1
    rows = xnnfold.explain(ep)
    assert {(r.gemm, r.role, r.status) for r in rows if r.role == "bias"} == {
        ("linear", "bias", "folded"), ("linear_1_part0", "bias", "folded"),
        ("linear_1_part1", "bias", "folded"), ("linear_2", "bias", "plain")}


class AttentionPooling(torch.nn.Module):
    """Attention pooling with a learned query (a MAP head): the q projection's activation is a
    param, which under dynamic int8 XNNPACK declines as a quantized GEMM."""

    def __init__(self, e=32, heads=4, queries=1):
        super().__init__()
        self.query = torch.nn.Parameter(torch.randn(1, queries, e))
        self.attn = torch.nn.MultiheadAttention(e, heads, batch_first=True)
        torch.nn.init.normal_(self.attn.in_proj_bias)

    def forward(self, x):
        return self.attn(self.query.expand(x.shape[0], -1, -1), x, x, need_weights=False)[0]


def no_more_gemms_than_the_flag(model, inputs):
    """Dynamic int8 through the shared helper, and no more GEMMs outside delegates than stock's
    flag leaves (GemmsOutside otherwise); returns the helper's result and the flag's lowering."""
    from xnnfold.pte import STOCK_FLAG, lower

    converted = quantize(model.eval(), inputs, dynamic=True)
    ep = torch.export.export(converted, inputs)
    checked = check_lowering(converted, inputs, ep=ep, tol=0.1)
    flag = lower(ep, STOCK_FLAG)
    expect(len(checked.folded.gemms_outside) <= len(flag.gemms_outside), GemmsOutside,
           f"xnnfold leaves {checked.folded.gemms_outside}, the flag {flag.gemms_outside}")
    return checked, flag


def dynamic_attention_pooling():
    torch.manual_seed(0)
    checked, flag = no_more_gemms_than_the_flag(AttentionPooling(), (torch.randn(2, 6, 32),))
    expect(checked.folded.pte_bytes <= flag.pte_bytes, LargerPte,
           f"xnnfold {checked.folded.pte_bytes:,} bytes, the flag {flag.pte_bytes:,}")
    return checked


def test_dynamic_attention_pooling_with_a_learned_query_leaves_no_more_gemms_than_the_flag():
    checked = dynamic_attention_pooling()
    assert checked.folded.gemms_outside == [] and len(checked.stock.gemms_outside) == 1
    (q_weight,) = [o for o in checked.fold.operands if o.gemm == "linear" and o.role == "weight"]
    assert q_weight.runtime_weight


def test_dynamic_attention_pooling_without_the_quantized_runtime_path(monkeypatch):
    from xnnfold.steps import runtime_weight
    monkeypatch.setattr(runtime_weight, "_declined_quantized", lambda *args: False)
    with pytest.raises(GemmsOutside):
        dynamic_attention_pooling()


class LearnedQueryDecoderLayer(torch.nn.Module):
    """A decoder layer over learned queries with a key padding mask: its self-attention's
    in-projection reads only the queries (a plain int8 weight, a static activation)."""

    def __init__(self, e=32, queries=4):
        super().__init__()
        self.query = torch.nn.Parameter(torch.randn(1, queries, e))
        self.layer = torch.nn.TransformerDecoderLayer(e, 4, 64, dropout=0.0, batch_first=True)

    def forward(self, memory, mask):
        return self.layer(self.query.expand(memory.shape[0], -1, -1), memory,
                          memory_key_padding_mask=mask)


def dynamic_learned_query_decoder():
    torch.manual_seed(0)
    mask = torch.zeros(1, 10, dtype=torch.bool)
    mask[0, 7:] = True
    return no_more_gemms_than_the_flag(LearnedQueryDecoderLayer(),
                                       (torch.randn(1, 10, 32), mask))[0]


def test_dynamic_masked_decoder_over_learned_queries_leaves_no_more_gemms_than_the_flag():
    checked = dynamic_learned_query_decoder()
    assert checked.folded.gemms_outside == [] and len(checked.stock.gemms_outside) == 3


def test_dynamic_masked_decoder_without_the_static_activation_rule(monkeypatch):
    from xnnfold.steps import runtime_weight
    monkeypatch.setattr(runtime_weight, "_reads_user_input", lambda *args: True)
    with pytest.raises(GemmsOutside):
        dynamic_learned_query_decoder()
