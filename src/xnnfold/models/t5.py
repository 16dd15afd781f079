"""T5 built from a config with random weights (no downloads), at t5-small's dims or
test-sized, as T5 (ReLU, the head tied to the token table, its input scaled by
``d_model ** -0.5``) or as T5 v1.1 / Flan-T5 (gated GELU, an untied head, no scaling), saved
as a folder the way the published checkpoints are: what the tests and the T5 measurement
export (:mod:`xnnfold.export.seq2seq`).

``init_factor`` is raised from transformers' 1.0, at which a random T5 repeats token 0
whatever its input; the relative position biases are drawn at ``bias_std`` so that they, and
not only the tokens, decide what comes next (at transformers' ``init_factor * d_model ** -0.5``
computing every step's bias as at position 0 leaves most greedy tokens as they were).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import torch

from ..export.transformers import import_transformers

# (d_model, layers, heads, d_ff, vocab) of google-t5/t5-small
T5_DIMS = {"small": (512, 6, 8, 2048, 32_128), "test": (64, 2, 4, 128, 200)}


def t5(dims: str = "small", flan: bool = False, init_factor: float = 3.0,
       bias_std: float = 3.0, table_std: float = 0.5, seed: int = 0,
       layers: Optional[int] = None):
    """A ``T5ForConditionalGeneration`` (eval) at ``dims`` (:data:`T5_DIMS`), ``layers`` in
    the encoder and in the decoder if given; ``flan``: T5 v1.1's feed-forward and head (gated
    GELU, an untied head, ``tie_word_embeddings=False``)."""
    tf = import_transformers()
    width, default_layers, heads, ffn, words = T5_DIMS[dims]
    layers = layers or default_layers
    config = tf.T5Config(
        vocab_size=words, d_model=width, d_kv=width // heads, d_ff=ffn,
        num_layers=layers, num_decoder_layers=layers, num_heads=heads,
        initializer_factor=init_factor, decoder_start_token_id=0, pad_token_id=0,
        eos_token_id=1, feed_forward_proj="gated-gelu" if flan else "relu",
        tie_word_embeddings=not flan)
    torch.manual_seed(seed)
    model = tf.T5ForConditionalGeneration(config).eval()
    with torch.no_grad():
        model.shared.weight.normal_(0.0, table_std)
        for stack in (model.encoder, model.decoder):
            stack.block[0].layer[0].SelfAttention.relative_attention_bias.weight.normal_(
                0.0, bias_std)
        if flan:      # transformers ties the head whatever the config: a table of its own
            model.lm_head.weight = torch.nn.Parameter(torch.randn_like(model.shared.weight))
    return model


def save_t5_folder(folder, model) -> Path:
    """``model`` saved with ``save_pretrained``; an untied head's config says so as Flan-T5's
    published config.json does (``tie_word_embeddings: false``: transformers then keeps the
    head apart and does not scale its input)."""
    folder = Path(folder)
    model.save_pretrained(folder)
    if model.lm_head.weight.data_ptr() != model.shared.weight.data_ptr():
        path = folder / "config.json"
        config = json.loads(path.read_text())
        config["tie_word_embeddings"] = False
        path.write_text(json.dumps(config, indent=2))
    return folder
