"""``xnnfold bench llm-folder``: a random-weight folder at a named model's dims loads with
transformers at those dims, with a tokenizer of exactly its vocabulary, while writing it holds
about one chunk, never the weights."""

import json

import pytest
import torch

from xnnfold.bench import random_folder


TINY = {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 320}


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen")
    written = random_folder.write_folder(folder, "qwen2.5-0.5b", layers=2, overrides={
        **TINY, "bos_token_id": 300, "eos_token_id": 300})       # one id, as Qwen2.5's
    return folder, written


def test_the_folder_loads_with_transformers_at_the_named_dims(tiny_folder):
    import transformers

    folder, written = tiny_folder
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    assert type(model).__name__ == "Qwen2ForCausalLM" and model.dtype == torch.bfloat16
    layer = model.model.layers[1]
    assert tuple(layer.self_attn.k_proj.weight.shape) == (2 * 16, 64)
    assert tuple(layer.mlp.up_proj.weight.shape) == (96, 64)
    assert torch.count_nonzero(layer.self_attn.q_proj.bias) == 0        # biases 0
    assert torch.equal(layer.input_layernorm.weight, torch.ones(64, dtype=torch.bfloat16))
    std = float(layer.mlp.down_proj.weight.float().std())
    assert 0.015 < std < 0.025                                         # N(0, 0.02)
    assert model.lm_head.weight is model.model.embed_tokens.weight      # tied, as Qwen2.5
    assert written["parameters"] == sum(p.numel() for p in model.parameters())
    assert json.loads((folder / "config.json").read_text())["num_hidden_layers"] == 2


def test_the_tokenizer_has_exactly_the_vocabulary_and_its_special_ids(tiny_folder):
    from tokenizers import Tokenizer

    folder, _ = tiny_folder
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert tokenizer.get_vocab_size() == 320
    assert tokenizer.token_to_id("<|endoftext|>") == 300        # Qwen2.5's name of its id
    ids = tokenizer.encode("hello world").ids
    assert ids and max(ids) < 320 and tokenizer.decode(ids) == "hello world"


def test_transformers_tokenizer_of_the_model_type_finds_its_special_tokens_in_the_vocabulary(
        tiny_folder):
    """What llama.cpp's converter loads (AutoTokenizer: Qwen2Tokenizer for qwen2, whose eos,
    unk and pad default to <|endoftext|>) counts the folder's ids, none past the vocabulary."""
    import transformers

    folder, _ = tiny_folder
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    assert len(tokenizer) == 320 and max(tokenizer.get_vocab().values()) == 319, \
        tokenizer.get_added_vocab()
    assert tokenizer.eos_token_id == 300


def test_two_special_ids_of_one_name_are_refused(tmp_path):
    with pytest.raises(ValueError, match="bos 300 and eos 301: two ids of one name"):
        random_folder.bpe_tokenizer(tmp_path / "t.json", 320, 300, 301,
                                    ("<|endoftext|>", "<|endoftext|>"))


_WRITE_AND_MEASURE = """
import resource, sys
from pathlib import Path
import torch
from xnnfold.bench import random_folder
random_folder.CHUNK_ELEMENTS = 1 << 18                  # 1 MB of fp32 drawn at a time
_, config = random_folder.model_config("smollm2-135m", layers=2)
shapes = random_folder.tensor_shapes("LlamaForCausalLM", config)
torch.empty(1 << 18).normal_()                          # the first draw's own allocations
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
written = random_folder.write_safetensors(Path(sys.argv[1]), shapes)
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(written, grown * 1024)
"""


def test_writing_holds_a_chunk_not_the_weights(tmp_path):
    """Two layers at SmolLM2's dims, 70 MB of bf16, in a process of its own: its peak resident
    memory grows by a few chunks, far less than what it wrote."""
    import subprocess
    import sys

    path = tmp_path / "w.safetensors"
    done = subprocess.run([sys.executable, "-c", _WRITE_AND_MEASURE, str(path)],
                          capture_output=True, text=True, check=True)
    written, grown = map(int, done.stdout.split())
    assert written == path.stat().st_size > 60e6
    assert grown < 16e6, f"writing {written:,} bytes grew the peak by {grown:,} bytes"


def test_an_unknown_model_or_dtype_is_one_line():
    with pytest.raises(ValueError, match="model 'gpt-5': expected one of smollm2-135m"):
        random_folder.model_config("gpt-5")
    with pytest.raises(ValueError, match="dtype 'int8': expected one of bfloat16, float32"):
        random_folder.write_folder(None, "smollm2-135m", dtype="int8")


def test_the_bench_command_writes_the_folder_and_refuses_no_layers(tmp_path, capsys):
    from xnnfold.bench.scripts import llm_folder

    assert llm_folder.main(["smollm2-135m", "-o", str(tmp_path / "none"), "--layers", "0"]) == 2
    assert "--layers 0: at least 1" in capsys.readouterr().err
    assert not (tmp_path / "none").exists()
    assert llm_folder.main(["smollm2-135m", "-o", str(tmp_path / "one"), "--layers", "1"]) == 0
    said = capsys.readouterr().out
    assert "LlamaForCausalLM at smollm2-135m's dims (1 layers, hidden 576, vocabulary 49,152)" \
        in said, said
    config = json.loads((tmp_path / "one" / "config.json").read_text())
    assert config["num_hidden_layers"] == 1 and config["dtype"] == "bfloat16"
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tmp_path / "one" / "tokenizer.json"))
    assert (tokenizer.token_to_id("<s>"), tokenizer.token_to_id("</s>")) == (1, 2)
