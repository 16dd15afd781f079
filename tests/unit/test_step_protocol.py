"""The pass is a list of steps (xnnfold.steps.protocol): a new step is a module and an entry in
the list, and what it rewrites survives; the graph holds each step to its records (a change no
record reports is a failure of the pass, beside any other step's rewrite); the pipeline tidies
after a rewrite; the partitioner asks each step what it opens; the pass's reliance on
executorch's internals fails loudly when they change."""

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
from xnnfold.graph.program_copy import copy_program
from xnnfold.graph.validity import tidy
from xnnfold.steps import configs as step_configs, gelu_tanh, kv_cache, runtime_weight
from xnnfold.steps.protocol import Opening, Outcome, Record
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
    """A step of the tests': ``x * 2.0`` as ``x + x`` (exact in fp32), in place and nothing
    else (the pipeline recompiles). ``honest=False``: it rewrites and says it did not."""

    name = "double"

    def __init__(self, honest: bool = True):
        self.honest = honest

    def run(self, program, context) -> Outcome:
        records = []
        for node in list(program.graph.nodes):
            if node.target is aten.mul.Tensor and node.args[1] == 2.0:
                node.target, node.args = aten.add.Tensor, (node.args[0], node.args[0])
                records.append(Doubled(node.name, rewritten=self.honest))
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


class GeluAndDouble(torch.nn.Module):
    """A tanh GELU (the gelu_tanh step rewrites it) beside ``x * 2.0``."""

    def forward(self, x):
        return torch.nn.functional.gelu(x, approximate="tanh") + x * 2.0


@pytest.mark.parametrize("strict", [False, True], ids=["users", "strict"])
def test_a_silent_change_beside_a_rewrite_is_caught(monkeypatch, xnnfold_log, strict):
    """A step that changes the program and reports no rewrite, after one that rewrote: its
    change would ship unexplained. The pass falls back to the caller's program with one
    warning naming the step (strict mode: it raises)."""
    set_strict(monkeypatch, strict)
    ep = torch.export.export(GeluAndDouble(), (torch.randn(3, 4),))
    steps = (gelu_tanh.STEP, DoubleStep(honest=False))
    if strict:
        with pytest.raises(StrictFallback, match="the double step changed the program"):
            pipeline.run(ep, probe=None, steps=steps)
        return
    result = pipeline.run(ep, probe=None, steps=steps)
    assert result.program is ep and result.fallback is not None, result.fallback
    warnings = [r.getMessage() for r in xnnfold_log.records]
    assert len(warnings) == 1 and "the double step changed the program (node mul" in \
        warnings[0], warnings
    assert [n.target for n in ep.graph.nodes if n.op == "call_function"].count(aten.mul.Tensor) \
        == 1, "the caller's program untouched"


class Claims:
    """A step of the tests' that says it rewrote ``node`` and changes nothing."""

    name = "claims"

    def run(self, program, context) -> Outcome:
        return Outcome([Doubled("mul", rewritten=True)])


@pytest.mark.parametrize("strict", [False, True], ids=["users", "strict"])
def test_a_record_of_a_rewrite_that_changed_nothing_is_said(monkeypatch, xnnfold_log, strict):
    """A record claiming a rewrite the program does not have misreports only itself: a
    warning naming the step, the other steps' rewrites kept (strict mode: it raises)."""
    set_strict(monkeypatch, strict)
    ep = torch.export.export(GeluAndDouble(), (torch.randn(3, 4),))
    steps = (gelu_tanh.STEP, Claims())
    if strict:
        with pytest.raises(StrictFallback, match="the claims step says it rewrote"):
            pipeline.run(ep, probe=None, steps=steps)
        return
    result = pipeline.run(ep, probe=None, steps=steps)
    assert result.fallback is None and result.of("gelu_tanh")[0].rewritten
    assert not any(n.target is aten.gelu.default for n in result.program.graph.nodes)
    assert "the claims step says it rewrote" in xnnfold_log.text


class Replace:
    """A step of the tests' that replaces ``x * 2.0`` by a new ``x + x`` node and leaves the
    mul, now dead, in the graph: no erase, no recompile, no output specs."""

    name = "replace"

    def run(self, program, context) -> Outcome:
        (mul,) = [n for n in program.graph.nodes if n.target is aten.mul.Tensor]
        with program.graph.inserting_after(mul):
            add = program.graph.call_function(aten.add.Tensor, (mul.args[0], mul.args[0]))
        add.meta["val"] = mul.meta["val"]
        mul.replace_all_uses_with(add)
        return Outcome([Doubled(mul.name, rewritten=True)])


def test_the_pipeline_tidies_after_a_rewrite():
    """What every rewrite needs is done once, by the pipeline: the node the step left dead
    removed, the module recompiled, the output spec naming the node returned now."""
    ep = _program()
    result = pipeline.run(ep, probe=None, steps=(Replace(),))
    assert result.fallback is None and result.modified
    program = result.program
    assert [n.target for n in program.graph.nodes if n.op == "call_function"] == \
        [aten.add.Tensor]
    assert "aten.add.Tensor" in program.graph_module.code
    program.validate()
    x = torch.randn(3, 4)
    assert torch.equal(program.module()(x), Double()(x))


class Unread(torch.nn.Module):
    """A value nothing reads, a write in place nothing reads, and one the model returns."""

    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(4))

    def forward(self, x):
        self.count.add_(1.0)
        return x * 2.0


def test_tidy_removes_only_what_the_step_left_dead():
    """A node that was dead before the step stays (stock keeps it), an in-place write stays
    (impure), a node the step left dead goes."""
    program = copy_program(torch.export.export(Unread(), (torch.randn(4),)))
    graph = program.graph
    (mul,) = [n for n in graph.nodes if n.target is aten.mul.Tensor]
    with graph.inserting_after(mul):
        dead_before = graph.call_function(aten.neg.default, (mul.args[0],))
        made_dead = graph.call_function(aten.neg.default, (mul.args[0],))
        user = graph.call_function(aten.sin.default, (made_dead,))
    for node in (dead_before, made_dead, user):
        node.meta["val"] = mul.meta["val"]
    graph.erase_node(user)           # the step's rewrite: made_dead's only reader gone
    tidy(program, frozenset({dead_before.name}))
    names = [n.name for n in graph.nodes]
    assert dead_before.name in names and made_dead.name not in names, names
    assert any(n.target is aten.add_.Tensor for n in graph.nodes), "the write in place stays"


def test_the_partitioner_asks_each_step_what_it_opens():
    """The partitioner names no step: each step's ``open`` gives the step to run and the
    configs it needs, new instances built from the partitioner's own (its own left as they
    were, executorch's classes not patched)."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
        XnnpackPartitioner as Stock)

    stock = Stock()
    opening = runtime_weight.STEP.open(stock)
    assert isinstance(opening, Opening) and opening.step is runtime_weight.STEP
    assert set(opening.configs) == {"linear.default", "addmm.default", "mm.default"}
    for target, config in opening.configs.items():
        original = stock.target_partitioner_configs[target]
        assert config is not original and isinstance(config, type(original))
        assert not type(original).__name__.startswith("RuntimeWeight")
        assert vars(config) == vars(original)
    ours = xnnfold.XnnpackPartitioner()
    assert [s.name for s in ours.fold.steps] == [s.name for s in pipeline.STEPS]
    assert kv_cache.STEP_VISIBLE_ROWS in ours.fold.steps
    names = {t: type(c).__name__ for t, c in ours.target_partitioner_configs.items()}
    assert names["linear.default"].startswith("RuntimeWeight") and \
        names["bmm.default"].startswith("VisibleRows"), names


class Opens:
    """A step of the tests' opening a config of its own for ``linear.default``, and running
    as another step."""

    name = "opens"

    def __init__(self, instead=None):
        self.instead = instead

    def open(self, partitioner) -> Opening:
        config = partitioner.target_partitioner_configs["linear.default"]
        subclass = type(f"Opened{type(config).__name__}", (type(config),), {})
        return Opening(self.instead, {"linear.default": step_configs.extended(config, subclass)})


def test_a_new_steps_opening_is_used_without_naming_it(monkeypatch):
    """A step added to the list opens its configs through the protocol alone; a step whose
    opening gives no step is left out."""
    replacement = DoubleStep()
    monkeypatch.setattr(pipeline, "STEPS", pipeline.STEPS + (Opens(replacement),))
    ours = xnnfold.XnnpackPartitioner()
    assert ours.fold.steps[-1] is replacement
    # the run-time weights' config, opened earlier, extended again
    linear = type(ours.target_partitioner_configs["linear.default"])
    assert linear.__name__.startswith("OpenedRuntimeWeight"), linear.__mro__
    monkeypatch.setattr(pipeline, "STEPS", pipeline.STEPS[:-1] + (Opens(None),))
    assert "opens" not in [s.name for s in xnnfold.XnnpackPartitioner().fold.steps]


class FailsToOpen:
    name = "fails_to_open"

    def open(self, partitioner):
        raise RuntimeError("no such config")


@pytest.mark.parametrize("strict", [False, True], ids=["users", "strict"])
def test_a_step_that_fails_to_open_is_left_out(monkeypatch, xnnfold_log, strict):
    """An opening that fails leaves its step out (the program lowers as stock lowers what
    that step would have rewritten), with one warning naming it; strict mode raises."""
    set_strict(monkeypatch, strict)
    monkeypatch.setattr(pipeline, "STEPS", pipeline.STEPS + (FailsToOpen(),))
    if strict:
        with pytest.raises(StrictFallback, match="the fails_to_open step is off"):
            xnnfold.XnnpackPartitioner()
        return
    ours = xnnfold.XnnpackPartitioner()
    assert [s.name for s in ours.fold.steps] == [s.name for s in pipeline.STEPS[:-1]]
    assert "the fails_to_open step is off: it could not open what it needs of the " \
        "partitioner: RuntimeError: no such config" in xnnfold_log.text


def test_a_config_extends_only_its_own_class():
    class Config:
        pass

    class Other:
        pass

    with pytest.raises(TypeError, match="Other does not extend Config"):
        step_configs.extended(Config(), Other)


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
