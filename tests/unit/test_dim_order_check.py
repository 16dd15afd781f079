"""xnnfold.dim_order on small Edge programs (``to_edge``, no lowering): which ops the runtime
will refuse or misread for the dim orders of their tensors, and the partitioner's warning."""

import functools
import random
from types import SimpleNamespace

import pytest
import torch
from executorch.exir import to_edge
from executorch.exir.dialects._ops import ops as exir_ops
from executorch.exir.tensor import dim_order_from_stride

from conftest import set_strict
from xnnfold import dim_order
from xnnfold.errors import StrictFallback
from xnnfold.graph.program_copy import copy_program
from xnnfold.steps.mask_index import rewrite_mask_indexing

exir_where = exir_ops.edge.aten.where.self


def edge_graph(fn, *inputs, rewrite=False):
    class Module(torch.nn.Module):
        def forward(self, *args):
            return fn(*args)

    ep = torch.export.export(Module(), inputs)
    if rewrite:
        ep = copy_program(ep)
        rewrite_mask_indexing(ep)
    return to_edge(ep).exported_program().graph


def conflicts(graph, delegated=lambda node: False):
    return [(c.op, c.misread) for c in dim_order.dim_order_conflicts(graph, delegated)]


def full_rows_off(x):
    mask = x > 0
    mask[torch.where(mask.sum(-1) == mask.shape[-1])] = False
    return mask.float()


X = torch.randn(2, 5, 3)


@functools.cache
def full_rows_graph():
    """The Edge graph of ``full_rows_off``, built once (the check only reads it)."""
    return edge_graph(full_rows_off, X)


def test_nonzero_and_the_slices_reading_it_are_named():
    found = conflicts(full_rows_graph())
    assert found == [("aten::nonzero", True), ("aten::slice_copy.Tensor", False),
                     ("aten::slice_copy.Tensor", False)], found


def test_with_the_where_rewritten_nothing_is_left():
    assert conflicts(edge_graph(full_rows_off, X, rewrite=True)) == []


def test_a_returned_nonzero_is_named_as_misread():
    assert conflicts(edge_graph(lambda x: (x > 0).nonzero(), X)) == [("aten::nonzero", True)]


CHANNELS_LAST = torch.channels_last
IMAGE = torch.randn(1, 3, 4, 5)


def test_a_checked_kernel_given_a_channels_last_value_is_named():
    found = conflicts(edge_graph(
        lambda x: torch.cumsum(x.to(memory_format=CHANNELS_LAST), 1), IMAGE))
    assert found == [("aten::cumsum", False)]


def test_kernels_that_take_mixed_orders_are_not_named():
    # mean's kernel ran right with a channels-last input and a contiguous output: not listed
    assert conflicts(edge_graph(
        lambda x: x.to(memory_format=CHANNELS_LAST).mean(1, keepdim=True), IMAGE)) == []


def test_one_dim_order_everywhere_is_no_conflict():
    def channels_last_where(x):
        x = x.to(memory_format=CHANNELS_LAST)
        return torch.where(x > 0, x, x * 2)      # where.self: listed, all channels-last

    graph = edge_graph(channels_last_where, IMAGE)
    assert exir_where in {n.target for n in graph.nodes}
    assert conflicts(graph) == []


def test_delegated_nodes_are_not_asked():
    assert conflicts(full_rows_graph(), delegated=lambda node: True) == []


def test_the_dim_order_is_the_emitters():
    rng = random.Random(0)
    for _ in range(300):
        rank = rng.randint(2, 5)
        shape = [rng.choice([1, 1, 2, 3]) for _ in range(rank)]
        tensor = torch.empty(shape).permute(rng.sample(range(rank), rank))
        assert dim_order._order(tensor) == tuple(dim_order_from_stride(tensor.stride()))


# --------------------------------------------------------------------------------------------
# The partitioner: a warning naming each node (a property of the program, stock's lowering has
# it too: no StrictFallback); a failure of the check itself is a give-up (warn_or_raise).


def _result(graph):
    return SimpleNamespace(tagged_exported_program=SimpleNamespace(graph=graph))


@pytest.mark.parametrize("strict", [False, True], ids=["users", "strict"])
def test_partitioner_warns_naming_each_node(monkeypatch, caplog, strict):
    set_strict(monkeypatch, strict)
    found = dim_order.warn_of_conflicts(_result(full_rows_graph()))
    assert [c.node for c in found] == ["aten_nonzero_default", "aten_slice_copy_tensor",
                                       "aten_slice_copy_tensor_1"]
    (message,) = [r.getMessage() for r in caplog.records if r.name == "xnnfold"]
    assert message.startswith("xnnfold: the ExecuTorch runtime will refuse 3 op(s)")
    assert all(c.node in message for c in found)


@pytest.mark.parametrize("strict", [False, True], ids=["users", "strict"])
def test_a_failing_check_is_a_give_up(monkeypatch, caplog, strict):
    set_strict(monkeypatch, strict)

    def broken(graph, delegated):
        raise RuntimeError("boom")

    monkeypatch.setattr(dim_order, "dim_order_conflicts", broken)
    graph = torch.fx.Graph()
    if strict:
        with pytest.raises(StrictFallback, match="could not check the dim orders.*boom"):
            dim_order.warn_of_conflicts(_result(graph))
        return
    assert dim_order.warn_of_conflicts(_result(graph)) == []
    assert any("could not check the dim orders" in r.getMessage() for r in caplog.records)
