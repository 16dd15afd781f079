"""After lower_generation has written its .pte, nothing keeps the lowered delegates (and
XNNPACK's serialized copy of the weights they hold) alive: torch's fake-tensor dispatch caches
hold them otherwise (xnnfold.export.llm.release)."""

import gc
import weakref

import torch
from torch import nn


class _Counter(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("total", torch.zeros(16))
        self.linear = nn.Linear(16, 16)

    def forward(self, x):
        self.total.add_(x.sum(0))
        return self.linear(x) + self.total


def _delegates(edge) -> list:
    from executorch.exir.lowered_backend_module import get_lowered_submodules

    graph_module = edge.exported_program("forward").graph_module
    return [weakref.ref(module) for _, module, _ in get_lowered_submodules(graph_module)]


def test_no_lowered_delegate_outlives_the_written_pte(tmp_path):
    from xnnfold.export.llm.export import GenerationPrograms, lower_generation

    torch.manual_seed(0)
    rows = torch.export.Dim("rows", min=1, max=8)      # a ShapeEnv's cache, and the class's
    program = torch.export.export(_Counter().eval(), (torch.randn(3, 16),),
                                  dynamic_shapes=({0: rows},))
    lowered = lower_generation(GenerationPrograms({"forward": program}), before_emit=_delegates,
                               output=tmp_path / "m.pte")
    delegates = lowered.inspected
    assert delegates and (tmp_path / "m.pte").stat().st_size > 0
    gc.collect()
    alive = [ref() for ref in delegates if ref() is not None]
    assert not alive, f"{len(alive)} of {len(delegates)} lowered delegates still alive"
