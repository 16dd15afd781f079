"""Where the partitioner gives a step up after an internal failure (its own ShapeEnv for the
program, the partition's copy check): users get stock's behaviour and one warning; strict mode
(the tests) gets a StrictFallback. No lowering: the failing calls are patched in."""

from types import SimpleNamespace

import pytest
import torch

from xnnfold import partitioner
from xnnfold.errors import STRICT_ENV, StrictFallback

TAG = "delegation_tag"


def _tagged_graph():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    y = graph.call_function(torch.ops.aten.clone.default, (x,))
    graph.output(y)
    y.meta[TAG] = "tag0"
    return graph, y


def _broken(*args):
    raise RuntimeError("boom")


@pytest.fixture
def broken_untag(monkeypatch):
    def untag_then_fail(graph, tags):
        for node in graph.nodes:              # half done: a tag changed, then a failure
            node.meta.pop(TAG, None)
        tags.clear()
        raise RuntimeError("boom")

    monkeypatch.setattr(partitioner, "untag_vanishing_copies", untag_then_fail)


def test_copy_check_failure_keeps_stocks_partition_and_warns(monkeypatch, broken_untag, caplog):
    monkeypatch.delenv(STRICT_ENV, raising=False)
    graph, clone = _tagged_graph()
    result = SimpleNamespace(tagged_exported_program=SimpleNamespace(graph=graph),
                             partition_tags={"tag0": "spec"})
    partitioner._fix_passthrough(result)
    assert clone.meta[TAG] == "tag0" and result.partition_tags == {"tag0": "spec"}
    assert "could not check the partitions" in caplog.text and "boom" in caplog.text


def test_copy_check_failure_raises_in_strict_mode(monkeypatch, broken_untag):
    monkeypatch.setenv(STRICT_ENV, "1")
    graph, clone = _tagged_graph()
    result = SimpleNamespace(tagged_exported_program=SimpleNamespace(graph=graph),
                             partition_tags={"tag0": "spec"})
    with pytest.raises(StrictFallback, match="could not check the partitions.*boom"):
        partitioner._fix_passthrough(result)
    assert clone.meta[TAG] == "tag0"          # restored before raising


@pytest.mark.parametrize("strict", [False, True], ids=["users", "strict"])
def test_own_shape_env_failure(monkeypatch, caplog, strict):
    if strict:
        monkeypatch.setenv(STRICT_ENV, "1")
    else:
        monkeypatch.delenv(STRICT_ENV, raising=False)
    monkeypatch.setattr(partitioner, "has_unbacked_symbols", lambda program: True)
    monkeypatch.setattr(partitioner, "give_own_shape_env", _broken)
    folded = object()
    result = SimpleNamespace(program=folded)
    if strict:
        with pytest.raises(StrictFallback, match="own ShapeEnv.*boom"):
            partitioner._isolate(object(), result)
    else:
        partitioner._isolate(object(), result)
        assert "own ShapeEnv" in caplog.text
    assert result.program is folded           # the program to lower is the folded one
