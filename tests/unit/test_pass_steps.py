"""Unit tests of the pass's steps on tiny exported graphs: no lowering, no runtime.

Each step is asked directly (analysis, plan and rules, canonical GEMMs, runtime-weight marking
and the operand swap, the no-growth guard, the whole pass with a fake probe), so that a broken
rule fails here in milliseconds, before the integration tests lower anything.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from xnnfold import analysis, pipeline
from xnnfold.steps.fold import rules
from xnnfold.steps import canonical, projections, runtime_weight
from xnnfold.steps.fold import plan
from xnnfold.graph.program_copy import copy_program
from conftest import set_strict
from xnnfold.config import Config
from xnnfold.errors import StrictFallback
from xnnfold.decision import Found, Rule, Status
from xnnfold.result import GemmOperand
from xnnfold.steps.fold.rules import DEFAULT_RULES

E = 8


def export(module, *inputs):
    return torch.export.export(module.eval(), inputs)


def node(ep, name):
    return next(n for n in ep.graph.nodes if n.name == name)


def groups_of(ep):
    facts = analysis.find_static(ep)
    operands = analysis.find_operands(ep, facts)
    targets = [o.target for o in operands if o.status == Found.TARGET]
    return facts, plan.group_fold_nodes(plan.fold_nodes(targets))


# --------------------------------------------------------------------------------------------
# Analysis


class Casts(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(E, E))
        self.bias = nn.Parameter(torch.randn(E))

    def forward(self, x):
        return F.linear(x, self.weight.to(x.dtype), self.bias.type_as(x)), \
            F.linear(x, self.weight.to(torch.float64).float(), self.bias.detach())


def test_no_op_casts_are_plain_and_real_casts_are_targets():
    ep = export(Casts(), torch.randn(2, E))
    rows = {(o.gemm.name, o.role): o.status for o in analysis.find_operands(ep)}
    # to(same dtype) and type_as decompose to the param itself; a round trip through fp64 is a
    # real computation; detach has a kernel of its own (stock keeps an alias_copy), and reads
    # only the value of type_as(bias, x), whose x counts for its dtype.
    assert rows == {("linear", "weight"): Found.PLAIN, ("linear", "bias"): Found.PLAIN,
                    ("linear_1", "weight"): Found.TARGET, ("linear_1", "bias"): Found.TARGET}


class FromInput(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(E, E))

    def forward(self, x, w):
        return F.linear(x, self.weight * w.sum())


def test_operand_computed_from_an_input_is_dynamic_and_names_the_input():
    ep = export(FromInput(), torch.randn(2, E), torch.randn(3))
    (operand,) = analysis.find_operands(ep)
    assert (operand.status, operand.culprit) == (Found.DYNAMIC, "w")


# --------------------------------------------------------------------------------------------
# Plan and rules


class Split(nn.Module):
    """Two parts of a packed weight; ``use`` picks what else reads them."""

    def __init__(self, use="none"):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(2 * E, E))
        self.use = use

    def forward(self, x):
        w1, w2 = self.weight.split(E)
        if self.use == "random":
            w1 = w1 + torch.rand(E, E) * 0.0
        out = F.linear(x, w1) + F.linear(x, w2)
        return out * w1.sum() if self.use == "sum" else out


def declines(ep, rule_set=DEFAULT_RULES.before_probe):
    facts, groups = groups_of(ep)
    rules.apply(groups, facts, rule_set)
    return {m.targets[0].gemm.name: (m.decline.rule if m.decline else None)
            for g in groups for m in g.members}


def test_parts_of_one_split_are_one_group():
    _, groups = groups_of(export(Split(), torch.randn(2, E)))
    assert [len(g.members) for g in groups] == [2]


def test_rule_size_declines_a_part_also_read_elsewhere():
    ep = export(Split("sum"), torch.randn(2, E))
    assert declines(ep) == {"linear": Rule.SIZE, "linear_1": Rule.SIZE}
    assert declines(ep, DEFAULT_RULES.without(Rule.SIZE).before_probe) == {
        "linear": None, "linear_1": None}


def test_rule_exact_and_whole_group():
    ep = export(Split("random"), torch.randn(2, E))
    assert declines(ep) == {"linear": Rule.EXACT, "linear_1": Rule.WHOLE_GROUP}
    assert declines(ep, DEFAULT_RULES.without(Rule.WHOLE_GROUP).before_probe) == {
        "linear": Rule.EXACT, "linear_1": None}
    assert declines(ep, DEFAULT_RULES.without(Rule.EXACT).before_probe) == {
        "linear": None, "linear_1": None}


@pytest.mark.parametrize("taken,expected", [((True, False), None), ((False, False),
                                                                     Rule.DELEGATED)])
def test_rule_delegated_needs_one_gemm_of_the_group(taken, expected):
    facts, groups = groups_of(export(Split(), torch.randn(2, E)))
    for member, delegated in zip(groups[0].members, taken):
        member.delegated = delegated
    rules.apply(groups, facts, DEFAULT_RULES.after_probe)
    assert {m.decline.rule if m.decline else None for m in groups[0].members} == {expected}


def test_rule_set_without_drops_by_name():
    reduced = DEFAULT_RULES.without(Rule.SIZE, Rule.DELEGATED)
    assert [r.rule for r in reduced.before_probe] == [Rule.EXACT, Rule.WHOLE_GROUP]
    assert [r.rule for r in reduced.after_probe] == [Rule.WHOLE_GROUP]


# --------------------------------------------------------------------------------------------
# Canonical GEMMs


class Transposed(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, E))
        self.bias = nn.Parameter(torch.randn(4))
        self.row_bias = nn.Parameter(torch.randn(2, 4))

    def forward(self, x):
        return (x @ self.weight.T, torch.addmm(self.bias, x, self.weight.t()),
                torch.addmm(self.row_bias, x, self.weight.t()),     # a (2, 4) bias: not linear
                torch.addmm(self.bias, x, self.weight.t(), alpha=2.0),
                torch.mm(x, self.weight.t().contiguous()))          # not a transpose itself


def test_canonicalize_rewrites_only_exact_linears_and_keeps_values():
    ep = export(Transposed(), torch.randn(2, E))
    x = torch.randn(2, E)
    before = ep.module()(x)
    program = copy_program(ep)
    rewrites = canonical.canonicalize(program, analysis.find_static(program).static)
    assert [(r.gemm, r.was) for r in rewrites] == [("matmul", "aten.matmul.default"),
                                                   ("addmm", "aten.addmm.default")]
    assert node(program, "matmul").target is torch.ops.aten.linear.default
    for expected, got in zip(before, program.module()(x)):
        torch.testing.assert_close(got, expected)
    assert str(ep.graph).count("linear") == 0, "the caller's program was rewritten"


# --------------------------------------------------------------------------------------------
# Runtime weights


class TiedHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(50, E)
        self.head = nn.Linear(E, 50, bias=False)
        self.head.weight = self.embedding.weight

    def forward(self, tokens):
        return self.head(self.embedding(tokens))


def test_tied_linear_head_is_left_as_stock_by_default_with_the_size_option_priced():
    ep = export(TiedHead(), torch.tensor([[1, 2, 3]]))
    result = pipeline.run(ep, probe=None)
    rewrote = [name for name, records in result.records.items()
               if any(r.rewritten for r in records)]
    assert rewrote == ["tied_table"]          # the head keeps its constant, as stock's
    (row,) = [r for r in result.operands if r.role == "weight"]
    assert not row.runtime_weight and row.size_option_bytes == 50 * E * 4
    assert "repacked on every call" in row.reason


@pytest.mark.parametrize("strict", [True, False])
def test_tied_linear_head_reads_the_table_from_a_placeholder_of_its_own(strict):
    """The same tensor under another name: the lowering finds no placeholder shared by a
    delegate and an op outside it, so it copies nothing; the program stores no more. A strict
    export has one placeholder for the tied names, the head gets one under its own name; a
    non-strict one has one per name, one of them unread, and the head gets a new one beside
    the table's (as executorch's copy would be, so the delegate's constants keep stock's
    order)."""
    tokens = torch.tensor([[1, 2, 3]])
    ep = torch.export.export(TiedHead().eval(), (tokens,), strict=strict)
    result = pipeline.run(ep, probe=None)
    program = result.program
    head, lookup = node(program, "linear"), node(program, "embedding")
    assert head.args[1] is not lookup.args[0]
    specs = {s.arg.name: s.target for s in program.graph_signature.input_specs}
    assert program.state_dict[specs[head.args[1].name]] is \
        program.state_dict[specs[lookup.args[0].name]] is ep.state_dict["embedding.weight"]
    assert specs[head.args[1].name] == ("head.weight" if strict else "head.weight_head")
    assert len(program.graph_signature.input_specs) == len(ep.graph_signature.input_specs) + 1
    assert pipeline.stored_bytes(program) == pipeline.stored_bytes(ep)
    (record,) = result.records["tied_table"]
    assert record.rewritten and record.gemms == ("linear",) and record.nbytes == 50 * E * 4
    other = torch.tensor([[4, 0, 49]])
    assert torch.equal(program.module()(other)[0], ep.module()(other)[0])
    # the caller's program is as torch.export gave it
    assert node(ep, "linear").args[1] is node(ep, "embedding").args[0]


class CastTiedHead(nn.Module):
    """The head reads the table through a same-dtype cast (``W.to(x.dtype)``), which
    decomposition removes; a lookup reads the table itself."""

    def __init__(self, shared_cast: bool = False):
        super().__init__()
        self.table = nn.Parameter(torch.randn(50, E))
        self.shared_cast = shared_cast

    def forward(self, tokens):
        x = F.embedding(tokens, self.table)
        weight = self.table.to(x.dtype)
        out = F.linear(x, weight)
        return (out, weight.sum()) if self.shared_cast else out


@pytest.mark.parametrize("shared_cast", [False, True])
def test_a_head_behind_a_cast_reads_the_table_through_it(shared_cast):
    tokens = torch.tensor([[1, 2, 3]])
    ep = torch.export.export(CastTiedHead(shared_cast).eval(), (tokens,), strict=True)
    result = pipeline.run(ep, probe=None)
    (record,) = result.records["tied_table"]
    program = result.program
    lookup = node(program, "embedding")
    cast = {user for user in lookup.args[0].users if user is not lookup and
            not analysis.is_metadata_assertion(user)}
    if shared_cast:          # the cast is read by a sum too: left as stock has it
        assert not record.rewritten and "more than the heads" in record.reason
        assert len(cast) == 1
    else:
        assert record.rewritten and not cast     # the lookup alone reads the table's placeholder
        assert torch.equal(program.module()(tokens), ep.module()(tokens))


def test_a_table_the_head_reads_at_run_time_is_not_split():
    ep = export(TiedHead(), torch.tensor([[1, 2, 3]]))
    result = pipeline.run(ep, probe=None, rule_set=DEFAULT_RULES.preferring("size"))
    assert result.records["tied_table"] == []
    assert len(result.program.graph_signature.input_specs) == len(ep.graph_signature.input_specs)


def test_a_tensor_under_two_names_is_stored_once():
    ep = export(TiedHead(), torch.tensor([[1, 2, 3]]))
    result = pipeline.run(ep, probe=None)
    # counted by name, the split table would look stored twice and the pass fall back
    assert pipeline.stored_bytes(result.program) == 50 * E * 4


def test_prefer_must_be_speed_or_size():
    with pytest.raises(ValueError, match="prefer"):
        DEFAULT_RULES.preferring("fast")


def test_tied_head_is_marked_and_swapped_and_keeps_its_values():
    ep = export(TiedHead(), torch.tensor([[1, 2, 3]]))
    result = pipeline.run(ep, probe=None, rule_set=DEFAULT_RULES.preferring("size"))
    head = node(result.program, "linear")
    assert runtime_weight.is_marked(head) and not any(
        runtime_weight.is_marked(n) for n in ep.graph.nodes), "the caller's program was marked"
    # swapped: the table is the activation, the three token rows are the weight
    assert head.args[0].op == "placeholder" and head.args[1].op != "placeholder"
    tokens = torch.tensor([[4, 0, 49]])
    torch.testing.assert_close(result.program.module()(tokens)[0], ep.module()(tokens)[0])
    (row,) = [r for r in result.operands if r.role == "weight"]
    assert row.runtime_weight and "swapped" in row.reason


def test_tied_head_behind_a_same_dtype_cast_is_marked():
    # Found by the property test (seed 8): the lookup and the head both read ``w.to(float32)``,
    # not the param itself; as a delegate constant the table would be stored twice.
    class CastTied(nn.Module):
        def __init__(self):
            super().__init__()
            self.table = nn.Parameter(torch.randn(50, E))

        def forward(self, tokens, x):
            w = self.table.to(torch.float32)
            return F.embedding(tokens, w), x @ w.t()

    ep = export(CastTied(), torch.tensor([1, 2]), torch.randn(3, E))
    result = pipeline.run(ep, probe=None)
    (row,) = [r for r in result.operands if r.role == "weight"]
    assert row.runtime_weight and "also read by embedding" in row.reason


def test_untied_plain_linear_is_not_marked():
    class Plain(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(E, E)

        def forward(self, x):
            return self.layer(x)

    ep = export(Plain(), torch.randn(2, E))
    result = pipeline.run(ep, probe=None)
    # ``is ep`` also after a fallback: that it did not fall back is what says "nothing to do"
    assert result.program is ep and result.fallback is None, result.fallback


# --------------------------------------------------------------------------------------------
# The pass with a fake probe, and its guards


def test_pass_with_a_probe_that_takes_nothing_folds_nothing():
    ep = export(Split(), torch.randn(2, E))
    result = pipeline.run(ep, probe=lambda program, constants: set())
    assert result.program is ep and result.fallback is None, result.fallback
    assert {(r.status, r.rule) for r in result.operands} == {(Status.DECLINED, Rule.DELEGATED)}


def test_pass_with_a_probe_that_takes_everything_frees_the_packed_param():
    ep = export(Split(), torch.randn(2, E))
    result = pipeline.run(ep, probe=lambda program, constants: {c.name for c in constants})
    assert result.freed_params == ["weight"] and result.probe_rounds == 1
    assert {r.status for r in result.operands} == {Status.FOLDED}
    # The parts are not copies: each has a storage of exactly its bytes (what XNNPACK
    # serializes), cut out of the packed param's memory, which the caller's program still holds.
    packed = ep.state_dict["weight"]
    begin, row = packed.data_ptr(), E * packed.element_size()
    parts = [result.program.constants[c.name] for c in result.constants]
    assert [(p.data_ptr() - begin) // row for p in parts] == [0, E]
    assert all(p.untyped_storage().nbytes() == p.nbytes == E * row for p in parts)
    assert all(torch.equal(p, w) for p, w in zip(parts, packed.split(E)))


@pytest.mark.fallback_expected
def test_no_growth_guard():
    ep = export(Split("sum"), torch.randn(2, E))
    result = pipeline.run(ep, probe=None, rule_set=DEFAULT_RULES.without(Rule.SIZE))
    assert result.program is ep and "more than the input" in result.fallback


def test_strict_mode_raises_where_users_get_a_fallback(monkeypatch):
    ep = export(Split("sum"), torch.randn(2, E))
    set_strict(monkeypatch, True)
    with pytest.raises(StrictFallback, match="more than the input"):
        pipeline.run(ep, probe=None, rule_set=DEFAULT_RULES.without(Rule.SIZE))


def test_projection_match_takes_mha_layout_only():
    mha = nn.MultiheadAttention(E, 2, batch_first=True)

    class Self(nn.Module):
        def __init__(self):
            super().__init__()
            self.mha = mha

        def forward(self, x):
            return self.mha(x, x, x, need_weights=False)[0]

    facts = analysis.find_static(export(Self(), torch.randn(1, 3, E)))
    (site,) = projections.find_packed_projections(facts)
    assert (site.parts, site.width, sorted(site.selects)) == (3, E, [0, 1, 2])


def test_rule_split_undoes_a_projection_with_a_part_not_delegated():
    site = projections.PackedProjection("linear", 2, E, [], {0: "s0", 1: "s1"},
                                        part_linears={0: "part0", 1: "part1"})
    rows = {(p, role): GemmOperand(p, "linear", role, Status.FOLDED, delegated=True)
            for p in ("part0", "part1") for role in ("weight", "bias")}
    assert rules.split_kept(site, rows) is None
    rows[("part1", "bias")].delegated = False
    decline = rules.split_kept(site, rows)
    assert (decline.rule, decline.node) == (Rule.SPLIT, "part1")
    del rows[("part0", "weight")]
    assert "no weight operand" in rules.split_kept(site, rows).reason


# --------------------------------------------------------------------------------------------
# Names in the user's terms


class Named(nn.Module):
    """An MHA (split into per-part linears), a GEMM rewritten as linear, and one in the top
    level forward: every row names the module the GEMM came from."""

    def __init__(self):
        super().__init__()
        self.block = nn.ModuleDict({"attn": nn.MultiheadAttention(E, 2, batch_first=True)})
        self.head = Transposed()
        self.top = nn.Parameter(torch.randn(E, 4))

    def forward(self, x, memory):
        y = self.block["attn"](x, memory, memory, need_weights=False)[0]
        return self.head(y[0])[1] @ self.top.t()


def test_every_row_names_its_module_and_class():
    torch.manual_seed(0)
    ep = export(Named(), torch.randn(1, 2, E), torch.randn(1, 4, E))   # 2 rows: row_bias
    result = pipeline.run(ep, probe=lambda program, constants: {c.name for c in constants})
    modules = {row.gemm: row.module for row in result.operands}
    attention = [g for g, m in modules.items() if m == "block.attn (MultiheadAttention)"]
    heads = [g for g, m in modules.items() if m == "head (Transposed)"]
    top = [g for g, m in modules.items() if m == "<top level> (Named)"]
    # q (split part), k and v (split parts), out_proj; the head's five GEMMs (one rewritten as
    # linear); the top-level matmul
    assert (len(attention), len(heads), len(top)) == (4, 5, 1), modules
    assert any("_part" in g for g in attention) and result.of("canonical"), modules
    from xnnfold import format_explanation
    from xnnfold.explain import Explanation
    lines = format_explanation(Explanation.of(result)).splitlines()
    assert lines[0].split()[:2] == ["gemm", "module"], lines[0]
    assert all("block.attn (MultiheadAttention)" in line
               for line in lines[2:] if line.split()[0] in attention), lines


def test_the_fold_leaves_the_callers_random_generator_as_it_was(monkeypatch):
    """Whatever the pass draws (here: a step that draws on purpose) comes from a fork of the
    global generator: the caller's next random numbers are those it would have had."""
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(4, 4))

        def forward(self, x):
            return F.linear(x, self.w * 2.0)

    ep = torch.export.export(Scaled(), (torch.randn(2, 4),))
    real_run = pipeline.run

    def drawing_run(*args, **kwargs):
        torch.rand(8)
        return real_run(*args, **kwargs)

    monkeypatch.setattr(pipeline, "run", drawing_run)
    before = torch.get_rng_state()
    from xnnfold import fold_gemm_params
    result = fold_gemm_params(ep, config=Config(strict=True, verify_probe=False))
    assert result.fallback is None
    assert torch.equal(torch.get_rng_state(), before)


def test_probe_dims_take_only_numbers_as_bounds():
    # torch's int_oo (Dim.DYNAMIC's upper bound) says is_finite: the probe's Dim must not get it.
    import sympy
    from torch.utils._sympy.numbers import int_oo
    from torch.utils._sympy.value_ranges import ValueRanges
    from xnnfold.steps.fold.probe.program import _Dims

    symbol = sympy.Symbol("s0", integer=True, positive=True)
    dims = _Dims({symbol: ValueRanges(2, int_oo)})
    dim = dims._dim(symbol, "x")
    assert (dim.min, dim.max) == (2, torch.export.Dim("d").max)   # unbounded above
    bounded = _Dims({symbol: ValueRanges(3, 40)})._dim(symbol, "x")
    assert (bounded.min, bounded.max) == (3, 40)


def test_probe_dims_call_a_floor_division_unsupported():
    # A conv's output length under a dynamic input (s0 // 10): a known limit the whole-program
    # probe answers, not an internal failure.
    from types import SimpleNamespace

    import sympy
    from torch.utils._sympy.functions import FloorDiv
    from torch.utils._sympy.value_ranges import ValueRanges
    from xnnfold.steps.fold.probe.cut import ProbeUnsupported
    from xnnfold.steps.fold.probe.program import _Dims

    symbol = sympy.Symbol("s0", integer=True, positive=True)
    size = SimpleNamespace(node=SimpleNamespace(expr=FloorDiv(symbol, 10)))
    with pytest.raises(ProbeUnsupported, match="not a polynomial"):
        _Dims({symbol: ValueRanges(20, 4000)}).spec(size, "conv1d")
