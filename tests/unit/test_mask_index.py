"""The mask_index step on small exported graphs, without lowering: ``x[torch.where(mask)]``
(and ``= v``) indexed by the mask itself, the ``where`` removed when nothing else reads it; the
rewritten program, run as a module, equals eager, validates and round-trips."""

import pytest
import torch
from torch import nn

from xnnfold import pipeline
from xnnfold.explain import Explanation, format_explanation
from xnnfold.steps import mask_index
from xnnfold.graph.program_copy import copy_program

from conftest import round_trip

WHERE_OPS = {torch.ops.aten.where.default, torch.ops.aten.nonzero_numpy.default,
             torch.ops.aten.nonzero.default}


class FullRowsOff(nn.Module):
    """OneFormer's line: rows of a bool mask that block every key are let through."""

    def forward(self, x):
        mask = x > 0
        mask[torch.where(mask.sum(-1) == mask.shape[-1])] = False
        return mask.float()


class NonzeroTuple(nn.Module):
    def forward(self, x):
        y = x.clone()
        y[(x.sum(-1) > 0).nonzero(as_tuple=True)] = 0.5
        return y


class Read(nn.Module):
    def forward(self, x):
        return x[torch.where(x.sum(-1) > 0)] * 2


class FunctionalPut(nn.Module):
    def forward(self, x):
        return torch.index_put(x, torch.where(x[..., 0] > 0), torch.tensor(-1.0))


class OneMaskTwoUses(nn.Module):
    def forward(self, x):
        where = torch.where(x.sum(-1) > 0)
        y = x.clone()
        y[where] = 0.0
        return y, x[where]


def inputs():
    x = torch.randn(2, 5, 3, generator=torch.Generator().manual_seed(0))
    x[0, 1] = 1.0                  # a full row, for FullRowsOff
    x[1, 3] = 1.0
    return (x,)


def rewritten(module, args):
    ep = torch.export.export(module.eval(), args)
    copy = copy_program(ep)
    return ep, copy, mask_index.rewrite_mask_indexing(copy)


def targets(program):
    return {n.target for n in program.graph.nodes if n.op == "call_function"}


@pytest.mark.parametrize("module", [FullRowsOff, NonzeroTuple, Read, FunctionalPut,
                                    OneMaskTwoUses])
def test_indexing_by_the_mask_computes_what_eager_computes(module):
    args = inputs()
    ep, copy, records = rewritten(module(), args)
    assert records and all(r.where_removed for r in records), records
    assert not WHERE_OPS & targets(copy), "a where / nonzero is left"
    copy.validate()
    expected = module()(*args)
    for program in (copy, round_trip(copy)):
        torch.testing.assert_close(program.module()(*args), expected)
    assert WHERE_OPS & targets(ep), "the caller's program was rewritten"


def test_the_removed_wheres_size_leaves_the_range_constraints():
    _, copy, _ = rewritten(FullRowsOff(), inputs())
    assert copy.range_constraints == {}


class WhereAlsoRead(nn.Module):
    """The indices are also used as values: the where stays, the indexing still rewritten."""

    def forward(self, x):
        rows, cols = torch.where(x.sum(-1) > 0)
        y = x.clone()
        y[rows, cols] = 0.0
        return y, rows * 10 + cols


def test_a_where_read_elsewhere_stays():
    args = inputs()
    _, copy, records = rewritten(WhereAlsoRead(), args)
    assert [r.where_removed for r in records] == [False]
    assert torch.ops.aten.where.default in targets(copy)
    for got, expected in zip(copy.module()(*args), WhereAlsoRead()(*args)):
        torch.testing.assert_close(got, expected)


class ShorterMask(nn.Module):
    """The mask's shape is not x's leading dims: its indices are not the mask's elements."""

    def forward(self, x):
        y = x.clone()
        y[torch.where(x[:, 0] > 0)] = 0.0       # a (2, 3) mask on a (2, 5, 3) tensor
        return y


class Accumulate(nn.Module):
    def forward(self, x):
        return torch.index_put(x, torch.where(x[..., 0] > 0), torch.tensor(1.0),
                               accumulate=True)


class FloatCondition(nn.Module):
    def forward(self, x):
        y = x.clone()
        y[torch.where(x[..., 0].relu())] = 0.0   # where of a float tensor: its nonzeros
        return y


class PartOfTheIndices(nn.Module):
    def forward(self, x):
        rows, cols = torch.where(x.sum(-1) > 0)
        return x[rows]


@pytest.mark.parametrize("module", [ShorterMask, Accumulate, FloatCondition, PartOfTheIndices])
def test_what_the_mask_does_not_index_exactly_is_left_alone(module):
    _, copy, records = rewritten(module(), inputs())
    assert records == []
    assert WHERE_OPS & targets(copy)


def test_the_shape_rule_is_what_keeps_a_shorter_mask_out(monkeypatch):
    # Without the shape check the rewrite would index (2, 5, 3) by a (2, 3) mask: torch raises.
    monkeypatch.setattr(mask_index, "statically_known_true", lambda condition: True)
    args = inputs()
    _, copy, records = rewritten(ShorterMask(), args)
    assert records
    with pytest.raises(Exception, match="shape of the mask"):
        copy.module()(*args)


def test_the_pass_reports_the_rewrite_and_returns_a_new_program():
    ep = torch.export.export(FullRowsOff(), inputs())
    result = pipeline.run(ep, probe=None)
    assert result.modified and result.fallback is None
    assert [r.node for r in result.of("mask_index")] == ["index_put_"]
    text = format_explanation(Explanation.of(result))
    assert "mask_index step: index_put_ indexed by the bool mask eq instead of where(eq); " \
           "its where (nonzero) removed" in text


def test_a_program_freed_of_its_unbacked_sizes_still_needs_its_own_shape_env():
    # It shares the caller's ShapeEnv, where a lowering of the caller's program (stock's, in
    # the tests: first) leaves unbound symbols that make the next decomposition raise.
    from xnnfold.shape_env import has_unbacked_symbols, needs_own_shape_env

    _, copy, _ = rewritten(FullRowsOff(), inputs())
    assert not has_unbacked_symbols(copy) and needs_own_shape_env(copy)
    plain = torch.export.export(nn.Linear(3, 3), (torch.randn(2, 3),))
    assert not needs_own_shape_env(plain)
