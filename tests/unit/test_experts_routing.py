"""transformers' experts modules as xnnfold exports them, without lowering: one expert's FFN
(OneExpert) equals transformers' own batched computation for that expert, and the routed form
(one cond per expert, each weighted by the tokens' routing weights) equals the whole module."""

import pytest
import torch

from xnnfold.export import experts as routing
from xnnfold.export.transformers import import_transformers


def tiny_experts(family: str):
    transformers = import_transformers()
    common = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=1, vocab_size=64)
    config = {"mixtral": lambda: transformers.MixtralConfig(**common, num_local_experts=4,
                                                            num_experts_per_tok=2),
              "gpt_oss": lambda: transformers.GptOssConfig(**common, num_local_experts=4,
                                                           num_experts_per_tok=2,
                                                           head_dim=16)}[family]()
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    (experts,) = routing.experts_modules(model)
    with torch.no_grad():
        for param in experts.parameters():
            param.normal_(0, 0.3)
    return model, experts


def batched(experts, x, index, weights):
    from transformers.integrations.moe import batched_mm_experts_forward

    with torch.no_grad():
        return batched_mm_experts_forward(experts, x, index, weights)


@pytest.mark.parametrize("family", ["mixtral", "gpt_oss"])
def test_one_expert_is_transformers_expert(family):
    _, experts = tiny_experts(family)
    x = torch.randn(5, 32, generator=torch.Generator().manual_seed(1))
    for e in range(experts.num_experts):
        one = routing.OneExpert(experts, e)
        expected = batched(experts, x, torch.full((5, 1), e), torch.ones(5, 1))
        with torch.no_grad():
            assert torch.allclose(one(x), expected, atol=1e-5), (family, e)
        assert all(p.is_contiguous() and p.data_ptr() != q.data_ptr()
                   for p in one.parameters() for q in experts.parameters())


@pytest.mark.parametrize("family", ["mixtral", "gpt_oss"])
def test_routed_conds_equal_the_experts_module(family):
    _, experts = tiny_experts(family)
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(6, 32, generator=gen)
    index = torch.stack([torch.randperm(4, generator=gen)[:2] for _ in range(6)])
    weights = torch.rand(6, 2, generator=gen)
    experts._xnnfold_lowered = [routing.OneExpert(experts, e) for e in range(4)]
    try:
        with torch.no_grad():
            got = routing._routed_forward(experts, x, index, weights)
    finally:
        del experts._xnnfold_lowered
    assert torch.allclose(got, batched(experts, x, index, weights), atol=1e-5)


def test_no_expert_routed_gives_zeros():
    _, experts = tiny_experts("mixtral")
    experts._xnnfold_lowered = [routing.OneExpert(experts, e) for e in range(4)]
    try:
        with torch.no_grad():
            got = routing._routed_forward(experts, torch.randn(3, 32),
                                          torch.full((3, 2), 9), torch.ones(3, 2))
    finally:
        del experts._xnnfold_lowered
    assert torch.equal(got, torch.zeros(3, 32))


def test_kernel_wrappers_bypassed_then_restored():
    model, _ = tiny_experts("mixtral")
    wrapped = [m for m in model.modules()
               if getattr(type(m).forward, "__code__", None) is not None and
               type(m).forward.__code__.co_name == "new_forward"]
    pytest.importorskip("kernels")
    assert wrapped, "transformers' attention is kernelized when `kernels` is installed"
    with routing._kernel_wrappers_bypassed(model) as bypassed:
        assert set(bypassed) == set(wrapped)
        assert all(m.forward.__func__ is type(m).forward.__wrapped__ for m in bypassed)
    assert not any("forward" in m.__dict__ for m in model.modules())
