"""The weights a mixture-of-experts decode step reads, by count (``xnnfold bench moe-decode``),
on a tiny Mixtral without lowering: routed = the active parameters; every expert on every token
= all of them; transformers' batched_mm = its gathered experts read three times."""

import pytest

from xnnfold.bench import moe
from xnnfold.models.families import FAST


def test_bytes_per_variant():
    model = moe.build(FAST, intermediate=96)         # 4 experts, top-2, 2 layers, hidden 64
    expert = 3 * 64 * 96 * 4                         # gate, up, down; fp32
    routed = moe.weight_bytes(model, "routed", 2)
    assert routed["experts"] == 2 * expert * 2 and routed["total"] == routed["active"]
    everything = moe.weight_bytes(model, "all-experts", 2)
    assert everything["experts"] == 4 * expert * 2
    assert everything["total"] - routed["total"] == 2 * expert * 2
    gathered = moe.weight_bytes(model, "batched-mm", 2)
    assert gathered["experts"] == pytest.approx(3 * routed["experts"])
    # the rest: attention, norms, router, head and one row of the (untied) embedding table
    table = model.get_input_embeddings().weight
    params = sum(p.numel() * 4 for p in model.parameters())
    assert routed["rest"] == params - 4 * expert * 2 - table.numel() * 4 + table.shape[1] * 4
