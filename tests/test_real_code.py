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

from xnnfold import analysis, pipeline
from xnnfold.steps.fold import rules
from xnnfold.steps import canonical, fold, runtime_weight
import xnnfold.steps.fold.apply  # noqa: F401  (a guard below is patched there)
from xnnfold.decision import Decline, Rule
from xnnfold.steps.fold.rules import DEFAULT_RULES

from conftest import (Fallback, GemmsOutside, Params, StoredMore, UnexpectedFold,
                      assert_all_delegated, check_lowering, expect_fold, tiny_wav2vec2_config)

E = 16


def same_dtype_casts():
    """``F.linear(x, w.to(x.dtype), b.type_as(x))``: a mixed-precision idiom, a no-op in fp32."""
    def body(p, x):
        for weight, bias in ((p.w1, p.b1), (p.w2, p.b2)):
            x = F.linear(x, weight.to(x.dtype), bias.type_as(x))
        return x
    checked = check_lowering(Params(body, w1=(E, E), b1=(E,), w2=(E, E), b2=(E,)).eval(),
                             (torch.randn(3, E),))
    expect_fold(checked.statuses(), {"plain"}, "statuses")
    assert all("removed by decomposition" in o.reason for o in checked.fold.operands)
    assert checked.folded.pte == checked.stock.pte


def cast_then_scaled():
    """``w.to(x.dtype) * s``: the cast's ``_assert_tensor_metadata`` reads the *param*."""
    checked = check_lowering(Params(lambda p, x: F.linear(x, p.weight.to(x.dtype) * 0.5),
                                    weight=(E, E)).eval(), (torch.randn(3, E),))
    assert checked.fold.freed_params == ["weight"], checked.fold.freed_params
    assert_all_delegated(checked)


@pytest.mark.fallback_expected
def test_no_growth_guard_catches_what_the_rules_miss(monkeypatch, xnnfold_log):
    """Without the size rule the fold would store the tiled weight; the guard declines it."""
    tiled = Params(lambda p, x: F.linear(x, p.tile.repeat(8, 1)), tile=(2, E))
    ep = torch.export.export(tiled, (torch.randn(3, E),))
    without_size = DEFAULT_RULES.without(Rule.SIZE)
    result = pipeline.run(ep, probe=None, rule_set=without_size)
    assert result.program is ep and "more than the input" in result.fallback
    assert len(xnnfold_log.records) == 1
    monkeypatch.setattr(pipeline, "check_no_growth", lambda ep, result: None)
    grown = pipeline.run(ep, probe=None, rule_set=without_size)
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


def linear_and_transposed_addmm():
    torch.manual_seed(0)
    checked = check_lowering(LinearAndTransposedAddmm().eval(),
                             (torch.randn(3, E), torch.randn(3, E)))
    assert_all_delegated(checked, packed_shapes=[(2 * E, E), (2 * E,)], part_shapes=[(E, E)])
    assert len(checked.stock.gemms_outside) == 4
    assert [r.was for r in checked.fold.of("canonical")] == ["aten.addmm.default"] * 2


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
    assert [r.gemm for r in checked.fold.of("canonical")] == ["mm", "matmul", "matmul_1", "addmm"]


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


def tied_head():
    torch.manual_seed(0)
    checked = check_lowering(TiedHead().eval(), (torch.tensor([[1, 7, 42, 299]]),))
    assert checked.stock.gemms_outside, "stock was expected to leave the head on portable"
    assert_all_delegated(checked)
    (head,) = [o for o in checked.fold.operands if o.gemm == "matmul"]
    assert head.runtime_weight and "also read by embedding" in head.reason


class TiedLinearHead(TiedHead):
    """The same head as a plain ``nn.Linear`` sharing the table (GPT-2, T5, BART): stock
    delegates it with the table as a constant, so its .pte stores the table twice."""

    def __init__(self, vocab=300):
        super().__init__(vocab)
        self.head = nn.Linear(E, vocab, bias=False)
        self.head.weight = self.embedding.weight

    def forward(self, tokens):
        return self.head(torch.relu(self.mix(self.embedding(tokens))))


def test_tied_linear_head_stores_its_table_once_with_prefer_size():
    torch.manual_seed(0)
    checked = check_lowering(TiedLinearHead().eval(), (torch.tensor([[1, 7, 42, 299]]),),
                             rules=DEFAULT_RULES.preferring("size"))
    table = 300 * E * 4
    assert checked.stock.constant_bytes - checked.folded.constant_bytes == table
    assert checked.folded.pte_bytes < checked.stock.pte_bytes - table
    assert_all_delegated(checked)
    (head,) = [o for o in checked.fold.operands if o.role == "weight" and o.runtime_weight]
    assert head.size_option_bytes == table


def tied_linear_head_by_default():
    """The default keeps stock's speed: stock's constant copy of the table; the row still says
    what prefer='size' would save."""
    torch.manual_seed(0)
    checked = check_lowering(TiedLinearHead().eval(), (torch.tensor([[1, 7, 42, 299]]),))
    (head,) = [o for o in checked.fold.operands if o.gemm == "linear_1" and o.role == "weight"]
    rewrote = [step for step, records in checked.fold.records.items()
               if any(r.rewritten for r in records)]
    # the head only reads the table from a placeholder of its own (the tied_table step)
    expect_fold((rewrote, head.runtime_weight), (["tied_table"], False), "tied linear head")
    # stock's constant copy of the table in the delegate; one delegate where stock makes two
    # around the shared placeholder (the relu between them on portable); a .pte no larger
    assert sorted(c.shape for c in checked.folded.delegate_constants) == \
        sorted(c.shape for c in checked.stock.delegate_constants)
    assert (checked.folded.delegate_calls, checked.stock.delegate_calls) == (1, 2)
    assert checked.folded.pte_bytes <= checked.stock.pte_bytes
    assert head.size_option_bytes == 300 * E * 4 and not head.runtime_weight
    assert "prefer='size'" in head.reason


def test_the_lowering_copies_no_tied_table():
    """executorch's lowering deep-copies a placeholder a delegate shares with an op outside it
    (the tied table: 1.05 GB at Llama-3.2-1B's dims); read by the head from a placeholder of
    its own, the delegate and the lookup both hold the model's own table."""
    from executorch.exir import to_edge_transform_and_lower

    from xnnfold import XnnpackPartitioner

    torch.manual_seed(0)
    model = TiedLinearHead().eval()
    ep = torch.export.export(model, (torch.tensor([[1, 7, 42, 299]]),), strict=True)
    edge = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])
    program = edge.exported_program()
    table = model.embedding.weight
    held = [t for t in program.state_dict.values() if t.shape == table.shape]
    for module in program.graph_module.children():
        if hasattr(module, "original_module"):          # a lowered delegate
            held += [t for t in module.original_module.state_dict.values()
                     if t.shape == table.shape]
    assert len(held) == 2
    assert all(t.untyped_storage().data_ptr() == table.untyped_storage().data_ptr()
               for t in held), "the lowering copied the table"


def test_weight_computed_from_an_input_is_delegated_with_a_runtime_weight():
    torch.manual_seed(0)
    model = Params(lambda p, x, w: F.linear(x, w * p.scale), scale=(8, 1))
    checked = check_lowering(model.eval(), (torch.randn(3, E), torch.randn(8, E)))
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


def partly_taken_group(rules=DEFAULT_RULES):
    torch.manual_seed(0)
    x = torch.randn(5, E)
    checked = check_lowering(Fp32AndBf16Parts().eval(), (x, x.bfloat16()), tol=0.25,
                             rules=rules)
    rows = {o.gemm: (o.status, o.delegated) for o in checked.fold.operands}
    expect_fold(rows, {"linear": ("folded", True), "linear_1": ("folded", False)}, "rows")
    assert checked.folded.splits_outside == []
    assert checked.folded.gemms_outside == ["aten.mm.default"]     # the bf16 one, on portable


@rules._rule(Rule.DELEGATED)
def _old_delegated(group, facts):
    """The rule as it was: any member XNNPACK declines takes its whole group down."""
    if all(m.delegated for m in group.to_fold):
        return {}
    return {m: Decline(Rule.DELEGATED, m.name, "old rule") for m in group.to_fold}


# --------------------------------------------------------------------------------------------
# Each case, and each with the guard it relies on removed: it must then fail, for that reason.

CASES = {
    "same-dtype casts": same_dtype_casts,
    "metadata assertion of a cast param": cast_then_scaled,
    "linear and transposed addmm": linear_and_transposed_addmm,
    "tied head": tied_head,
    "tied linear head by default": tied_linear_head_by_default,
    "group taken in part": partly_taken_group,
}


@pytest.mark.parametrize("name", CASES)
def test_case(name):
    CASES[name]()


def _with_the_old_delegated_rule():
    partly_taken_group(rules.RuleSet(DEFAULT_RULES.before_probe,
                                     (_old_delegated, rules.whole_group)))


# case, what to remove (module, attribute, replacement), or a variant to run, the failure type
GUARDS = [
    # the casts would be folded: the operands are not plain
    ("same-dtype casts", (analysis, "removed_by_decomposition", lambda node: None),
     UnexpectedFold),
    # without it the param stays for its assertion: the no-growth guard sends us to stock
    ("metadata assertion of a cast param",
     (fold.apply, "is_metadata_assertion", lambda node: False),
     Fallback),
    # kept as addmm, each part would be folded twice (W and W.t()): the size rule declines
    ("linear and transposed addmm", (canonical, "linear_args", lambda node: None),
     GemmsOutside),
    # as a constant the table would be stored twice: in the delegate and for the lookup
    ("tied head", (runtime_weight, "_needs_runtime_weight", lambda *args: None), StoredMore),
    # the old rule declines the whole group, the bf16 part too
    ("group taken in part", _with_the_old_delegated_rule, UnexpectedFold),
    # without the trade rule the default takes the run-time weight: smaller, not stock's .pte
    ("tied linear head by default", (runtime_weight, "_stock_copies", lambda *args: None),
     UnexpectedFold),
]


@pytest.mark.parametrize("name,remove,failure", GUARDS, ids=[g[0] for g in GUARDS])
def test_guard_is_load_bearing(monkeypatch, name, remove, failure):
    case = CASES[name]
    if callable(remove):
        case = remove
    else:
        monkeypatch.setattr(*remove)
    with pytest.raises(AssertionError) as raised:
        case()
    assert type(raised.value) is failure, f"{type(raised.value).__name__}: {raised.value}"


def test_wav2vec2_with_an_unbounded_length_folds_its_weight_norm_conv():
    """transformers' Wav2Vec2 with its audio length left to export (``Dim.AUTO``: no upper
    bound): the positional conv's weight_norm weight is folded, which stock leaves on portable.
    On the way the probe meets an unbounded range (torch's int_oo) and lengths divided by the
    conv strides (``s0 // 5``), each a known limit rather than a failure."""
    import transformers

    torch.manual_seed(0)
    config = tiny_wav2vec2_config(transformers, layers=1)

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = transformers.Wav2Vec2Model(config)

        def forward(self, audio):
            return self.encoder(audio).last_hidden_state

    model = Encoder().eval()
    # Unbounded, ExecuTorch plans memory for the example's length: the second run is shorter.
    checked = check_lowering(model, (torch.randn(1, 1600),),
                             dynamic_shapes=({1: torch.export.Dim.AUTO},),
                             run_inputs=[(torch.randn(1, 1200),)], tol=1e-4)
    assert checked.folded.gemms_outside == [], checked.folded.gemms_outside
    assert len(checked.stock.gemms_outside) == 1, checked.stock.gemms_outside
