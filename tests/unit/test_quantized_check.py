"""A quantized generation .pte's check (``compare_to_spread``, ``generation_check``) on small
tensors, without lowering: the .pte's logits judged against eager's own spread (eager again
with its quantized linears' inputs nudged), by the largest difference and by every row's
relative RMS, each rule with a case only it fails; the greedy tokens reported; eager's
reference computing that spread on a quantized model and leaving the model as it was."""

import pytest
import torch

from conftest import seed_everything
from xnnfold.export.hf import generation_check, plan as hf_plan
from xnnfold.pte.compare import SPREAD_FACTOR, compare_to_spread

ROWS, VOCAB = 5, 4000


@pytest.fixture(autouse=True)
def _seeded(request):
    seed_everything(request.node.nodeid)


def _logits():
    return torch.randn(ROWS, VOCAB)


def test_a_pte_within_eager_spread_passes_and_says_by_how_much():
    expected = _logits()
    spread = expected + 0.02 * torch.randn(ROWS, VOCAB)
    actual = expected + 0.025 * torch.randn(ROWS, VOCAB)
    verdict = compare_to_spread(actual, expected, spread)
    assert verdict.ok, verdict
    said = str(verdict)
    assert said.startswith("max abs diff") and "x eager's own spread" in said, said
    assert f"greedy tokens equal eager's in {ROWS} of {ROWS}" in said, said


def test_every_row_off_by_many_small_differences_is_wrong():
    """Rule: a row's relative RMS within SPREAD_FACTOR times eager's. Every logit off by 0.09,
    each within eager's largest difference (one logit a row off by 0.1):
    only the whole row says it is wrong."""
    expected = _logits()
    spread = expected.clone()
    spread[:, 0] += 0.1
    actual = expected + 0.09 * torch.randn(ROWS, VOCAB).sign()
    verdict = compare_to_spread(actual, expected, spread)
    assert not verdict.ok and "a row's relative RMS" in verdict.reason, verdict
    assert float((actual - expected).abs().max()) < 0.1


def test_one_logit_far_off_is_wrong():
    """Rule: the largest difference within SPREAD_FACTOR times eager's. One logit off by 0.6
    in a row whose others are as close as eager's spread: its relative RMS stays within
    SPREAD_FACTOR times eager's, its largest difference does not."""
    expected = _logits()
    spread = expected + 0.01 * torch.randn(ROWS, VOCAB)
    actual = expected + 0.01 * torch.randn(ROWS, VOCAB)
    actual[2, 7] = expected[2, 7] + 0.6
    verdict = compare_to_spread(actual, expected, spread)
    assert not verdict.ok and "max abs diff 0.6, " in verdict.reason, verdict
    rows = (actual - expected).norm(dim=1) / (spread - expected).norm(dim=1)
    assert float(rows.max()) < SPREAD_FACTOR, rows


def test_a_model_eager_rounding_does_not_move_is_held_to_fp32_rounding():
    """Rule: the spread is at least fp32's rounding (ROW_TOLERANCE of the largest |logit|):
    eager unmoved by the nudge still passes a .pte within rounding, not one off by 1e-3."""
    expected = _logits()
    scale = float(expected.abs().max())
    within = expected + 1e-5 * scale * torch.randn(ROWS, VOCAB).clamp(-1, 1)
    assert compare_to_spread(within, expected, expected.clone()).ok
    off = expected + 1e-3 * scale * torch.randn(ROWS, VOCAB).sign()
    assert not compare_to_spread(off, expected, expected.clone()).ok


def test_nan_and_shape_are_wrong_with_their_reason():
    expected = _logits()
    actual = expected.clone()
    actual[1, 3] = float("nan")
    verdict = compare_to_spread(actual, expected, expected + 0.01)
    assert not verdict.ok and "NaN/inf" in verdict.reason, verdict
    verdict = compare_to_spread(expected[:, :10], expected, expected + 0.01)
    assert not verdict.ok and "shape" in verdict.reason, verdict


def test_a_token_that_differs_on_a_near_tie_is_reported_with_eager_lead():
    expected = _logits()
    top = expected.topk(2, dim=1)
    expected[3, top.indices[3, 1]] = top.values[3, 0] - 0.01         # a near-tie in row 3
    spread = expected + 0.02 * torch.randn(ROWS, VOCAB)
    actual = expected.clone()
    actual[3, top.indices[3, 1]] += 0.03                             # the .pte picks the other
    verdict = compare_to_spread(actual, expected, spread)
    assert verdict.ok, verdict
    assert (f"greedy tokens equal eager's in {ROWS - 1} of {ROWS}, eager's best leading the "
            "others by at most 0.01") in str(verdict), verdict


class _Stored:
    """A generator whose prefill and steps give stored rows."""

    def __init__(self, rows):
        self.rows = list(rows)

    def prefill(self, prompt):
        return self.rows.pop(0)[None]

    def step(self, token, position):
        return self.rows.pop(0)[None]


def test_the_check_judges_a_quantized_pte_against_the_reference_spread():
    expected = _logits()
    reference = generation_check.EagerReference([1, 2], [1, 2, 3, 4, 5, 6], expected,
                                                expected + 0.05 * torch.randn(ROWS, VOCAB))
    actual = expected + 0.06 * torch.randn(ROWS, VOCAB)
    verdicts = generation_check.check(reference, _Stored(actual), quantized=True)
    assert all(v.ok and "eager's own spread" in str(v) for v in verdicts), verdicts
    # the same .pte against a spread 100 times smaller: wrong, in both phases
    reference.spread = expected + 5e-4 * torch.randn(ROWS, VOCAB)
    verdicts = generation_check.check(reference, _Stored(actual), quantized=True)
    assert [v.ok for v in verdicts] == [False, False], verdicts


@pytest.fixture(scope="module")
def quantized_llama():
    import transformers as tf

    from xnnfold.export.llm.quantize import quantize_linears

    torch.manual_seed(0)
    model = tf.LlamaForCausalLM(tf.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=256)).eval()
    fp32 = tf.LlamaForCausalLM(model.config).eval()
    fp32.load_state_dict(model.state_dict())
    quantize_linears(model, "8da4w")
    return model, fp32


def test_eager_reference_of_a_quantized_model_has_its_spread_and_leaves_it_as_it_was(
        quantized_llama, monkeypatch):
    model, fp32 = quantized_llama
    monkeypatch.setattr(hf_plan, "CHECK_STEPS", 3)
    reference = generation_check.eager_reference(model, [5, 6, 7])
    assert reference.spread is not None and reference.spread.shape == reference.logits.shape
    moved = (reference.spread - reference.logits).abs().max()
    assert 0 < float(moved) < 0.1 * float(reference.logits.abs().max()), moved
    # no hook left on the model: the same logits as before, and a second reference the same
    assert not any(m._forward_pre_hooks for m in model.modules())
    again = generation_check.eager_reference(model, [5, 6, 7])
    assert torch.equal(again.logits, reference.logits)
    assert torch.equal(again.spread, reference.spread)
    assert generation_check.eager_reference(fp32, [5, 6, 7]).spread is None
