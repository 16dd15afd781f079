"""Mixture of experts and multi-head latent attention through the public LLM API: DeepSeek-V3
(its first layer dense, its second routed over 4 experts, top-2; its cache the attention's
latents, keys and values of different sizes) exported, lowered with xnnfold, generated on the
runtime; each expert one delegate behind its cond; the tokens eager's. And a model torch.export
cannot take: the package's own exception, naming the class, the cause kept."""

import pytest
import torch

from xnnfold.analysis.gemms import op_name
from xnnfold.export.llm import (CannotExport, Generator, export_causal_lm,
                                lower_generation)
from xnnfold.export.transformers import import_transformers
from xnnfold.pte.lowering import inspect_lowered

from conftest import seed_everything

EXPERTS, MOE_LAYERS = 4, 1
CACHE, PREFILL, PROMPT, NEW = 24, 8, 10, 8      # the prompt goes in as two prefill chunks
GEMMS = ("aten.linear", "aten.mm", "aten.addmm", "aten.bmm", "aten.matmul")


def deepseek_v3():
    tf = import_transformers()
    config = tf.DeepseekV3Config(
        hidden_size=32, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=2,
        first_k_dense_replace=1, n_routed_experts=EXPERTS, num_experts_per_tok=2, n_group=1,
        topk_group=1, num_attention_heads=2, num_key_value_heads=2, q_lora_rank=16,
        kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
        vocab_size=128, max_position_embeddings=64, initializer_range=0.3)
    seed_everything("deepseek-v3")
    model = tf.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():        # a router that routes: the init leaves its weights empty
        for name, param in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                param.normal_(0, 0.3)
    return model


def _branch_ops(edge, method):
    """For each cond of ``method``: the ops of its true branch (delegate calls included)."""
    from executorch.exir.graph_module import get_control_flow_submodules

    graph = edge.exported_program(method).graph_module
    conds = [n for n in graph.graph.nodes if n.target is torch.ops.higher_order.cond]
    submodules = {name: module for name, module, _ in get_control_flow_submodules(graph)}
    return [[op_name(n.target) for n in submodules[c.args[1].target].graph.nodes
             if n.op == "call_function" and "getitem" not in str(n.target)] for c in conds]


@pytest.fixture(scope="module")
def lowered():
    model = deepseek_v3()
    generation = export_causal_lm(model, max_cache=CACHE, max_prefill=PREFILL)
    inspect = lambda edge: {m: (inspect_lowered(edge.exported_program(m))[0],  # noqa: E731
                                _branch_ops(edge, m)) for m in generation.programs}
    return model, lower_generation(generation, before_emit=inspect)


def _each_expert_is_one_delegate_behind_its_cond(lowered):
    _, result = lowered
    for method, (outside, branches) in result.inspected.items():
        assert not [op for op in outside if op.startswith(GEMMS)], (method, outside)
        assert len(branches) == EXPERTS * MOE_LAYERS, (method, branches)
        for ops in branches:     # the expert's delegate, times the tokens' routing weights
            assert sorted(ops) == ["aten.mul.Tensor", "executorch_call_delegate"], ops


def _greedy_tokens_equal_eager(lowered):
    model, result = lowered
    seed_everything("deepseek-v3-prompt")
    prompt = torch.randint(0, 128, (PROMPT,)).tolist()
    run = Generator(result.pte).generate(prompt, NEW, stop_at_eos=False, keep_logits=True)
    with torch.no_grad():
        eager = model(input_ids=torch.tensor([prompt + run.tokens[:-1]])).logits[0, PROMPT - 1:]
    top = eager.topk(2).values
    assert float((top[:, 0] - top[:, 1]).min()) > 1e-3      # no tie a rounding could flip
    assert run.tokens == eager.argmax(-1).tolist()
    assert len(set(run.tokens)) > 2, run.tokens
    assert torch.allclose(torch.cat(run.logits), eager, atol=1e-4)


def test_each_expert_one_delegate_and_greedy_tokens_equal_eager(lowered):
    """One test on the one lowering (two tests of a module fixture are often run on both of
    make test's workers, each lowering it: 40 s)."""
    _each_expert_is_one_delegate_behind_its_cond(lowered)
    _greedy_tokens_equal_eager(lowered)


class BranchOnData(torch.nn.Module):
    """A causal LM whose forward branches on its input's values: torch.export refuses it."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.config = inner, inner.config
        self.generation_config = inner.generation_config

    def forward(self, input_ids=None, logits_to_keep=0, **kwargs):
        if input_ids.sum() > 0:
            input_ids = input_ids - 1
        return self.inner(input_ids=input_ids, logits_to_keep=logits_to_keep, **kwargs)


def test_a_model_export_cannot_take_is_named():
    tf = import_transformers()
    inner = tf.LlamaForCausalLM(tf.LlamaConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, vocab_size=32, max_position_embeddings=16)).eval()
    with pytest.raises(CannotExport, match=r"^BranchOnData: the export .* failed \(\w+") as error:
        export_causal_lm(BranchOnData(inner), max_cache=8, max_prefill=4)
    assert error.value.__cause__ is not None and error.value.model_class == "BranchOnData"
    assert "\n" not in str(error.value)


def test_a_gate_xnnpack_cannot_take_leaves_each_gemm_a_delegate():
    """GPT-OSS's gate (interleaved halves, clamped, sigmoid-weighted) has slices XNNPACK does not
    take: each expert's two GEMMs become delegates of their own, the gate runs between them."""
    from transformers.integrations.moe import batched_mm_experts_forward

    from xnnfold.export import experts as routing

    tf = import_transformers()
    seed_everything("gpt-oss-experts")
    model = tf.AutoModelForCausalLM.from_config(tf.GptOssConfig(
        hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, vocab_size=64, num_local_experts=2,
        num_experts_per_tok=1)).eval()
    (experts,) = routing.experts_modules(model)
    with torch.no_grad():
        for param in experts.parameters():
            param.normal_(0, 0.3)
    lowered = routing._lowered_experts(experts, max_tokens=4)
    x = torch.randn(3, 32)
    for e, expert in enumerate(lowered):
        assert isinstance(expert, routing.OneExpert) and set(expert.gemms) == {"in", "out"}
        with torch.no_grad():
            expected = batched_mm_experts_forward(experts, x, torch.full((3, 1), e),
                                                  torch.ones(3, 1))
            assert torch.allclose(expert(x), expected, atol=1e-5)


# both in the slow set (~45 s each): the experts' conds are in make test through the fixture above
@pytest.mark.parametrize("llm_kernels", [pytest.param(False, marks=pytest.mark.slow),
                                         pytest.param(True, marks=pytest.mark.slow)],
                         ids=["default", "llm-kernels"])
def test_routed_experts_beside_a_kv_cache_attention(llm_kernels):
    """Mixtral (tiny dims): its attention over the cache (the KV-cache step's) beside the routed
    experts' conds. An item() of the position beside a cond fails the lowering
    (PendingUnbackedSymbolNotFound): the step reads every cache row and declines the LLM
    kernels, the lowering passes and generates eager's tokens."""
    from xnnfold.models import families
    from xnnfold.steps.kv_cache import visible

    seed_everything("mixtral")
    model = families.build("mixtral", families.FAST)
    generation = export_causal_lm(model, max_cache=CACHE, max_prefill=PREFILL)
    low = lower_generation(generation, partitioner_kwargs={"llm_kernels": llm_kernels})
    (partitioner,) = low.partitioners.values()
    records = partitioner.last_result.records["kv_cache"]
    assert records and all(r.rewritten and visible.HOW not in r.proven for r in records)
    assert all("control flow" in r.llm_declined for r in records) if llm_kernels else True
    prompt = list(range(3, 3 + PROMPT))
    with torch.no_grad():
        want = model.generate(torch.tensor([prompt]), max_new_tokens=4, do_sample=False)
    assert Generator(low.pte).generate(prompt, max_new=4).tokens == want[0, PROMPT:].tolist()
