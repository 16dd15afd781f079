"""Where the partitioner gives a step up after an internal failure (its own ShapeEnv for the
program, the partition's copy check): users get stock's behaviour and one warning; strict mode
(the tests) gets a StrictFallback. No lowering: the failing calls are patched in."""

from types import SimpleNamespace

import pytest
import torch

from conftest import set_strict
from xnnfold import partitioner, shape_env
from xnnfold.errors import StrictFallback

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
    set_strict(monkeypatch, False)
    graph, clone = _tagged_graph()
    result = SimpleNamespace(tagged_exported_program=SimpleNamespace(graph=graph),
                             partition_tags={"tag0": "spec"})
    partitioner._fix_passthrough(result)
    assert clone.meta[TAG] == "tag0" and result.partition_tags == {"tag0": "spec"}
    assert "could not check the partitions" in caplog.text and "boom" in caplog.text


def test_copy_check_failure_raises_in_strict_mode(monkeypatch, broken_untag):
    set_strict(monkeypatch, True)
    graph, clone = _tagged_graph()
    result = SimpleNamespace(tagged_exported_program=SimpleNamespace(graph=graph),
                             partition_tags={"tag0": "spec"})
    with pytest.raises(StrictFallback, match="could not check the partitions.*boom"):
        partitioner._fix_passthrough(result)
    assert clone.meta[TAG] == "tag0"          # restored before raising


@pytest.mark.parametrize("strict", [False, True], ids=["users", "strict"])
def test_own_shape_env_failure(monkeypatch, caplog, strict):
    set_strict(monkeypatch, strict)
    monkeypatch.setattr(shape_env, "needs_own_shape_env", lambda program: True)
    monkeypatch.setattr(shape_env, "give_own_shape_env", _broken)
    ep = torch.export.export(torch.nn.Linear(2, 2), (torch.randn(1, 2),))
    if strict:
        with pytest.raises(StrictFallback, match="own ShapeEnv.*boom"):
            shape_env.for_lowering(ep, ep)
    else:
        lowered = shape_env.for_lowering(ep, ep)
        assert "own ShapeEnv" in caplog.text
        # a copy of the program, as it was: the lowering would delete ep's delegated constants
        assert lowered is not ep and str(lowered.graph) == str(ep.graph)


# --------------------------------------------------------------------------------------------
# Every give-up of the pass goes through errors.warn_or_raise: a warning naming the node and
# the reason for users, a StrictFallback in strict mode. One test per path, in both modes.


def warnings_of(caplog) -> list:
    return [r.getMessage() for r in caplog.records if r.name == "xnnfold"]


MODES = pytest.mark.parametrize("strict", [False, True], ids=["users", "strict"])


class TwoAttentions(torch.nn.Module):
    def forward(self, q, k, v):
        first = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return torch.nn.functional.scaled_dot_product_attention(first, k, v, is_causal=True)


def two_attentions():
    gen = torch.Generator().manual_seed(0)
    inputs = tuple(torch.randn(1, 2, 4, 8, generator=gen) for _ in range(3))
    return torch.export.export(TwoAttentions(), inputs), inputs


@MODES
@pytest.mark.parametrize("where", ["why_kept", "rewrite_one"])
def test_attention_failure_keeps_that_node_only(monkeypatch, caplog, strict, where):
    from xnnfold.steps import attention
    from xnnfold.graph.program_copy import copy_program

    set_strict(monkeypatch, strict)
    original = getattr(attention.sdpa, where)

    def fails_on_causal(*args):
        node = args[-1]
        if node.kwargs.get("is_causal") or True in node.args[5:6]:
            if where == "rewrite_one":      # half way: some nodes emitted, then the failure
                args[0](torch.ops.aten.mul.Tensor, node.args[0], 2.0)
            raise RuntimeError("boom")
        return original(*args)

    monkeypatch.setattr(attention.sdpa, where, fails_on_causal)
    ep, inputs = two_attentions()
    copy = copy_program(ep)
    if strict:
        with pytest.raises(StrictFallback, match="attention 'scaled_dot_product_attention_1' "
                                                 "internal failure.*boom"):
            attention.rewrite_attention(copy)
        return
    records = attention.rewrite_attention(copy)
    assert [r.rewritten for r in records] == [True, False]
    assert "RuntimeError: boom" in records[1].kept_because
    assert [w for w in warnings_of(caplog) if "boom" in w] == [
        "xnnfold: attention 'scaled_dot_product_attention_1' internal failure, left as stock "
        "leaves it: RuntimeError: boom"]
    assert attention.SDPA in [n.target for n in copy.graph.nodes]    # the second, as it was
    copy.validate()
    torch.testing.assert_close(copy.module()(*inputs), TwoAttentions()(*inputs))


@MODES
def test_pipeline_failure_falls_back_to_stock(monkeypatch, caplog, strict):
    from xnnfold import pipeline
    from xnnfold.steps import canonical

    set_strict(monkeypatch, strict)
    monkeypatch.setattr(canonical, "canonicalize", _broken)
    ep, _ = two_attentions()
    if strict:
        with pytest.raises(StrictFallback, match="folding skipped at node '<program>': "
                                                 "RuntimeError: boom"):
            pipeline.run(ep, probe=None)
        return
    result = pipeline.run(ep, probe=None)
    assert result.program is ep and "boom" in result.fallback
    assert len([w for w in warnings_of(caplog) if "folding skipped" in w]) == 1


def _probe_with(fast_failure: Exception, verify: bool = False):
    from xnnfold.steps.fold.probe.verified import VerifiedProbe

    probe = VerifiedProbe(partitioner=None, verify=verify)

    def fast(program, constants):
        raise fast_failure

    probe.fast, probe.whole = fast, lambda program, constants: {"whole's answer"}
    return probe


@MODES
def test_fast_probe_failure_asks_the_whole_program(monkeypatch, caplog, strict):
    set_strict(monkeypatch, strict)
    ep, _ = two_attentions()
    probe = _probe_with(RuntimeError("boom"))
    if strict:
        with pytest.raises(StrictFallback, match="fast probe failed.*boom"):
            probe(ep, [])
        return
    assert probe(ep, []) == {"whole's answer"}
    assert any("fast probe failed" in w and "boom" in w for w in warnings_of(caplog))


def test_fast_probe_failure_under_verification_is_the_folds_failure(monkeypatch):
    set_strict(monkeypatch, False)
    ep, _ = two_attentions()
    with pytest.raises(RuntimeError, match="boom"):
        _probe_with(RuntimeError("boom"), verify=True)(ep, [])


@MODES
def test_fast_probe_known_limit_is_no_give_up(monkeypatch, caplog, strict):
    # An unbacked dim the fast probe cannot model: the whole-program probe, its reference,
    # answers exactly. A warning (it is slower), in both modes; nothing raises.
    from xnnfold.steps.fold.probe.cut import ProbeUnsupported

    set_strict(monkeypatch, strict)
    ep, _ = two_attentions()
    probe = _probe_with(ProbeUnsupported("x", "an unbacked dim"))
    assert probe(ep, []) == {"whole's answer"}
    assert any("cannot model node 'x'" in w for w in warnings_of(caplog))


@MODES
def test_passthrough_fix_that_cannot_apply_keeps_stocks_partition(monkeypatch, caplog, strict):
    # A known limit, not a failure: the fix would leave a partition reading an input in a
    # non-default dim order. The partition keeps stock's tags, with a warning, in both modes.
    from xnnfold import passthrough

    set_strict(monkeypatch, strict)
    graph, clone = _tagged_graph()

    def cannot(self, moved):
        del clone.meta[TAG]                     # half done, then the limit
        raise passthrough._CannotFix(clone)

    monkeypatch.setattr(passthrough._Partition, "next_untag", cannot)
    tags = {"tag0": "spec"}
    assert passthrough.untag_vanishing_copies(graph, tags) == []
    assert clone.meta[TAG] == "tag0" and tags == {"tag0": "spec"}
    assert any("non-default dim order" in w and "clone" in w for w in warnings_of(caplog))
