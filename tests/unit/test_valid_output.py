"""Every program the pass returns is a valid ExportedProgram: ``validate()`` passes and it
round-trips through ``torch.export.save`` / ``load`` with the values eager computes, also when
the node a step replaced is what the model returns (the signature then names the new node).
No lowering: the pass runs with a fake probe that takes every folded constant."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from xnnfold import pipeline
from xnnfold.graph import validity
from xnnfold.graph.program_copy import copy_program
from conftest import set_strict
from xnnfold.errors import FoldError, StrictFallback
from xnnfold.steps.fold.rules import DEFAULT_RULES
from xnnfold.steps import attention, projections
from xnnfold.steps.projections import split as projection_split

from conftest import round_trip

E = 8


def takes_everything(program, constants):
    return {c.name for c in constants}


class Attention(nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v)


class BatchedMatmul(nn.Module):
    def forward(self, a, b):
        return a @ b


class TransposedTiedHead(nn.Module):
    """``x @ table.t()``, the table also read by the lookup: canonical rewrites it as a linear,
    runtime_weight marks it and swaps its operands; the swap's last node is returned."""

    def __init__(self):
        super().__init__()
        self.table = nn.Embedding(50, E)

    def forward(self, tokens):
        return self.table(tokens) @ self.table.weight.t()


class FoldedParts(nn.Module):
    """Three linears over the parts of a packed weight and bias, all returned."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(3 * E, E))
        self.bias = nn.Parameter(torch.randn(3 * E))

    def forward(self, x):
        return tuple(F.linear(x, w, b) for w, b in zip(self.weight.chunk(3),
                                                        self.bias.chunk(3)))


class ProjectedParts(nn.Module):
    """MHA's packed projection and layout chain, the selected parts returned as they are."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(E, 3 * E)

    def forward(self, x):
        y = self.proj(x).unflatten(-1, (3, E)).unsqueeze(0).transpose(0, -2).squeeze(-2)
        y = y.contiguous()
        return y[0], y[1], y[2]


CASES = {
    "attention": (Attention, lambda: tuple(torch.randn(1, 2, 4, E) for _ in range(3)), "speed"),
    "batched-matmul": (BatchedMatmul, lambda: (torch.randn(2, 3, 4, 5), torch.randn(2, 3, 5, 6)),
                       "speed"),
    "swapped-tied-head": (TransposedTiedHead, lambda: (torch.tensor([[1, 2, 49]]),), "speed"),
    "folded-gemms": (FoldedParts, lambda: (torch.randn(4, E),), "speed"),
    "split-projection": (ProjectedParts, lambda: (torch.randn(4, E),), "speed"),
}


def fold(name):
    model_class, inputs, prefer = CASES[name]
    model, args = model_class().eval(), inputs()
    ep = torch.export.export(model, args)
    result = pipeline.run(ep, takes_everything, DEFAULT_RULES.preferring(prefer))
    assert result.fallback is None and result.modified, result.fallback
    return model, args, result


def what_changed(name, result):
    """The step that replaced the returned node did its work (else the case tests nothing)."""
    if name in ("attention", "batched-matmul"):
        return [a.rewritten for a in result.of("attention")] == [True]
    if name == "swapped-tied-head":
        return any(r.runtime_weight and "swapped" in r.reason for r in result.operands)
    if name == "folded-gemms":
        return len(result.folded) == 6
    return len(projections.split_in(result)) == 1


@pytest.mark.parametrize("name", list(CASES))
def test_a_returned_node_the_pass_replaced_gives_a_valid_program(name):
    model, args, result = fold(name)
    assert what_changed(name, result)
    result.program.validate()
    loaded = round_trip(result.program)
    with torch.no_grad():
        expected = model(*args)
    got = loaded.module()(*args)
    for e, g in zip(expected if isinstance(expected, tuple) else (expected,),
                    got if isinstance(got, tuple) else (got,)):
        torch.testing.assert_close(g, e)


# The negative tests: without the signature's update (the pipeline's, after a step; the split's,
# on the fold's own copy), each replacing step returns an invalid program, and the check after
# that step names it.
REPLACING_STEPS = {"attention": validity, "projections": projection_split,
                   "runtime_weight": validity}
CASE_OF_STEP = {"attention": "attention", "projections": "split-projection",
                "runtime_weight": "swapped-tied-head"}


@pytest.mark.parametrize("step", list(REPLACING_STEPS))
def test_without_the_signature_update_the_check_names_the_step(monkeypatch, step):
    monkeypatch.setattr(REPLACING_STEPS[step], "sync_output_specs", lambda program: None)
    set_strict(monkeypatch, True)
    with pytest.raises(StrictFallback, match=f"the {step} step returned an invalid program: "
                                             "SpecViolationError"):
        fold(CASE_OF_STEP[step])


def test_an_invalid_step_output_falls_back_to_stock_with_one_warning(monkeypatch, caplog):
    monkeypatch.setattr(validity, "sync_output_specs", lambda program: None)
    set_strict(monkeypatch, False)
    ep = torch.export.export(Attention(), CASES["attention"][1]())
    result = pipeline.run(ep, takes_everything)
    assert result.program is ep and "the attention step returned an invalid program" in \
        result.fallback
    warnings = [r.getMessage() for r in caplog.records if r.name == "xnnfold"]
    assert len(warnings) == 1 and "SpecViolationError" in warnings[0], warnings


def test_a_program_torch_already_rejects_is_not_checked(monkeypatch):
    ep = torch.export.export(BatchedMatmul(), CASES["batched-matmul"][1]())
    monkeypatch.setattr(type(ep), "validate", lambda self: (_ for _ in ()).throw(
        RuntimeError("the input's own")))
    checks = validity.StepChecks(ep)
    checks(ep, "attention")       # not the step's doing: no FoldError
    assert not checks.enabled
    with pytest.raises(FoldError, match="the fold step returned an invalid program: "
                                        "RuntimeError: the input's own"):
        validity.check_valid(ep, "fold")


def test_output_specs_follow_the_output_node_and_keep_constants():
    class ConstantToo(nn.Module):
        def forward(self, a, b):
            return a @ b, 3

    ep = torch.export.export(ConstantToo(), CASES["batched-matmul"][1]())
    copy = copy_program(ep)
    before = [spec.arg for spec in ep.graph_signature.output_specs]
    attention.rewrite_attention(copy)
    validity.tidy(copy)       # what the pipeline does after a step
    names = [getattr(s.arg, "name", None) for s in copy.graph_signature.output_specs]
    returned = copy.graph.output_node().args[0]
    assert names[0] == returned[0].name != "matmul"
    assert copy.graph_signature.output_specs[1].arg.value == 3
    assert [spec.arg for spec in ep.graph_signature.output_specs] == before, \
        "the caller's signature changed"
