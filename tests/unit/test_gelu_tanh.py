"""The gelu_tanh step on small exported graphs, without lowering: ``gelu(approximate="tanh")``
written out as mul/add/tanh in torch's own order (the rewritten program, run as a module,
equals eager to fp32 rounding), and left alone where XNNPACK would not take the GELU."""

import pytest
import torch
from torch import nn

import xnnfold
from xnnfold import pipeline
from xnnfold.errors import StrictFallback
from xnnfold.explain import Explanation
from xnnfold.graph.program_copy import copy_program
from xnnfold.graph.validity import tidy
from xnnfold.steps import gelu_tanh
from xnnfold.steps.gelu_tanh import rewrite_tanh_gelus

from conftest import round_trip, set_strict

GELU = torch.ops.aten.gelu.default


class Gelu(nn.Module):
    def __init__(self, approximate="tanh", dtype=torch.float32):
        super().__init__()
        self.approximate, self.dtype = approximate, dtype

    def forward(self, x):
        if self.dtype is torch.float32:
            return nn.functional.gelu(x, approximate=self.approximate)
        return nn.functional.gelu(x.to(self.dtype), approximate=self.approximate).float()


class QuantizedGelu(nn.Module):
    """A GELU between a dequantize and a quantize, as PT2E's convert leaves it."""

    def forward(self, x):
        q = torch.ops.quantized_decomposed
        xq = q.quantize_per_tensor.default(x, 0.05, 0, -128, 127, torch.int8)
        y = nn.functional.gelu(q.dequantize_per_tensor.default(xq, 0.05, 0, -128, 127,
                                                               torch.int8), approximate="tanh")
        yq = q.quantize_per_tensor.default(y, 0.05, 0, -128, 127, torch.int8)
        return q.dequantize_per_tensor.default(yq, 0.05, 0, -128, 127, torch.int8)


class GeluThenQuantized(nn.Module):
    """A GELU whose output is quantized (a dynamically quantized linear's input), its input
    plain fp32: an fp32 GELU, not a quantized pattern."""

    def forward(self, x):
        q = torch.ops.quantized_decomposed
        yq = q.quantize_per_tensor.default(nn.functional.gelu(x, approximate="tanh"), 0.05, 0,
                                           -128, 127, torch.int8)
        return q.dequantize_per_tensor.default(yq, 0.05, 0, -128, 127, torch.int8)


def rewritten(model, x):
    ep = torch.export.export(model, (x,))
    program = copy_program(ep)
    records = rewrite_tanh_gelus(program)
    tidy(program)       # what the pipeline does after a step
    return ep, program, records


def gelus(program):
    return [n for n in program.graph.nodes if n.target is GELU]


def test_tanh_gelu_written_out_exact():
    x = torch.linspace(-6, 6, 20001)
    ep, program, records = rewritten(Gelu(), x)
    assert [r.rewritten for r in records] == [True], records
    assert "written out" in records[0].describe()
    assert not gelus(program) and gelus(ep), "the caller's program keeps its GELU"
    got = program.module()(x)
    expected = nn.functional.gelu(x, approximate="tanh")
    assert (got - expected).abs().max() <= 4.8e-7       # 2 ulp at 6: fp32 rounding
    assert {str(n.target) for n in program.graph.nodes if n.op == "call_function"} == \
        {"aten.mul.Tensor", "aten.add.Tensor", "aten.tanh.default"}
    round_trip(program)


def test_exact_gelu_untouched():
    _, program, records = rewritten(Gelu("none"), torch.randn(8))
    assert records == [] and len(gelus(program)) == 1


def test_bf16_gelu_left_for_the_portable_kernel():
    _, program, records = rewritten(Gelu(dtype=torch.bfloat16), torch.randn(8))
    assert [r.rewritten for r in records] == [False], records
    assert "not fp32" in records[0].describe() and len(gelus(program)) == 1


def test_quantized_gelu_left_to_the_quantized_pattern():
    _, program, records = rewritten(QuantizedGelu(), torch.randn(8))
    assert [r.rewritten for r in records] == [False], records
    assert "dequantize" in records[0].reason and len(gelus(program)) == 1


def test_gelu_quantized_on_one_side_only_is_written_out():
    _, program, records = rewritten(GeluThenQuantized(), torch.randn(8))
    assert [r.rewritten for r in records] == [True], records
    assert gelus(program) == []


def test_the_step_runs_after_attention_and_explain_names_it():
    names = [step.name for step in pipeline.STEPS]
    assert names.index("attention") < names.index("gelu_tanh") < names.index("canonical")
    x = torch.randn(8)
    ep = torch.export.export(Gelu(), (x,))
    result = pipeline.run(ep, probe=None)
    assert result.fallback is None and result.modified and result.program is not ep
    assert [r.rewritten for r in result.of("gelu_tanh")] == [True]
    text = xnnfold.format_explanation(Explanation.of(result))
    assert "gelu_tanh step: gelu (gelu, approximate='tanh') written out" in text, text


class TwoGelus(nn.Module):
    def forward(self, x):
        return nn.functional.gelu(nn.functional.gelu(x, approximate="tanh") * 3.0,
                                  approximate="tanh")


@pytest.mark.parametrize("strict", [True, False])
def test_a_failure_on_one_gelu_keeps_only_it(monkeypatch, strict):
    """A write-out that fails half-way on the first GELU: its nodes are erased and that GELU
    alone stays as stock has it (strict mode: it raises, naming it)."""
    set_strict(monkeypatch, strict)
    real, calls = gelu_tanh._write_out, []

    def fails_first(emit, x):
        calls.append(x)
        if len(calls) == 1:
            emit(torch.ops.aten.mul.Tensor, x, x)      # created, then given up
            raise RuntimeError("boom")
        return real(emit, x)

    monkeypatch.setattr(gelu_tanh, "_write_out", fails_first)
    x = torch.randn(16)
    ep = torch.export.export(TwoGelus(), (x,))
    program = copy_program(ep)
    if strict:
        with pytest.raises(StrictFallback, match="gelu 'gelu' internal failure.*boom"):
            rewrite_tanh_gelus(program)
        return
    records = rewrite_tanh_gelus(program)
    assert [r.rewritten for r in records] == [False, True], records
    assert "internal failure" in records[0].describe() and "boom" in records[0].reason
    assert [n.name for n in gelus(program)] == ["gelu"]
    assert not [n for n in program.graph.nodes if n.name.startswith("gelu_mul") and
                not n.users], "the failed write-out's nodes erased"
    expected = TwoGelus()(x)
    assert (program.module()(x) - expected).abs().max() <= 1e-6
