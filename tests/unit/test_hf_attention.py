"""``xnnfold hf`` loads a class with the attention transformers has for it (SDPA where it has
one, eager where not: Gemma2, BLOOM, MPT) unless asked otherwise, and says which."""

import pytest

from xnnfold.export.hf import parts, plan as hf_plan
from xnnfold.models import decoder_lm
from xnnfold.usage import UsageError


@pytest.mark.parametrize("name, implementation", [
    ("Gemma2ForCausalLM", "eager"), ("BloomForCausalLM", "eager"), ("MptForCausalLM", "eager"),
    ("LlamaForCausalLM", "sdpa"), ("OPTForCausalLM", "sdpa"),
])
def test_auto_picks_what_transformers_has(name, implementation):
    import transformers

    chosen, note = parts.choose_attention(getattr(transformers, name), "auto")
    assert chosen == implementation
    assert note.startswith(f"{name}: transformers' {implementation} attention (--attention auto")
    if implementation == "eager":
        assert "no SDPA attention for this class" in note


def saved(arch: str, tmp_path) -> hf_plan.Plan:
    model = decoder_lm.causal_lm(arch, decoder_lm.Dims(hidden=32, layers=1, heads=2,
                                                       kv_heads=1, vocab=64, cache=8))
    model.save_pretrained(tmp_path)
    return hf_plan.plan(str(tmp_path), tokens=2, max_cache=8)


def test_gemma2_loads_with_eager_attention_unasked(tmp_path):
    model, note = parts.load(saved("gemma2", tmp_path), "auto")
    assert model.config._attn_implementation == "eager"
    assert "Gemma2ForCausalLM: transformers' eager attention" in note


def test_sdpa_asked_where_transformers_has_none_is_one_line(tmp_path):
    with pytest.raises(UsageError, match=r"has no SDPA attention for Gemma2ForCausalLM: use "
                                         r"attention=eager \(or auto\)$"):
        parts.load(saved("gemma2", tmp_path), "sdpa")


def test_a_bfloat16_folder_loads_as_float32_and_says_so(tmp_path):
    # transformers 5 loads a checkpoint in its own dtype; XNNPACK 1.5.1 delegates no bfloat16
    # GEMM, so a published (bfloat16) folder would run every linear on portable
    import torch

    model = decoder_lm.causal_lm("llama", decoder_lm.Dims(hidden=32, layers=1, heads=2,
                                                         kv_heads=1, vocab=64, cache=8))
    model.to(torch.bfloat16).save_pretrained(tmp_path)
    loaded, note = parts.load(hf_plan.plan(str(tmp_path), tokens=2, max_cache=8), "auto")
    assert {p.dtype for p in loaded.parameters()} == {torch.float32}
    assert note.endswith("its bfloat16 weights loaded as float32 (XNNPACK 1.5.1 delegates no "
                         "bfloat16 GEMM)")


def test_a_float32_folder_says_nothing_of_its_dtype(tmp_path):
    loaded, note = parts.load(saved("llama", tmp_path), "auto")
    assert "loaded as float32" not in note
