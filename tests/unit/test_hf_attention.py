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
