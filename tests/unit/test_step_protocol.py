"""The pass is a list of steps (xnnfold.steps.protocol): a new step is a module and an entry in
the list, and what it rewrites survives; the pass's reliance on executorch's internals fails
loudly when they change."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import pytest
import torch

import xnnfold
from conftest import set_strict
from xnnfold import pipeline
from xnnfold.explain import Explanation
from xnnfold.errors import StrictFallback
from xnnfold.steps.protocol import Outcome, Record
from xnnfold.steps.runtime_weight import config as runtime_weight_config

aten = torch.ops.aten


class Double(torch.nn.Module):
    def forward(self, x):
        return x * 2.0


@dataclass(frozen=True)
class Doubled:
    node: str
    rewritten: bool

    def describe(self) -> str:
        return f"double step: {self.node} as x + x"


class DoubleStep:
    """A step of the tests': ``x * 2.0`` as ``x + x`` (exact in fp32). ``honest=False``: it
    rewrites and says it did not."""

    name = "double"

    def __init__(self, honest: bool = True):
        self.honest = honest

    def run(self, program, context) -> Outcome:
        records = []
        for node in list(program.graph.nodes):
            if node.target is aten.mul.Tensor and node.args[1] == 2.0:
                node.target, node.args = aten.add.Tensor, (node.args[0], node.args[0])
                records.append(Doubled(node.name, rewritten=self.honest))
        program.graph_module.recompile()
        return Outcome(records)


def _program():
    return torch.export.export(Double(), (torch.randn(3, 4),))


def test_every_step_is_a_module_exposing_one_step_object_of_a_unique_name():
    names = [step.name for step in pipeline.STEPS]
    assert len(set(names)) == len(names), names
    for step in pipeline.STEPS:
        module = importlib.import_module(type(step).__module__)
        assert module.STEP is step, (step.name, module.__name__)
        assert callable(step.run)


def test_a_new_steps_rewrite_survives_and_explain_names_it():
    ep = _program()
    result = pipeline.run(ep, probe=None, steps=pipeline.STEPS + (DoubleStep(),))
    assert result.fallback is None and result.modified and result.program is not ep
    (record,) = result.of("double")
    assert isinstance(record, Record) and record.rewritten
    targets = [n.target for n in result.program.graph.nodes if n.op == "call_function"]
    assert targets == [aten.add.Tensor], targets
    assert [n.target for n in ep.graph.nodes if n.op == "call_function"] == [aten.mul.Tensor]
    x = torch.randn(3, 4)
    assert torch.equal(result.program.module()(x), Double()(x))
    text = xnnfold.format_explanation(Explanation.of(result))
    assert "double step: mul as x + x" in text, text


def test_a_rewrite_no_record_owns_is_not_returned():
    """The caller's program comes back when no record says it rewrote: a step that changes
    the program without saying so is thrown away, never shipped unexplained."""
    ep = _program()
    result = pipeline.run(ep, probe=None, steps=pipeline.STEPS + (DoubleStep(honest=False),))
    assert result.program is ep and not result.modified
    assert [r.rewritten for r in result.of("double")] == [False]


def test_executorchs_partitioner_has_what_the_runtime_weight_path_wraps():
    """xnnfold wraps executorch 1.5.1's GEMM configs (``_get_weight_deps``,
    ``_get_bias_deps`` per target): this fails, naming what is gone, when executorch changes
    them."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    assert runtime_weight_config.missing_internals(XnnpackPartitioner()) == []
    wrapped = xnnfold.XnnpackPartitioner().target_partitioner_configs["linear.default"]
    assert type(wrapped).__name__.startswith("RuntimeWeight")


class _Renamed:
    """A partitioner of an executorch whose configs moved."""

    target_partitioner_configs = {"linear.default": object()}


def test_missing_internals_are_named():
    missing = runtime_weight_config.missing_internals(_Renamed())
    assert "object._get_weight_deps" in missing and "a partitioner config for mm.default" in missing


@pytest.mark.parametrize("strict", [False, True], ids=["users", "strict"])
def test_a_path_that_cannot_open_is_said_and_its_step_left_out(monkeypatch, caplog, strict):
    set_strict(monkeypatch, strict)
    monkeypatch.setattr(runtime_weight_config, "missing_internals",
                        lambda partitioner: ["XnnpackPartitioner.target_partitioner_configs"])
    if strict:
        with pytest.raises(StrictFallback, match="run-time weights are off"):
            xnnfold.XnnpackPartitioner()
        return
    partitioner = xnnfold.XnnpackPartitioner()
    assert "run-time weights are off" in caplog.text
    assert "runtime_weight" not in [s.name for s in partitioner.fold.steps]
