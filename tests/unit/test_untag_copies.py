"""xnnfold.passthrough on small Edge programs partitioned by the stock partitioner: which copies
are untagged so that no delegate returns a node twice or its own input. No lowering."""

import pytest
import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import EdgeCompileConfig, to_edge

from xnnfold.passthrough import TAG, untag_vanishing_copies

CHANNELS_LAST = torch.channels_last


def partitioned(fn, *inputs, dynamic_shapes=None, preserve=()):
    """The Edge graph of ``fn`` tagged by the stock partitioner, and its partition tags.
    ``preserve``: ops kept whole, as ``to_edge_transform_and_lower`` keeps what XNNPACK takes."""
    class Module(torch.nn.Module):
        def forward(self, *args):
            return fn(*args)

    ep = torch.export.export(Module(), inputs, dynamic_shapes=dynamic_shapes)
    config = EdgeCompileConfig(_core_aten_ops_exception_list=list(preserve),
                               preserve_ops=list(preserve))
    result = XnnpackPartitioner().partition(to_edge(ep, compile_config=config)
                                            .exported_program())
    return result.tagged_exported_program.graph, dict(result.partition_tags)


def tags(graph):
    return {n.name: n.meta.get(TAG) for n in graph.nodes if n.op == "call_function"}


def test_a_value_and_its_clone_both_returned_untag_the_clone():
    graph, partition_tags = partitioned(_value_and_clone, torch.randn(2, 3))
    before = tags(graph)
    # stock takes the add and the clone
    assert before["aten_add_tensor"] and before["dim_order_ops__clone_dim_order_default"]
    untagged = untag_vanishing_copies(graph, partition_tags)
    assert [n.name for n in untagged] == ["dim_order_ops__clone_dim_order_default"]
    after = tags(graph)
    assert after["aten_add_tensor"] == before["aten_add_tensor"]
    assert after["dim_order_ops__clone_dim_order_default"] is None
    assert set(partition_tags) == {before["aten_add_tensor"]}


def _value_and_clone(x):
    y = x + 1
    return y, y.clone()


def test_two_clones_of_one_value_untag_both_and_keep_the_value():
    graph, partition_tags = partitioned(lambda x: _two_clones(x), torch.randn(2, 3))
    untagged = {n.name for n in untag_vanishing_copies(graph, partition_tags)}
    assert len(untagged) == 2 and all("clone" in name for name in untagged)
    assert tags(graph)["aten_mul_tensor"] is not None


def _two_clones(x):
    y = x * 3
    return y.clone(), y.clone()


def test_a_memory_format_round_trip_of_an_input_leaves_the_delegate_entirely():
    graph, partition_tags = partitioned(
        lambda x: x.to(memory_format=CHANNELS_LAST).to(memory_format=torch.contiguous_format),
        torch.randn(1, 3, 4, 4))
    assert len(partition_tags) == 1
    untagged = untag_vanishing_copies(graph, partition_tags)
    assert len(untagged) == 2
    assert partition_tags == {}          # no delegate with zero nodes
    assert not any(tags(graph).values())


def test_a_round_trip_of_a_computed_value_untags_the_copy_back():
    graph, partition_tags = partitioned(
        lambda x: ((y := x * 2).to(memory_format=CHANNELS_LAST)
                   .to(memory_format=torch.contiguous_format), y),
        torch.randn(1, 3, 4, 4))
    copies = [n.name for n in graph.nodes if n.meta.get(TAG) and "to_dim_order_copy" in n.name]
    assert len(copies) == 2
    untagged = untag_vanishing_copies(graph, partition_tags)
    # the copy back leaves; the copy into channels-last is then an output that stays
    assert [n.name for n in untagged] == copies[1:]
    assert tags(graph)["aten_mul_tensor"] is not None and tags(graph)[copies[0]] is not None


@pytest.mark.parametrize("fn", [
    # a clone read inside the delegate only: the delegate returns what reads it
    pytest.param(lambda x: (x + 1).clone() * 2, id="clone read inside"),
    # a clone from a delegate input to its output: preprocess keeps it
    pytest.param(lambda x: (x.clone(), x * 2), id="input to output"),
    # a copy into channels-last that is an output and not a round trip
    pytest.param(lambda x: ((x * 2).to(memory_format=CHANNELS_LAST), x + 1), id="one-way copy"),
])
def test_copies_preprocess_keeps_or_that_harm_nothing_stay_tagged(fn):
    graph, partition_tags = partitioned(fn, torch.randn(1, 3, 4, 4))
    before, tags_before = tags(graph), dict(partition_tags)
    assert untag_vanishing_copies(graph, partition_tags) == []
    assert tags(graph) == before and partition_tags == tags_before


def test_a_clone_also_read_inside_splits_off_what_reads_it():
    graph, partition_tags = partitioned(_clone_read_inside_and_out, torch.randn(2, 3))
    before = tags(graph)
    clone = "dim_order_ops__clone_dim_order_default"
    assert before["aten_mul_tensor"] == before[clone] == before["aten_add_tensor"]
    assert [n.name for n in untag_vanishing_copies(graph, partition_tags)] == [clone]
    after = tags(graph)
    # the add keeps its partition, the mul that reads the clone gets one of its own
    assert after[clone] is None
    assert after["aten_add_tensor"] == before["aten_add_tensor"]
    assert after["aten_mul_tensor"] not in (None, after["aten_add_tensor"])
    assert set(partition_tags) == {after["aten_add_tensor"], after["aten_mul_tensor"]}


def _clone_read_inside_and_out(x):
    y = x + 1
    c = y.clone()
    return y, c, c * 2


def test_a_stock_partition_reading_a_channels_last_copy_keeps_its_tags():
    # executorch's test_to_copy: int16 -> float32 channels-last (a copy XNNPACK leaves outside)
    # -> linear. The delegate reads the copy in its channels-last order, which preprocess
    # takes: nothing here was moved out by the fix, so nothing is its to untag. (Untagging the
    # linear left an aten.linear neither decomposed nor delegated: the lowering raised.)
    torch.manual_seed(0)
    weight = torch.randn(3, 3)
    graph, partition_tags = partitioned(
        lambda x: torch.nn.functional.linear(
            x.to(torch.float, memory_format=CHANNELS_LAST), weight),
        torch.randint(0, 10, (1, 3, 3, 3), dtype=torch.int16),
        preserve=[torch.ops.aten.linear.default])
    before, tags_before = tags(graph), dict(partition_tags)
    assert before["aten_linear_default"] is not None
    assert before["dim_order_ops__to_dim_order_copy_default"] is None
    assert untag_vanishing_copies(graph, partition_tags) == []
    assert tags(graph) == before and partition_tags == tags_before
