"""The dynamic_views step on small exported graphs of a dynamic length, without lowering: its
views and reshapes with the length in their shape written with -1, the program equal to eager
for every length; the views it leaves, and why."""

import torch
from torch import nn

from xnnfold.graph.program_copy import copy_program
from xnnfold.graph.values import at_least_one
from xnnfold.pte.compare import compare_outputs
from xnnfold.steps import dynamic_views

from test_dynamic_length import Heads

aten = torch.ops.aten


def exported(module, low=1):
    torch.manual_seed(0)
    length = torch.export.Dim("length", min=low, max=16)
    return torch.export.export(module.eval(), (torch.randn(1, 3, 8),),
                               dynamic_shapes=({1: length},))


def views(program) -> list:
    return [n for n in program.graph.nodes
            if n.target in (aten.view.default, aten.reshape.default, aten._unsafe_view.default)]


def test_views_written_with_minus_one_and_equal_to_eager():
    module = Heads()
    ep = exported(module)
    program = copy_program(ep)
    (record,) = dynamic_views.rewrite_dynamic_views(program)
    assert record.rewritten and len(record.views) == 2
    assert record.describe().startswith("dynamic_views step: 2 views of a dynamic length")
    assert [list(n.args[1]) for n in views(program)] == [[1, -1, 2, 4], [1, -1, 8]]
    assert all(n.target is aten.view.default for n in views(program))
    # the reshape of a transposed tensor reads a contiguous copy (a view needs one)
    assert any(n.target is aten.clone.default for n in program.graph.nodes)
    for length in (1, 5, 16):
        x = torch.randn(1, length, 8)
        assert compare_outputs(program.module()(x), module(x)).ok
    # the caller's program keeps its own shapes
    assert any(not isinstance(d, int) for n in views(ep) for d in n.args[1])


def test_two_dynamic_sizes_are_left():
    """[B, T, 8] viewed [B, T, 2, 4] with B and T dynamic: XNNPACK infers one size only."""
    class TwoDims(nn.Module):
        def forward(self, x):
            return x.view(x.shape[0], x.shape[1], 2, 4) * 2.0

    torch.manual_seed(0)
    dims = {0: torch.export.Dim("batch", min=1, max=4), 1: torch.export.Dim("len", min=1, max=8)}
    ep = torch.export.export(TwoDims(), (torch.randn(2, 3, 8),), dynamic_shapes=({**dims},))
    program = copy_program(ep)
    assert dynamic_views.rewrite_dynamic_views(program) == []


def test_a_size_that_may_be_zero_is_left():
    """An inferred size is ambiguous for an empty tensor: only sizes proven at least 1."""
    shape_env = torch.fx.experimental.symbolic_shapes.ShapeEnv()
    maybe_empty = shape_env.create_unbacked_symint()
    assert not at_least_one(maybe_empty)
    assert at_least_one(3) and not at_least_one(0)
    ep = exported(Heads())
    length = next(n for n in ep.graph.nodes if n.op == "placeholder" and
                  n.name == "x").meta["val"].shape[1]
    assert at_least_one(length)
