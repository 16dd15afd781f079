"""``xnnfold hf`` decides what a folder exports as from its config.json alone, before torch,
transformers or the weights load: folders here hold a config.json and nothing else."""

import json
import sys
import time

import pytest

from xnnfold import cli

from xnnfold.export.hf import plan as hf_plan
from xnnfold.usage import UsageError
from xnnfold.export.llm.sizes import cache_sizes


def _folder(tmp_path, architecture, model_type, **config):
    folder = tmp_path / architecture
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(
        {"architectures": [architecture], "model_type": model_type, **config}))
    return str(folder)


TEXT = dict(vocab_size=100, max_position_embeddings=32)
IMAGE = dict(image_size=16, num_channels=3)


@pytest.mark.parametrize("architecture, model_type, config, kind", [
    ("LlamaForCausalLM", "llama", TEXT, hf_plan.CAUSAL_LM),
    ("GPT2LMHeadModel", "gpt2", dict(vocab_size=100, n_positions=32), hf_plan.CAUSAL_LM),
    ("WhisperForConditionalGeneration", "whisper", dict(max_target_positions=16), hf_plan.WHISPER),
    ("T5ForConditionalGeneration", "t5", dict(vocab_size=100, is_encoder_decoder=True),
     hf_plan.SEQ2SEQ),
    ("BartForConditionalGeneration", "bart", dict(TEXT, is_encoder_decoder=True), hf_plan.SEQ2SEQ),
    ("BertForSequenceClassification", "bert", TEXT, hf_plan.TEXT_LOGITS),
    ("DistilBertForMaskedLM", "distilbert", TEXT, hf_plan.TEXT_LOGITS),
    ("RobertaForTokenClassification", "roberta", dict(TEXT, pad_token_id=1), hf_plan.TEXT_LOGITS),
    ("BertModel", "bert", TEXT, hf_plan.TEXT_BASE),
    ("T5EncoderModel", "t5", dict(vocab_size=100), hf_plan.TEXT_BASE),
    ("ViTForImageClassification", "vit", IMAGE, hf_plan.IMAGE_LOGITS),
    ("ViTModel", "vit", IMAGE, hf_plan.VISION_BASE),
    ("CLIPModel", "clip", dict(text_config=TEXT, vision_config=IMAGE), hf_plan.CLIP),
    ("LlavaForConditionalGeneration", "llava", dict(vision_config=IMAGE, text_config=TEXT),
     hf_plan.IMAGE_TEXT),
])
def test_the_class_config_json_names_decides(tmp_path, architecture, model_type, config, kind):
    plan = hf_plan.plan(_folder(tmp_path, architecture, model_type, **config))
    assert (plan.kind, plan.architecture) == (kind, architecture)


@pytest.mark.parametrize("architecture, model_type, config", [
    ("Wav2Vec2ForCTC", "wav2vec2", dict(vocab_size=32)),
    ("T5Model", "t5", dict(vocab_size=100, is_encoder_decoder=True)),
    ("WhisperModel", "whisper", {}),
    ("ViTForImageClassification", "vit", {}),                   # no image size: no input
])
def test_other_classes_are_refused_naming_the_class(tmp_path, architecture, model_type, config):
    with pytest.raises(UsageError, match=f"{architecture} \\(model type '{model_type}'\\) is "
                       "not a class xnnfold hf exports"):
        hf_plan.plan(_folder(tmp_path, architecture, model_type, **config))


CAUSAL = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2)


@pytest.mark.parametrize("architecture, model_type, config, state", [
    ("MambaForCausalLM", "mamba", dict(CAUSAL, state_size=8), "a recurrent state"),
    ("RwkvForCausalLM", "rwkv", dict(CAUSAL, attention_hidden_size=32), "a recurrent state"),
    ("xLSTMForCausalLM", "xlstm", dict(CAUSAL, num_heads=2), "a recurrent state"),
    ("Lfm2ForCausalLM", "lfm2", dict(CAUSAL, layer_types=["conv", "full_attention"]),
     "the state of its conv layers \\(layer_types\\)"),
    ("RecurrentGemmaForCausalLM", "recurrent_gemma",
     dict(CAUSAL, block_types=["recurrent", "attention"]),
     "the state of its recurrent layers \\(block_types\\)"),
    ("Qwen3NextForCausalLM", "qwen3_next",
     dict(CAUSAL, layer_types=["linear_attention", "full_attention"]),
     "the state of its linear_attention layers"),
    ("JambaForCausalLM", "jamba", dict(CAUSAL, mamba_d_state=8, attn_layer_period=2),
     "a state-space or convolution state \\(mamba_d_state\\)"),
])
def test_causal_lms_without_only_a_kv_cache_are_refused_from_the_config(
        tmp_path, architecture, model_type, config, state):
    """Mamba, RWKV and hybrids: refused from config.json (the export failed after 11-25 s of
    loading); their logits without a cache are still exported."""
    folder = _folder(tmp_path, architecture, model_type, **config)
    with pytest.raises(UsageError, match=f"{architecture} \\(model type '{model_type}'\\) "
                       f"keeps {state}.* between tokens: a generation .pte holds a KV cache"):
        hf_plan.plan(folder)
    assert hf_plan.plan(folder, cache=False).kind == hf_plan.CAUSAL_LM


def test_attention_layers_of_every_kind_hold_a_kv_cache(tmp_path):
    folder = _folder(tmp_path, "Gemma2ForCausalLM", "gemma2", **dict(
        CAUSAL, layer_types=["full_attention", "sliding_attention"], num_attention_heads=2))
    assert hf_plan.plan(folder).kind == hf_plan.CAUSAL_LM


def test_refused_in_well_under_a_second_without_transformers(tmp_path, capsys, monkeypatch):
    """The refusal comes from config.json: with transformers unimportable the command still
    refuses the class (not "needs transformers"), and the folder holds no weights to load."""
    folder = _folder(tmp_path, "Wav2Vec2ForCTC", "wav2vec2", vocab_size=32)
    monkeypatch.setitem(sys.modules, "transformers", None)
    start = time.perf_counter()
    assert cli.main(["hf", folder, "-o", str(tmp_path / "x.pte")]) == 2
    assert time.perf_counter() - start < 1.0
    assert "Wav2Vec2ForCTC (model type 'wav2vec2') is not a class" in capsys.readouterr().err


@pytest.mark.parametrize("config, tokens, message", [
    (TEXT, 0, "tokens 0: give at least 1 token"),
    (TEXT, 33, "tokens 33 is beyond the model's 32 positions"),
    # RoBERTa numbers positions from pad_token_id + 1: 32 - 2 usable
    (dict(TEXT, pad_token_id=1), 31, "tokens 31 is beyond the model's 30 positions"),
])
def test_tokens_the_model_cannot_take(tmp_path, config, tokens, message):
    folder = _folder(tmp_path, "RobertaModel" if "pad_token_id" in config else "BertModel",
                     "roberta" if "pad_token_id" in config else "bert", **config)
    with pytest.raises(UsageError, match=message):
        hf_plan.plan(folder, tokens)


def test_roberta_takes_its_last_usable_position(tmp_path):
    folder = _folder(tmp_path, "RobertaModel", "roberta", **dict(TEXT, pad_token_id=1))
    assert hf_plan.plan(folder, 30).positions == 30


@pytest.mark.parametrize("options, message", [
    (dict(max_cache=1), "max_cache 1: a cache needs at least 2 rows"),
    (dict(max_prefill=0), "max_prefill 0: a prefill takes at least 1 token"),
    (dict(max_cache=10, tokens=8), "tokens 8: the check runs 8 \\+ 4 positions, the cache "
     "has 10 rows"),
])
def test_cache_sizes_checked_from_the_config(tmp_path, options, message):
    folder = _folder(tmp_path, "LlamaForCausalLM", "llama", **TEXT)
    with pytest.raises(UsageError, match=message):
        hf_plan.plan(folder, options.pop("tokens", 8), True, **options)
    # --no-cache: no cache to size, and its options refused rather than ignored
    assert hf_plan.plan(folder, 8, False).kind == hf_plan.CAUSAL_LM
    with pytest.raises(UsageError, match="options of a KV cache; cache=False exports"):
        hf_plan.plan(folder, 8, False, **options)


def test_a_seq2seq_generation_pte_takes_max_cache_only(tmp_path):
    folder = _folder(tmp_path, "WhisperForConditionalGeneration", "whisper",
                     max_target_positions=16)
    assert hf_plan.plan(folder, 4, True, max_cache=10).kind == hf_plan.WHISPER
    with pytest.raises(UsageError, match="max_prefill: options of a causal LM's KV cache; "
                       "WhisperForConditionalGeneration's generation .pte takes max_cache "
                       "only"):
        hf_plan.plan(folder, 4, True, max_cache=10, max_prefill=4)
    with pytest.raises(UsageError, match="max_cache: options of a KV cache; cache=False "
                       "exports without one"):
        hf_plan.plan(folder, 4, False, max_cache=10)


def test_cache_defaults():
    assert cache_sizes(None) == (1024, 128)
    assert cache_sizes(64) == (64, 64)            # capped by the model's positions
    assert cache_sizes(4096, 256) == (256, 128)


def test_sizes_beyond_what_holds_them_are_capped_and_said(tmp_path):
    """The cache by the model's positions, the prefill by the cache, asked or the default
    (the API raised on the README's max_cache=1024 where the command capped its default
    without a word); the command refuses none of them."""
    said = []
    assert cache_sizes(64, 1024, 128, said) == (64, 64)
    assert said == ["max_cache 1024 is beyond the model's 64 positions: a cache of 64 rows",
                    "max_prefill 128 is beyond the cache's 64 rows: prefills of up to 64 tokens"]
    said = []
    assert cache_sizes(64, None, None, said) == (64, 64)
    assert said == ["max_cache 1024 (the default) is beyond the model's 64 positions: a cache "
                    "of 64 rows"]             # the default prefill follows the cache, unsaid
    said = []
    assert cache_sizes(4096, 32, 40, said) == (32, 32) and len(said) == 1
    folder = _folder(tmp_path, "LlamaForCausalLM", "llama", **TEXT)
    assert hf_plan.plan(folder, 8, True, 1024, 128).kind == hf_plan.CAUSAL_LM


@pytest.mark.parametrize("content, message", [
    ("{", "not a readable JSON config"),
    ("[1]", "not a JSON object"),
    ('{"model_type": "bert"}', "config.json names no architecture"),
])
def test_unreadable_configs(tmp_path, content, message):
    (tmp_path / "config.json").write_text(content)
    with pytest.raises(UsageError, match=message):
        hf_plan.plan(str(tmp_path))
