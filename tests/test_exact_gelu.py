"""``gelu(approximate="tanh")`` lowered: stock's .pte computes the exact GELU (executorch
1.5.1's XNNPACK GELU ignores ``approximate``: 1e-4 to 5e-4 off eager), xnnfold's the tanh form
to fp32 rounding, all of it in the one delegate."""

import pytest
import torch
from torch import nn

from conftest import check_lowering, seed_everything

# The written-out GELU: 9 XNNPACK nodes in place of 1 and its 4 scalars as constants (measured
# 1,408 bytes more than stock's .pte); the price of the right values.
GELU_TANH_PTE_BYTES = 1536


class TanhGeluMLP(nn.Module):
    """Gemma's MLP activation (``gelu_pytorch_tanh``) between two linears."""

    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(16, 64), nn.Linear(64, 16)

    def forward(self, x):
        return self.down(nn.functional.gelu(self.up(x), approximate="tanh"))


def test_tanh_gelu_exact_where_stock_is_not():
    seed_everything("tanh-gelu")
    model = TanhGeluMLP().eval()
    x = torch.randn(8, 16) * 3          # the GELU's inputs span about [-10, 10]
    checked = check_lowering(model, (x,), tol=2e-6, rtol=0.0, compare_counts=False)
    assert checked.stock_diff > 1e-4, checked.stock_diff     # stock: the exact GELU
    assert checked.folded_diff <= 2e-6, checked.folded_diff
    assert [r.rewritten for r in checked.fold.of("gelu_tanh")] == [True]
    assert checked.folded.ops_outside == [] and checked.folded.delegate_calls == 1
    assert checked.folded.pte_bytes <= checked.stock.pte_bytes + GELU_TANH_PTE_BYTES


class NewGeluMLP(nn.Module):
    """GPT-2's and Flan-T5's MLP: transformers' own ``gelu_new`` (``NewGELUActivation``, its cube
    a ``torch.pow(x, 3.0)``) between two linears."""

    def __init__(self):
        super().__init__()
        from transformers.activations import ACT2FN
        self.up, self.act, self.down = nn.Linear(16, 64), ACT2FN["gelu_new"], nn.Linear(64, 16)

    def forward(self, x):
        return self.down(self.act(self.up(x)))


def test_gelu_new_cube_in_the_delegate():
    """Stock leaves the cube on portable (XNNPACK takes only the integer square), splitting the
    MLP into two delegates; xnnfold writes it as torch's ``x*x*x``: one delegate, nothing
    outside."""
    pytest.importorskip("transformers")
    seed_everything("gelu-new")
    model = NewGeluMLP().eval()
    x = torch.randn(8, 16) * 3
    checked = check_lowering(model, (x,), tol=2e-6, rtol=0.0, compare_counts=False)
    assert any("pow" in op for op in checked.stock.ops_outside), checked.stock.ops_outside
    assert [r.rewritten for r in checked.fold.of("powers")] == [True]
    assert checked.folded.ops_outside == [] and checked.folded.delegate_calls == 1
    assert checked.folded.delegate_calls < checked.stock.delegate_calls
    assert checked.folded.pte_bytes <= checked.stock.pte_bytes
