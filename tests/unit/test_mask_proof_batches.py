"""The mask proof evaluated in batches of starts says exactly what one batch of every start
says: the same proofs, the same first failing position in the same words."""

import pytest
import torch

from xnnfold.steps.kv_cache import mask_proof

from test_kv_cache_families import Cached, WindowThenBlocked, rewritten

MODULES = {
    "causal": lambda: Cached("sdpa"),
    "window": lambda: Cached("sdpa", window=3),
    "blocked at one position": lambda: WindowThenBlocked("sdpa"),
    "per head, float": lambda: Cached("sdpa-alibi"),
}


def proofs(name: str, batch: int, dynamic: bool, monkeypatch) -> list:
    """What prove_mask says of each mask of the module, ``batch`` mask elements at a time."""
    said, prove = [], mask_proof.prove_mask
    with monkeypatch.context() as patch:
        patch.setattr(mask_proof, "BATCH_ELEMENTS", batch)
        patch.setattr(mask_proof, "prove_mask", lambda *a: said.append(prove(*a)) or said[-1])
        torch.manual_seed(0)
        rewritten(MODULES[name](), dynamic=dynamic)
    return said


@pytest.mark.parametrize("dynamic", [True, False])
@pytest.mark.parametrize("name", MODULES)
def test_batches_of_one_start_prove_what_one_batch_proves(name, dynamic, monkeypatch):
    whole = proofs(name, 2 ** 40, dynamic, monkeypatch)
    assert whole and whole == proofs(name, 1, dynamic, monkeypatch)
