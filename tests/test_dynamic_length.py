"""A program of a dynamic length lowered and run on the runtime for several lengths: its views
with the length in their shape are XNNPACK's (the dynamic_views step), one delegate where stock
leaves each view on portable between two."""

import torch
from torch import nn

from conftest import check_lowering, seed_everything


class Heads(nn.Module):
    """transformers' attention reshapes: ``view(1, T, -1, D)`` after a projection, heads made
    contiguous ``[1, H, T, D]`` (as an attention's output is), and ``reshape(1, T, -1)`` of
    them transposed back: a strided source, which a view alone cannot read."""

    def __init__(self):
        super().__init__()
        self.proj, self.out = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        length = x.shape[1]
        heads = self.proj(x).view(1, length, -1, 4).transpose(1, 2).contiguous() * 2.0
        return self.out(heads.transpose(1, 2).reshape(1, length, -1))


def test_views_of_a_dynamic_length_join_the_delegate():
    seed_everything("dynamic-views")
    model = Heads().eval()
    length = torch.export.Dim("length", min=1, max=16)
    checked = check_lowering(model, (torch.randn(1, 3, 8),), dynamic_shapes=({1: length},),
                             run_inputs=[(torch.randn(1, n, 8),) for n in (1, 16)])
    assert checked.fold.records["dynamic_views"], checked.fold.records
    assert "aten.view_copy.default" in checked.stock.ops_outside, checked.stock.ops_outside
    assert "aten.view_copy.default" not in checked.folded.ops_outside, checked.folded.ops_outside
    assert checked.folded.delegate_calls == 1 < checked.stock.delegate_calls
