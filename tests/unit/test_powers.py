"""The powers step on small exported graphs, without lowering: ``pow(x, 3)`` and ``pow(x, 2.0)``
written as the products torch's CPU kernel computes (the rewritten program equals eager bit for
bit), the integer square (XNNPACK's own), other exponents and other dtypes left alone."""

import torch
from torch import nn

from xnnfold.graph.program_copy import copy_program
from xnnfold.graph.validity import tidy
from xnnfold.steps.powers import write_powers_as_products

from conftest import round_trip, seed_everything

POW = torch.ops.aten.pow.Tensor_Scalar


class Powers(nn.Module):
    """gelu_new's cube, a float square, XNNPACK's integer square, a fourth power, a double cube."""

    def forward(self, x):
        gelu_new = 0.5 * x * (1.0 + torch.tanh(0.7978845608 * (x + 0.044715 * torch.pow(x, 3.0))))
        return (gelu_new, x ** 2.0, x ** 2, torch.pow(x, 4.0), torch.pow(x.double(), 3).float(),
                x ** 3)


def rewritten(x):
    ep = torch.export.export(Powers(), (x,))
    program = copy_program(ep)
    records = write_powers_as_products(program)
    tidy(program)       # what the pipeline does after a step
    return ep, program, records


def exponents(program):
    return sorted(str(n.args[1]) for n in program.graph.nodes if n.target is POW)


def test_cubes_and_float_squares_are_eager_bits():
    seed_everything("powers")
    x = torch.randn(4096) * 4
    ep, program, records = rewritten(x)
    by_exponent = {(r.exponent, r.rewritten) for r in records}
    assert by_exponent == {(3.0, True), (2.0, True), (3, True), (3, False)}, records
    left = [r for r in records if not r.rewritten]
    assert "not fp32" in left[0].reason and "left as is" in left[0].describe()
    assert "x*x*x" in next(r for r in records if r.exponent == 3 and r.rewritten).describe()
    # the integer square (XNNPACK's), the fourth power and the double cube remain
    assert exponents(program) == ["2", "3", "4.0"]
    assert exponents(ep) == ["2", "2.0", "3", "3", "3.0", "4.0"], "the caller's program is kept"
    got, expected = program.module()(x), Powers()(x)
    for g, e in zip(got, expected):
        assert torch.equal(g, e)           # bit for bit: torch's own products
    round_trip(program)


def test_the_correctly_rounded_cube_is_not_eager():
    """Why the step writes ``(x*x)*x``, not anything equal in exact arithmetic: eager's cube is
    those two roundings, and the correctly rounded cube (what ``std::pow`` aims at) differs."""
    seed_everything("powers-rounding")
    x = torch.randn(4096) * 4
    assert torch.equal(torch.pow(x, 3.0), (x * x) * x)
    assert not torch.equal(torch.pow(x, 3.0), torch.pow(x.double(), 3).float())
