"""The KV-cache step on real model code (transformers' causal LMs through its ExecuTorch
wrapper, executorch's own example Llama), lowered and run on the runtime for 4 decode steps
from an empty cache, each step compared with eager's; stock lowered and run beside it."""

import pytest
import torch

from xnnfold.models import decoder_lm
from xnnfold.steps.kv_cache import visible

from conftest import check_steps, seed_everything

DIMS = decoder_lm.Dims(hidden=64, layers=2, heads=4, kv_heads=2, vocab=256, cache=32)
STEPS = 4


def decode_steps(lm):
    gen = torch.Generator().manual_seed(0)
    return [lm.step_inputs(torch.randint(0, DIMS.vocab, (1, 1), generator=gen), position)
            for position in range(STEPS)]


def check(lm, llm_kernels=False, tol=None, masks=1):
    """``masks``: how many mask nodes the model builds (transformers: one for all layers)."""
    fresh = lm.fresh()
    checked = check_steps(lm.export(), decode_steps(lm), lambda *a: fresh.run(a), tol=tol,
                          partitioner_kwargs={"llm_kernels": True} if llm_kernels else None)
    records = checked.fold.of("kv_cache")
    assert records and all(r.rewritten for r in records), [r.describe() for r in records]
    ops = checked.folded.ops_outside
    stock_ops = checked.stock.ops_outside
    # stock: GQA's repeat and SDPA's safe-softmax glue on portable, every layer
    assert stock_ops.count("aten.expand_copy.default") >= DIMS.layers, stock_ops
    # xnnfold: none of it; each mask built (an expand of its [1, S] row) and made additive
    # (where) once, for every layer that reads it
    largest = checked.folded.largest_outside
    assert largest.get("aten.expand_copy.default", 0) <= DIMS.cache, largest
    assert "aten.eq.Scalar" not in ops, ops
    assert ops.count("aten.where.self") <= masks, ops
    if llm_kernels:
        assert all(r.kernels.startswith("llama::update_cache") for r in records)
        assert ops.count("llama.custom_sdpa.default") == DIMS.layers, ops
        assert "aten.index_put.default" not in ops, ops
    else:
        assert not any("llama" in op for op in ops), ops
        assert ops.count("aten.index_put.default") == 2 * DIMS.layers, ops
        # the rows up to the position only: the caches cut on portable, the attention's bmm
        # and softmax taken by XNNPACK with their run-time sizes (stock's configs decline them)
        assert all(visible.HOW in r.proven for r in records), [r.proven for r in records]
        assert ops.count("aten.slice_copy.Tensor") >= 2 * DIMS.layers, ops
        assert not {"aten.bmm.default", "aten._softmax.default"} & set(ops), ops
    return checked


# Gemma scales its embeddings by sqrt(hidden) and ties its head: its logits come out of
# XNNPACK 2.4e-5 off eager's in stock's .pte as in xnnfold's (accumulation order).
TOLERANCE = {"gemma": 5e-5}


# qwen2 and phi3 also generate 32 tokens through the step in test_hf.py (its slow set too);
# smollm is llama's code
@pytest.mark.parametrize("arch", ["llama", "gemma", *(pytest.param(a, marks=pytest.mark.slow)
                                                      for a in ("qwen2", "phi3", "smollm"))])
def test_transformers_decode(arch):
    seed_everything(arch)
    check(decoder_lm.transformers_lm(arch, DIMS), tol=TOLERANCE.get(arch))


# in the slow set: the LLM kernels are in make test through test_hf's llama-llm-kernels export
@pytest.mark.parametrize("arch", [pytest.param("llama", marks=pytest.mark.slow),
                                  pytest.param("qwen2", marks=pytest.mark.slow)])
def test_transformers_decode_llm_kernels(arch):
    seed_everything(arch)
    check(decoder_lm.transformers_lm(arch, DIMS), llm_kernels=True)


@pytest.mark.parametrize("llm_kernels", [False, pytest.param(True, marks=pytest.mark.slow)],
                         ids=["default", "llm-kernels"])
def test_executorch_example_llama(llm_kernels):
    """executorch's example Llama with its plain KV cache and SDPA (index_put_, a causal mask
    buffer indexed at the position, repeat_interleave)."""
    check(decoder_lm.executorch_llama(DIMS), llm_kernels, masks=DIMS.layers)   # a mask each
