"""The gelu_tanh step on small exported graphs, without lowering: ``gelu(approximate="tanh")``
written out as mul/add/tanh in torch's own order (the rewritten program, run as a module,
equals eager to fp32 rounding), and left alone where XNNPACK would not take the GELU."""

import torch
from torch import nn

from xnnfold.program_copy import copy_program
from xnnfold.steps.gelu_tanh import rewrite_tanh_gelus

from conftest import round_trip

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


def rewritten(model, x):
    ep = torch.export.export(model, (x,))
    program = copy_program(ep)
    return ep, program, rewrite_tanh_gelus(program)


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
