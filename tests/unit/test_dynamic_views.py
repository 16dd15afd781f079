"""The dynamic_views step on small exported graphs of a dynamic length, without lowering: its
views and reshapes with the length in their shape written with -1, the program equal to eager
for every length; the views it leaves, and why."""

import pytest
import torch
from torch import nn

from xnnfold.graph.program_copy import copy_program
from xnnfold.pte.compare import compare_outputs
from xnnfold.steps import dynamic_views

from test_dynamic_length import Heads

aten = torch.ops.aten


def exported(module, width=8):
    torch.manual_seed(0)
    length = torch.export.Dim("length", min=1, max=16)
    return torch.export.export(module.eval(), (torch.randn(1, 3, width),),
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
    for length in (1, 5, 16):
        x = torch.randn(1, length, 8)
        assert compare_outputs(program.module()(x), module(x)).ok
    # the caller's program keeps its own shapes
    assert any(not isinstance(d, int) for n in views(ep) for d in n.args[1])


def test_strided_source_fails_without_the_copy():
    """The reshape of the transposed heads read by a view alone: not a valid view."""
    program = copy_program(exported(Heads()))
    dynamic_views.rewrite_dynamic_views(program)
    copies = [n for n in program.graph.nodes if n.target is aten.clone.default]
    assert len(copies) == 1
    copies[0].replace_all_uses_with(copies[0].args[0])
    program.graph.erase_node(copies[0])
    program.graph_module.recompile()
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        program.module()(torch.randn(1, 5, 8))


def test_two_dynamic_sizes_are_left():
    """[B, T, 8] viewed [B, T, 2, 4] with B and T dynamic: XNNPACK infers one size only."""
    class TwoDims(nn.Module):
        def forward(self, x):
            return x.view(x.shape[0], x.shape[1], 2, 4) * 2.0

    torch.manual_seed(0)
    dims = {0: torch.export.Dim("batch", min=1, max=4), 1: torch.export.Dim("len", min=1, max=8)}
    ep = torch.export.export(TwoDims(), (torch.randn(2, 3, 8),), dynamic_shapes=({**dims},))
    assert dynamic_views.rewrite_dynamic_views(copy_program(ep)) == []


class Empty(nn.Module):
    """A view with a static 0 beside the dynamic length: -1 there fits any size."""

    def forward(self, x):
        return x.reshape(1, x.shape[1], 0) + 1.0


def test_static_zero_is_left():
    ep = exported(Empty(), width=0)
    program = copy_program(ep)
    assert dynamic_views.rewrite_dynamic_views(program) == []
    assert program.module()(torch.randn(1, 4, 0)).shape == (1, 4, 0)


def test_static_zero_fails_without_the_rule(monkeypatch):
    original = dynamic_views.inferred_shape

    def without_rule(node):
        out = node.meta.get("val")
        if node.target is aten.reshape.default and out is not None and 0 in out.shape:
            return [1, -1, 0]
        return original(node)

    monkeypatch.setattr(dynamic_views, "inferred_shape", without_rule)
    program = copy_program(exported(Empty(), width=0))
    assert dynamic_views.rewrite_dynamic_views(program)
    with pytest.raises(RuntimeError, match="unspecified dimension size -1 can be any value"):
        program.module()(torch.randn(1, 4, 0))


def test_a_view_written_in_place_is_left():
    """A reshape aliases its source: a write in place through it must reach the source."""
    class WrittenThrough(nn.Module):
        def forward(self, x):
            y = x * 1.0
            flat = y.reshape(1, -1)
            flat.add_(1.0)
            return y

    ep = exported(WrittenThrough(), width=8)
    program = copy_program(ep)
    assert dynamic_views.rewrite_dynamic_views(program) == []
