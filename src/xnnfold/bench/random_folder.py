"""A transformers folder at a named model's real dims with random weights: config.json, the
weights as safetensors written tensor by tensor, and a byte-level BPE tokenizer.json of exactly
the model's vocabulary (what ``xnnfold hf`` and executorch's runner read), for measuring an
export at real size without downloading a checkpoint.

Memory: the model is built on the meta device (shapes, no data), and each tensor is drawn and
written in chunks of at most :data:`CHUNK_ELEMENTS` elements, so writing an 8B folder holds a
few tens of MB, never the weights. The file is safetensors' own layout (an 8-byte little-endian
header size, a JSON header of each tensor's dtype, shape and byte offsets, then the bytes),
written by this module so that no tensor is ever whole in memory.

Values: each weight drawn from N(0, ``initializer_range``) (the config's, as transformers
initializes), norms' weights 1, biases 0; seeded, so a folder is the same on every machine.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import torch

CHUNK_ELEMENTS = 1 << 22          # 4M elements drawn at a time: 16 MB of fp32
WEIGHTS = "model.safetensors"

_LLAMA3_ROPE = {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}

# name -> (architecture, config), from each model's published config.json
MODELS = {
    "smollm2-135m": ("LlamaForCausalLM", dict(
        model_type="llama", hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, intermediate_size=1536, vocab_size=49152,
        tie_word_embeddings=True, max_position_embeddings=8192, rope_theta=100000.0,
        rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2)),
    "qwen2.5-0.5b": ("Qwen2ForCausalLM", dict(
        model_type="qwen2", hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, intermediate_size=4864, vocab_size=151936,
        tie_word_embeddings=True, max_position_embeddings=32768, rope_theta=1000000.0,
        rms_norm_eps=1e-6, bos_token_id=151643, eos_token_id=151643)),
    "llama-3.2-1b": ("LlamaForCausalLM", dict(
        model_type="llama", hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, intermediate_size=8192, vocab_size=128256, head_dim=64,
        tie_word_embeddings=True, max_position_embeddings=131072, rope_theta=500000.0,
        rope_scaling={**_LLAMA3_ROPE, "factor": 32.0}, rms_norm_eps=1e-5,
        bos_token_id=128000, eos_token_id=128001)),
    "llama-3.2-3b": ("LlamaForCausalLM", dict(
        model_type="llama", hidden_size=3072, num_hidden_layers=28, num_attention_heads=24,
        num_key_value_heads=8, intermediate_size=8192, vocab_size=128256, head_dim=128,
        tie_word_embeddings=True, max_position_embeddings=131072, rope_theta=500000.0,
        rope_scaling={**_LLAMA3_ROPE, "factor": 32.0}, rms_norm_eps=1e-5,
        bos_token_id=128000, eos_token_id=128001)),
    "llama-3.1-8b": ("LlamaForCausalLM", dict(
        model_type="llama", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, intermediate_size=14336, vocab_size=128256, head_dim=128,
        tie_word_embeddings=False, max_position_embeddings=131072, rope_theta=500000.0,
        rope_scaling={**_LLAMA3_ROPE, "factor": 8.0}, rms_norm_eps=1e-5,
        bos_token_id=128000, eos_token_id=128001)),
}

# The names the model's own tokenizer gives its bos and eos ids, where transformers' tokenizer
# class for the model type has defaults: without a tokenizer_config.json, Qwen2Tokenizer names
# eos, unk and pad "<|endoftext|>" and adds that token past the vocabulary when the folder's
# tokenizer lacks it (llama.cpp's converter then refuses the folder). Others: <s> and </s>.
SPECIAL_NAMES = {"qwen2.5-0.5b": ("<|endoftext|>", "<|endoftext|>")}

_DTYPES = {"bfloat16": (torch.bfloat16, "BF16"), "float32": (torch.float32, "F32")}


def model_config(name: str, layers: int = None, overrides: dict = None) -> tuple:
    """(architecture, config dict) of model ``name`` (:data:`MODELS`), with ``layers`` decoder
    layers if given (the same per-layer shapes) and ``overrides`` applied."""
    if name not in MODELS:
        raise ValueError(f"model {name!r}: expected one of {', '.join(MODELS)}")
    architecture, config = MODELS[name]
    config = {**config, **(overrides or {})}
    if layers is not None:
        if layers < 1:
            raise ValueError(f"layers {layers}: at least 1")
        config["num_hidden_layers"] = layers
    return architecture, config


def tensor_shapes(architecture: str, config: dict) -> dict:
    """{name: shape} of the tensors ``save_pretrained`` would write (a tied head left out),
    read from the model built on the meta device: no weight is allocated."""
    import transformers

    config_object = transformers.AutoConfig.for_model(**config)
    with torch.device("meta"):
        model = getattr(transformers, architecture)(config_object)
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    if config.get("tie_word_embeddings"):
        shapes.pop("lm_head.weight", None)
    return dict(sorted(shapes.items()))


def _fill(name: str) -> str:
    """How tensor ``name`` is initialized: a norm's scale 1, a bias 0, the rest drawn."""
    module, _, kind = name.rpartition(".")
    if kind == "bias":
        return "zeros"
    return "ones" if "norm" in module.rpartition(".")[2] else "normal"


def write_safetensors(path: Path, shapes: dict, dtype: str = "bfloat16", std: float = 0.02,
                      seed: int = 0) -> int:
    """Write ``shapes`` ({name: shape}) as one safetensors file at ``path``, each tensor drawn
    and written in chunks (norms 1, biases 0, the rest N(0, ``std``)); returns the file's
    bytes."""
    torch_dtype, tag = _DTYPES[dtype]
    itemsize = torch_dtype.itemsize
    header, offset = {}, 0
    for name, shape in shapes.items():
        size = math.prod(shape) * itemsize
        header[name] = {"dtype": tag, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)           # the data starts 8-byte aligned
    generator = torch.Generator().manual_seed(seed)
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(text)))
        out.write(text)
        for name, shape in shapes.items():
            fill, left = _fill(name), math.prod(shape)
            while left:
                count = min(left, CHUNK_ELEMENTS)
                if fill == "normal":
                    chunk = torch.empty(count).normal_(0.0, std, generator=generator)
                else:
                    chunk = (torch.ones if fill == "ones" else torch.zeros)(count)
                out.write(chunk.to(torch_dtype).view(torch.uint8).numpy().tobytes())
                left -= count
    return 8 + len(text) + offset


def bpe_tokenizer(path: Path, vocab: int, bos: int, eos: int,
                  names: tuple = ("<s>", "</s>")) -> None:
    """A byte-level BPE ``tokenizer.json`` of exactly ``vocab`` ids: printable ASCII's byte-level
    characters, then merges of each token with one more character (every id reachable), the
    special tokens ``names`` (bos, eos; one token when the ids are equal) at ``bos`` and ``eos``
    (taking those ids: each decodes to ASCII text, which executorch's runner needs)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = [chr(288)] + [chr(b) for b in range(33, 127)]   # GPT-2's byte-level space + ASCII
    special = {bos: names[0], eos: names[1]}
    if len(special) + len(alphabet) > vocab or max(special) >= vocab:
        raise ValueError(f"vocabulary {vocab}: too small for the alphabet and {names[0]} {bos} / "
                         f"{names[1]} {eos}")
    if len(set(special.values())) < len(special):
        raise ValueError(f"bos {bos} and eos {eos}: two ids of one name {names[0]!r}")
    tokens, merges, base = list(alphabet), [], 0
    while len(tokens) + len(special) < vocab:     # token + one character, breadth first
        for character in alphabet:
            if len(tokens) + len(special) == vocab:
                break
            tokens.append(tokens[base] + character)
            merges.append((tokens[base], character))
        base += 1
    ids, words = {}, iter(tokens)
    for index in range(vocab):
        ids[special.get(index) or next(words)] = index
    tokenizer = Tokenizer(models.BPE(vocab=ids, merges=merges))
    tokenizer.add_special_tokens(list(special.values()))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.save(str(path))


def write_folder(folder: Path, name: str, layers: int = None, dtype: str = "bfloat16",
                 seed: int = 0, overrides: dict = None) -> dict:
    """Write model ``name``'s folder (config.json, :data:`WEIGHTS`, tokenizer.json) into
    ``folder``; returns what was written: {"parameters", "bytes", "config"}. ``dtype``: how the
    weights are stored and what config.json says (transformers loads them as that)."""
    if dtype not in _DTYPES:
        raise ValueError(f"dtype {dtype!r}: expected one of {', '.join(_DTYPES)}")
    architecture, config = model_config(name, layers, overrides)
    config = {**config, "architectures": [architecture], "dtype": dtype,
              "initializer_range": config.get("initializer_range", 0.02)}
    shapes = tensor_shapes(architecture, config)
    folder.mkdir(parents=True, exist_ok=True)
    size = write_safetensors(folder / WEIGHTS, shapes, dtype, config["initializer_range"], seed)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    bpe_tokenizer(folder / "tokenizer.json", config["vocab_size"], config["bos_token_id"],
                  config["eos_token_id"], SPECIAL_NAMES.get(name, ("<s>", "</s>")))
    return {"parameters": sum(math.prod(s) for s in shapes.values()), "bytes": size,
            "config": config}
