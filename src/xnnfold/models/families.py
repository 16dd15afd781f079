"""transformers causal-LM families built from configs with random weights, at one set of sizes,
each with its own features on (sliding windows, soft-capping, tied heads, partial rotary, biases,
ALiBi, mixtures of experts, latent attention): what ``xnnfold bench llm-families`` exports.

The list: the families people bring (soft-capping, ALiBi, mixtures of experts...) and the
text-generation families optimum-executorch lists that transformers 5 has. Each is a function of :class:`Sizes` returning a config; :func:`build`
makes the model (seeded, weights re-drawn so that logits spread: 2-D weights N(0, 1/fan_in),
norms U(0.5, 1.5), biases N(0, 0.1)). Importing it imports nothing heavy (the bench's
command line checks family names before torch loads).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Sizes:
    hidden: int = 512
    layers: int = 4
    heads: int = 8
    kv_heads: int = 2
    vocab: int = 32_000
    positions: int = 4096
    experts: int = 8
    top_k: int = 2
    window: int = 256          # sliding windows (Mistral, Gemma2/3, Qwen2-MoE's layers)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def mlp(self) -> int:
        return 2 * self.hidden


FAST = Sizes(hidden=64, layers=2, heads=4, kv_heads=2, vocab=256, positions=256, experts=4,
             top_k=2, window=6)


def _llama_like(s: Sizes) -> dict:
    return dict(hidden_size=s.hidden, num_hidden_layers=s.layers, num_attention_heads=s.heads,
                num_key_value_heads=s.kv_heads, vocab_size=s.vocab, intermediate_size=s.mlp,
                max_position_embeddings=s.positions)


def _no_gqa(s: Sizes) -> dict:
    return dict(hidden_size=s.hidden, num_hidden_layers=s.layers, num_attention_heads=s.heads,
                vocab_size=s.vocab)


def _moe(s: Sizes) -> dict:
    return dict(_llama_like(s), num_experts_per_tok=s.top_k)


# family -> (transformers config class name, its arguments at sizes s)
FAMILIES = {
    "llama": ("LlamaConfig", _llama_like),
    "smollm2": ("LlamaConfig", lambda s: dict(_llama_like(s), tie_word_embeddings=True)),
    "smollm3": ("SmolLM3Config", _llama_like),
    "mistral": ("MistralConfig", lambda s: dict(_llama_like(s), sliding_window=s.window)),
    "qwen2": ("Qwen2Config", lambda s: dict(_llama_like(s), tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", lambda s: dict(_llama_like(s), head_dim=s.head_dim)),
    "gemma": ("GemmaConfig", lambda s: dict(_llama_like(s), head_dim=s.head_dim)),
    "gemma2": ("Gemma2Config", lambda s: dict(_llama_like(s), head_dim=s.head_dim,
                                              sliding_window=s.window,
                                              query_pre_attn_scalar=s.head_dim)),
    "gemma3": ("Gemma3TextConfig", lambda s: dict(_llama_like(s), head_dim=s.head_dim,
                                                  sliding_window=s.window,
                                                  query_pre_attn_scalar=s.head_dim)),
    "phi": ("PhiConfig", lambda s: dict(_no_gqa(s), intermediate_size=s.mlp,
                                        max_position_embeddings=s.positions)),
    "phi3": ("Phi3Config", lambda s: dict(_llama_like(s), pad_token_id=0)),
    "olmo": ("OlmoConfig", _llama_like),
    "olmo2": ("Olmo2Config", _llama_like),
    "gpt-neox": ("GPTNeoXConfig", lambda s: dict(_no_gqa(s), intermediate_size=s.mlp,
                                                 max_position_embeddings=s.positions)),
    "gpt-j": ("GPTJConfig", lambda s: dict(n_embd=s.hidden, n_layer=s.layers, n_head=s.heads,
                                           vocab_size=s.vocab, n_positions=s.positions,
                                           rotary_dim=s.head_dim // 2)),
    "codegen": ("CodeGenConfig", lambda s: dict(n_embd=s.hidden, n_layer=s.layers,
                                                n_head=s.heads, vocab_size=s.vocab,
                                                n_positions=s.positions, n_ctx=s.positions,
                                                rotary_dim=s.head_dim // 2)),
    "granite": ("GraniteConfig", _llama_like),
    "starcoder2": ("Starcoder2Config", lambda s: dict(_llama_like(s), sliding_window=None)),
    "glm": ("GlmConfig", lambda s: dict(_llama_like(s), head_dim=s.head_dim)),
    "gpt2": ("GPT2Config", lambda s: dict(n_embd=s.hidden, n_layer=s.layers, n_head=s.heads,
                                          vocab_size=s.vocab, n_positions=s.positions)),
    "falcon": ("FalconConfig", lambda s: dict(_no_gqa(s), max_position_embeddings=s.positions,
                                              new_decoder_architecture=True,
                                              num_kv_heads=s.kv_heads)),
    "bloom": ("BloomConfig", lambda s: dict(hidden_size=s.hidden, n_layer=s.layers,
                                            n_head=s.heads, vocab_size=s.vocab)),
    "opt": ("OPTConfig", lambda s: dict(_no_gqa(s), ffn_dim=s.mlp, word_embed_proj_dim=s.hidden,
                                        max_position_embeddings=s.positions)),
    "stablelm": ("StableLmConfig", _llama_like),
    "cohere": ("CohereConfig", _llama_like),
    # mixtures of experts
    "mixtral": ("MixtralConfig", lambda s: dict(_moe(s), num_local_experts=s.experts)),
    "qwen2-moe": ("Qwen2MoeConfig", lambda s: dict(
        _moe(s), num_experts=s.experts, moe_intermediate_size=s.mlp // 2,
        shared_expert_intermediate_size=s.mlp // 2, decoder_sparse_step=1)),
    "qwen3-moe": ("Qwen3MoeConfig", lambda s: dict(
        _moe(s), num_experts=s.experts, moe_intermediate_size=s.mlp // 2, head_dim=s.head_dim)),
    "olmoe": ("OlmoeConfig", lambda s: dict(_moe(s), num_experts=s.experts)),
    "granitemoe": ("GraniteMoeConfig", lambda s: dict(_moe(s), num_local_experts=s.experts)),
    "phimoe": ("PhimoeConfig", lambda s: dict(_moe(s), num_local_experts=s.experts)),
    "deepseek-v3": ("DeepseekV3Config", lambda s: dict(
        _llama_like(s), num_key_value_heads=s.heads, moe_intermediate_size=s.mlp // 2,
        n_routed_experts=s.experts, num_experts_per_tok=s.top_k, n_group=1, topk_group=1,
        first_k_dense_replace=1, q_lora_rank=s.hidden // 2, kv_lora_rank=s.hidden // 4,
        qk_rope_head_dim=s.head_dim // 2, qk_nope_head_dim=s.head_dim,
        v_head_dim=s.head_dim)),
}
MIXTURES = ("mixtral", "qwen2-moe", "qwen3-moe", "olmoe", "granitemoe", "phimoe", "deepseek-v3")


def config(family: str, sizes: Sizes, **overrides):
    """The family's config at ``sizes`` (``overrides``: config arguments set over them)."""
    from ..export.transformers import import_transformers

    class_name, arguments = FAMILIES[family]
    made = getattr(import_transformers(), class_name)(**{**arguments(sizes), **overrides})
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):    # the real vocab's ids
        value = getattr(made, name, None)
        if isinstance(value, int) and value >= sizes.vocab:
            setattr(made, name, {"bos_token_id": 1, "eos_token_id": 2}.get(name))
    return made


def build(family: str, sizes: Sizes, seed: int = 0, **overrides):
    """The family's causal LM at ``sizes``, random weights (seeded), in eval mode; its
    attention implementation transformers' default for the class (eager where it has no
    SDPA)."""
    import torch

    from ..export.transformers import import_transformers

    torch.manual_seed(seed)
    model = import_transformers().AutoModelForCausalLM.from_config(
        config(family, sizes, **overrides)).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 1 and "norm" in name:
                param.uniform_(0.5, 1.5, generator=generator)
            elif param.dim() == 1:
                param.normal_(0.0, 0.1, generator=generator)
            else:      # stacked experts (E, out, in) too: each by its own fan-in
                param.normal_(0.0, param.shape[-1] ** -0.5, generator=generator)
    return model
