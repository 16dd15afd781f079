"""Memory planning with ``torch.cond``: executorch 1.5.1 moves a branch's output into the cond's
value, and plans every branch in one shared region, so a cond's output read after the next cond
ran holds that cond's values; :class:`CondOutputsInParent` places each branch's outputs where
the cond's own outputs are planned. Portable kernels only (no partitioner): small and quick."""

import pytest
import torch
from executorch.exir import ExecutorchBackendConfig, to_edge
from executorch.exir.passes import MemoryPlanningPass

from xnnfold.export.cond_memory import CondOutputsInParent
from xnnfold.pte import run_pte


class ThreeConds(torch.nn.Module):
    """Three conds whose outputs are summed after the last one ran (as XNNPACK's partitioner
    fuses the adds of a mixture-of-experts layer into one delegate)."""

    def forward(self, x, routed):
        parts = [torch.cond((routed == e).any(), lambda v, e=e: (v * (e + 2)).sin(),
                            lambda v: torch.zeros_like(v), (x,)) for e in range(3)]
        return parts[0] + parts[1] + parts[2]


@pytest.fixture(scope="module")
def ptes():
    """{"executorch": its own planning, "fixed": with CondOutputsInParent}"""
    example = (torch.zeros(3, 4), torch.tensor([0, 2]))
    program = torch.export.export(ThreeConds(), example, strict=True)
    plans = {"executorch": MemoryPlanningPass(),
             "fixed": MemoryPlanningPass(memory_planning_algo=CondOutputsInParent())}
    return {name: to_edge(program).to_executorch(  # emission changes the edge program
        ExecutorchBackendConfig(memory_planning_pass=plan)).buffer for name, plan in plans.items()}


def outputs(pte, routed):
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    routed = torch.tensor(routed)
    (got,) = run_pte(pte, (x, routed))
    return got, ThreeConds()(x, routed)


@pytest.mark.parametrize("routed", [[0, 2], [1, 1], [2, 0], [5, 5]])
def test_cond_outputs_in_parent(ptes, routed):
    got, expected = outputs(ptes["fixed"], routed)
    assert torch.allclose(got, expected, atol=1e-6), (got - expected).abs().max()


def test_executorch_planning_alone_is_wrong(ptes):
    """The bug the algorithm fixes (fails if executorch fixes it: then drop the algorithm)."""
    got, expected = outputs(ptes["executorch"], [0, 2])
    assert (got - expected).abs().max() > 0.1
