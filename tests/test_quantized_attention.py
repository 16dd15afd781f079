"""PT2E-quantized attention (XNNPACK's quantizer, per channel, static and dynamic), lowered and
run: outputs against the converted module (the PT2E model before export), within stock's own
error against it; the attention glue off portable; XNNPACK takes as quantized exactly the ops
it takes so for stock; an int8 ``nn.MultiheadAttention`` takes the delegate calls of the same
model written with separate q/k/v linears, with int8 weights only (issue 30).
"""

import pytest
import torch

from conftest import check_lowering
from test_attention import GLUE
from xnnfold import models
from xnnfold.pte import XNNFOLD, lower, run_pte
from xnnfold.models.sources import pt2e_quantized as quantized
from xnnfold.models.zoo import whisper_encoder as scripted_whisper_encoder
from xnnfold.steps.projections import quantized as int8_parts

# What a quantized encoder still leaves on portable: LayerNorm (portable's fused kernel is
# faster than any form XNNPACK 1.5.1 takes: README, "Attention"), the position lookup.
LEFT_ON_PORTABLE = frozenset({"aten.native_layer_norm.default", "aten.embedding.default",
                              "aten.arange.start_step"})
TOL = 0.05     # a few int8 steps of these models' activations; the yardstick is stock's error


def int8_weights(lowered) -> list:
    return sorted(tuple(c.shape) for c in lowered.delegate_constants if c.dtype == torch.int8)


def fp32_matrices(lowered) -> list:
    return [tuple(c.shape) for c in lowered.delegate_constants
            if c.dtype == torch.float32 and len(c.shape) >= 2]


def whisper_encoder(attention: str):
    """transformers' Whisper encoder, small: d_model 64, 4 heads, 64 frames of 16 mel bins."""
    return scripted_whisper_encoder(frames=64, layers=2, d_model=64, heads=4, ffn=128,
                                    mel_bins=16, attention=attention)


# each mode with one attention form in make test, the other two in the slow set
@pytest.mark.parametrize("mode, attention", [
    ("static", "sdpa"), pytest.param("dynamic", "eager", marks=pytest.mark.slow),
    pytest.param("static", "eager", marks=pytest.mark.slow),
    pytest.param("dynamic", "sdpa", marks=pytest.mark.slow)])
def test_quantized_whisper_encoder(mode, attention):
    # transformers' Whisper encoder (the issue's model, small): SDPA, or the eager form's
    # matmuls around a quantized mul of the scores
    model, inputs = whisper_encoder(attention)
    converted = quantized(model, inputs, mode)
    checked = check_lowering(converted, inputs, tol=TOL)
    folded, stock = checked.folded, checked.stock
    assert set(folded.ops_outside) <= LEFT_ON_PORTABLE, folded.ops_outside
    assert GLUE & set(stock.ops_outside) or "aten.expand_copy.default" in stock.ops_outside
    assert folded.quant_ops_outside == []
    # the calibrated quantization kept: the ops XNNPACK takes as quantized are stock's (the
    # projections, convolutions, their layout ops, the residual adds, the eager scores' mul),
    # with the same int8 weights; the attention between them computes in fp32, as the
    # converted module does
    assert folded.quantized_ops == stock.quantized_ops and folded.quantized_ops
    assert int8_weights(folded) == int8_weights(stock)
    assert checked.folded_diff <= checked.stock_diff + 1e-6
    assert folded.delegate_calls < stock.delegate_calls
    assert folded.pte_bytes <= stock.pte_bytes


CASES = {
    "self": lambda: models.attention_case("self"),
    "cross": lambda: models.attention_case("cross"),
    "kdim-vdim": lambda: models.attention_case("kv", kdim=12, vdim=10),
    "decoder-layer": lambda: models.decoder_case(),
}


# each case in one mode in make test (both modes of the decoder layer), the rest in the slow set
IN_MAKE_TEST = {("static", "decoder-layer"), ("dynamic", "self"), ("dynamic", "kdim-vdim")}


@pytest.mark.parametrize("mode, case", [
    (mode, case) if (mode, case) in IN_MAKE_TEST else
    pytest.param(mode, case, marks=pytest.mark.slow)
    for mode in ("static", "dynamic") for case in CASES])
def test_quantized_mha_takes_the_per_part_int8_ideal(mode, case):
    case = CASES[case]()
    converted = quantized(case.model, case.inputs, mode)
    checked = check_lowering(converted, case.inputs, tol=TOL)
    # the same model written with separate q/k/v linears, quantized alike, lowered by xnnfold
    ideal = quantized(case.ideal, case.inputs, mode)
    ideal_lowered = lower(torch.export.export(ideal, case.inputs), XNNFOLD)
    with torch.no_grad():
        ideal_diff = (run_pte(ideal_lowered.pte, case.inputs)[0]
                      - ideal(*case.inputs)).abs().max().item()
    folded = checked.folded
    assert folded.delegate_calls <= ideal_lowered.delegate_calls
    assert folded.gemms_outside == [] and folded.quant_ops_outside == []
    # int8 weights kept int8: the ideal's per-part int8 matrices, no packed one, no fp32 copy
    assert int8_weights(folded) == int8_weights(ideal_lowered)
    assert fp32_matrices(folded) == []
    assert folded.pte_bytes <= checked.stock.pte_bytes
    # dynamic int8 on XNNPACK quantizes activations for real where stock's portable GEMMs
    # replay fp32: the yardstick is the error of the ideal's (or stock's) own .pte
    assert checked.folded_diff <= max(checked.stock_diff, ideal_diff) * 1.01 + 1e-6


def test_without_the_int8_split_the_mha_layout_chain_stays_on_portable(monkeypatch):
    # The negative test of the int8 split: an int8 packed weight is then not cut, the linear
    # stays packed and MHA's select / squeeze chain stays on portable between delegates.
    monkeypatch.setattr(int8_parts, "quantized_weight", lambda weight, facts: None)
    case = CASES["self"]()
    converted = quantized(case.model, case.inputs, "static")
    checked = check_lowering(converted, case.inputs, tol=TOL)
    # what the positive test asks (the ideal's 1 delegate call, no packed int8 matrix) fails
    assert checked.folded.delegate_calls > 1, checked.folded.delegate_calls
    assert "aten.select_copy.int" in checked.folded.ops_outside
    assert ((48, 16)) in int8_weights(checked.folded)
