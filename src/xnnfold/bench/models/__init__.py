"""Built-in models: the cases that motivate xnnfold, and their *ideal* rewrites.

The ideal rewrite computes the same math with plain ``nn.Linear`` / ``nn.Conv1d`` layers whose
weights are the values xnnfold folds: what a user would get by rewriting the model by hand. It
is the bar for delegate calls, bytes and latency. Every model is built from a seed, with
``in_proj_bias`` drawn at random (it is zero by default, which hides bias bugs).
The cases live in ``attention`` (MHA, the decoder layer) and ``computed`` (weight_norm, LoRA, a
tied head); this module holds the report's sets (built by name with
:func:`xnnfold.bench.sources.build_named`, which also knows the zoo: the models do not).
"""

from __future__ import annotations

# the cases and their ideal rewrites, as ``models.<name>`` (tests and scripts use them so)
from .attention import IdealDecoderLayer, attention_case, decoder_case  # noqa: F401
from .case import Case  # noqa: F401
from .computed import lora_case, tied_head_case, weight_norm_case  # noqa: F401


# --------------------------------------------------------------------------------------------
# The report's sets. Each entry builds its Case lazily: models are cheap, lowering is not.

SMALL: dict = {
    "cross-attention": lambda: attention_case("cross"),
    "different-kv": lambda: attention_case("kv"),
    "kdim-vdim": lambda: attention_case("kv", kdim=12, vdim=10),
    "decoder-layer": lambda: decoder_case(),
    "self-attention": lambda: attention_case("self"),
    "weight-norm-conv1d": lambda: weight_norm_case(),
    "lora-linear": lambda: lora_case(),
}

LARGE: dict = {
    "cross-attention-512": lambda: attention_case("cross", embed=512, heads=8, tgt=64, src=128),
    "decoder-layer-512": lambda: decoder_case(embed=512, heads=8, ff=1024, tgt=64, src=128),
    "self-attention-512": lambda: attention_case("self", embed=512, heads=8, tgt=64),
    "weight-norm-conv1d-256": lambda: weight_norm_case(channels=256, length=400),
    "lora-linear-1024": lambda: lora_case(features=1024, rows=64),
    # E=384, 6 heads, 4 layers, vocabulary 51,865, 8 tokens, memory 375 (whisper-tiny's sizes)
    "tied-head-decoder": lambda: tied_head_case(),
}

ALL: dict = {**SMALL, **LARGE}

