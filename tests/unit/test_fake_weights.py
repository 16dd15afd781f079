"""torch.export over fake weights (xnnfold.export.fake_weights): the program is the real-weight
export's, holding the module's own tensors; dynamo clones no weight; whatever the swap cannot
vouch for falls back to the real-weight export, with a warning; the caller's module is left as
it was."""

import subprocess
import sys
import warnings

import pytest
import torch
from torch import nn

from xnnfold.export import fake_weights
from xnnfold.export.fake_weights import FakeWeightsDeclined, export_with_fake_weights

FELL_BACK = "exported with its real weights"


class _Tied(nn.Module):
    """Tied embedding and head, a buffer, a non-persistent buffer, a transposed weight."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(64, 32)
        self.body = nn.Linear(32, 32)
        self.head = nn.Linear(32, 64, bias=False)
        self.head.weight = self.embed.weight
        self.mix = nn.Parameter(torch.randn(32, 16).t())      # a strided, non-contiguous one
        self.register_buffer("scale", torch.rand(32))
        self.register_buffer("shift", torch.rand(16), persistent=False)

    def forward(self, ids):
        hidden = self.body(self.embed(ids)) * self.scale
        return self.head(hidden), (hidden @ self.mix.t()) + self.shift


def _exports(module, args, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        faked = export_with_fake_weights(module, args, **kwargs)
    real = torch.export.export(module, args, **kwargs)
    return faked, real, [str(w.message) for w in caught if FELL_BACK in str(w.message)]


def _same_program(faked, real):
    assert faked.graph_module.code == real.graph_module.code
    assert faked.graph_signature == real.graph_signature
    assert list(faked.state_dict) == list(real.state_dict)
    assert list(faked.constants) == list(real.constants)
    for name, tensor in real.state_dict.items():        # the very tensors, not copies
        assert faked.state_dict[name] is tensor, name
    for name, tensor in real.constants.items():
        assert torch.equal(faked.constants[name], tensor), name


def test_the_program_is_the_real_weight_exports_with_the_modules_own_tensors():
    torch.manual_seed(0)
    model = _Tied().eval()
    before = dict(model.named_parameters(remove_duplicate=False))
    ids = torch.randint(0, 64, (1, 6))
    tokens = torch.export.Dim("tokens", min=1, max=16)
    faked, real, fell_back = _exports(model, (ids,), dynamic_shapes=({1: tokens},), strict=True)
    assert fell_back == []
    _same_program(faked, real)
    assert faked.state_dict["embed.weight"] is model.embed.weight       # tied: one tensor
    after = dict(model.named_parameters(remove_duplicate=False))
    assert all(after[name] is tensor for name, tensor in before.items())
    with torch.no_grad():
        for got, want in zip(faked.module()(ids), model(ids)):
            assert torch.equal(got, want)


def test_a_quantized_models_subclass_weights_are_put_back():
    from xnnfold.export.llm.quantize import quantized_copy

    torch.manual_seed(1)
    model = quantized_copy(nn.Sequential(nn.Linear(64, 96), nn.ReLU(), nn.Linear(96, 32)).eval(),
                           "8da4w")
    faked, real, fell_back = _exports(model, (torch.randn(2, 64),), strict=True)
    assert fell_back == []
    _same_program(faked, real)
    assert type(faked.state_dict["0.weight"]) is type(model[0].weight)


_PEAK = """
import sys, torch
from torch import nn
from xnnfold.export.fake_weights import export_with_fake_weights

def status(key):
    line = next(l for l in open("/proc/self/status") if l.startswith(key + ":"))
    return int(line.split()[1]) * 1024

model = nn.Linear(4096, 24576, bias=False).eval()      # 384 MiB of fp32 weights
model.weight.data.normal_()                            # made resident
example = torch.randn(2, 4096)
with open("/proc/self/clear_refs", "w") as refs:       # the peak (VmHWM) set to the resident set
    refs.write("5")
before = status("VmRSS")
export = export_with_fake_weights if sys.argv[1] == "fake" else torch.export.export
export(model, (example,), strict=True)
print(status("VmHWM") - before)
"""


def test_dynamo_clones_no_weight_while_it_traces():
    """The resident set's peak during the export rises by less than half the weight over fake
    weights; with real ones (the control) dynamo's clone of the weight raises it by the weight
    (the trace's own memory, some 100 MB, is under half of it either way)."""
    import os

    if not os.path.exists("/proc/self/clear_refs"):
        pytest.skip("Linux's per-process peak reset")

    def rise(how: str) -> int:
        done = subprocess.run([sys.executable, "-c", _PEAK, how], capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        return int(done.stdout.split()[-1])

    weight = 4096 * 24576 * 4
    assert rise("real") >= 0.9 * weight
    assert rise("fake") < 0.5 * weight


def test_a_failing_fake_trace_falls_back_to_the_real_weight_export(monkeypatch):
    def refused(*args):
        raise RuntimeError("cannot fake this")

    monkeypatch.setattr(fake_weights, "_swap_parameters", refused)
    torch.manual_seed(2)
    model = _Tied().eval()
    faked, real, fell_back = _exports(model, (torch.randint(0, 64, (1, 4)),), strict=True)
    assert len(fell_back) == 1 and "_Tied" in fell_back[0] and "cannot fake this" in fell_back[0]
    _same_program(faked, real)


class _Outside(nn.Module):
    """A weight reached through a plain list too: the real trace takes it as the parameter."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.holder = [self.linear.weight]

    def forward(self, x):
        return self.linear(x) + x @ self.holder[0].t()


def test_a_weight_reached_outside_the_module_tree_is_exported_with_real_weights():
    torch.manual_seed(3)
    model = _Outside().eval()
    faked, real, fell_back = _exports(model, (torch.randn(2, 8),), strict=True)
    assert len(fell_back) == 1
    _same_program(faked, real)
    assert model.linear.weight is model.holder[0]


def _program_over_fakes():
    torch.manual_seed(4)
    model = nn.Linear(8, 4).eval()
    real = dict(model.named_parameters())
    swapped = fake_weights._swap_parameters(model, _mode())
    try:
        program = torch.export.export(model, (torch.randn(2, 8),), strict=True)
    finally:
        for table, name, tensor in swapped:
            table[name] = tensor
    return program, real


def _mode():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    return FakeTensorMode(shape_env=ShapeEnv(), allow_non_fake_inputs=True)


def test_a_fake_left_in_the_program_is_refused():
    program, real = _program_over_fakes()
    del real["bias"]                                    # a fake no real tensor replaces
    with pytest.raises(FakeWeightsDeclined, match="bias is a fake tensor"):
        fake_weights._put_back(program, real)


def test_a_parameter_as_a_constant_is_refused():
    program, real = _program_over_fakes()
    program.constants["c_weight"] = real["weight"]
    with pytest.raises(FakeWeightsDeclined, match="c_weight is a parameter"):
        fake_weights._put_back(program, real)


@pytest.mark.parametrize("other", [torch.zeros(4, 4), torch.zeros(4, 8, dtype=torch.float64),
                                   torch.zeros(8, 4).t()])
def test_a_parameter_unlike_its_fake_is_refused(other):
    program, real = _program_over_fakes()
    real["weight"] = nn.Parameter(other)
    with pytest.raises(FakeWeightsDeclined, match="weight: traced as"):
        fake_weights._put_back(program, real)


def test_the_callers_parameters_are_put_back_when_the_export_fails():
    class Broken(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(4, 4)

        def forward(self, x):
            return self.linear(x).view(3, 7)              # no such shape: fails either way

    model = Broken().eval()
    weight, bias = model.linear.weight, model.linear.bias
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(Exception) as raised:
            export_with_fake_weights(model, (torch.randn(2, 4),), strict=True)
    # the real export's own failure, and no word of fake weights: they changed nothing
    assert FELL_BACK not in str(raised.value)
    assert not [w for w in caught if FELL_BACK in str(w.message)]
    assert model.linear.weight is weight and model.linear.bias is bias
    assert type(model.linear.weight) is nn.Parameter
