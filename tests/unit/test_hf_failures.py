"""``xnnfold hf`` when something fails: an export or lowering error is one line that keeps its
reason (torch's messages often start with an empty line); a causal LM whose check fails has
stock's verdict on the same programs and prompt said beside xnnfold's (lowered for that only
when ``--compare`` did not), so a deviation executorch's own .pte has too reads as such.
Fakes for the lowering and the check."""

import pytest
from torch._export.verifier import SpecViolationError

from xnnfold.export.hf import generation
from xnnfold.export.hf.rows import failing_as_usage
from xnnfold.usage import UsageError
from xnnfold.pte import STOCK, XNNFOLD
from xnnfold.pte.compare import Comparison

OK, WRONG = Comparison(True, 1e-6), Comparison(False, 1.0, 1.0, "output 0: off (for the test)")


def fakes(monkeypatch, stock=(OK, WRONG), judged=None):
    lowered, judged = [], [] if judged is None else judged
    monkeypatch.setattr(generation, "_lower", lambda gen, variant, prefer: lowered.append(
        variant) or (b"pte", {}))
    monkeypatch.setattr(generation, "_check", lambda reference, generator, quantized=False:
                        judged.append(quantized) or stock)
    monkeypatch.setattr("xnnfold.export.llm.Generator", lambda pte: object())
    return lowered


def test_a_failing_check_lowers_and_checks_stock(monkeypatch):
    lowered = fakes(monkeypatch)
    said = generation._stock_verdicts(lambda: None, None, {XNNFOLD: (OK, WRONG)}, XNNFOLD, "speed")
    assert said == (OK, WRONG) and lowered == [STOCK]


def test_stock_of_a_quantized_pte_is_judged_as_quantized(monkeypatch):
    judged = []
    fakes(monkeypatch, judged=judged)
    generation._stock_verdicts(lambda: None, None, {XNNFOLD: (OK, WRONG)}, XNNFOLD, "speed", True)
    assert judged == [True]


def test_a_passing_check_lowers_nothing_more(monkeypatch):
    lowered = fakes(monkeypatch)
    said = generation._stock_verdicts(lambda: None, None, {XNNFOLD: (OK, OK)}, XNNFOLD, "speed")
    assert said == (None, None) and lowered == []


def test_stock_already_checked_is_reused(monkeypatch):
    lowered = fakes(monkeypatch)
    verdicts = {XNNFOLD: (WRONG, OK), STOCK: (WRONG, OK)}
    assert generation._stock_verdicts(lambda: None, None, verdicts, XNNFOLD, "speed") == \
        (WRONG, OK) and lowered == []


def test_an_error_keeps_its_reason_when_its_first_line_is_empty():
    histc = SpecViolationError("\nOperator torch._ops.aten.histc.default is not in Core ATen "
                               "opset (https://pytorch.org/docs/stable/torch.compiler_ir.html)")
    with pytest.raises(UsageError) as raised:
        with failing_as_usage("lowering MixtralForCausalLM's forward"):
            raise histc
    assert str(raised.value).startswith(
        "lowering MixtralForCausalLM's forward failed (SpecViolationError: Operator "
        "torch._ops.aten.histc.default is not in Core ATen opset")
    assert raised.value.__cause__ is histc


def test_the_export_s_own_error_is_said_once():
    from xnnfold.export.llm import CannotExport

    error = CannotExport("OPTForCausalLM", "UserError: Could not guard on u2 > 1")
    with pytest.raises(UsageError) as raised:
        with failing_as_usage("OPTForCausalLM: the export with transformers' static cache"):
            raise error
    assert str(raised.value) == ("OPTForCausalLM: the export with transformers' static cache "
                                 "failed (UserError: Could not guard on u2 > 1)")
