"""The report's sets of built-in models, by name (:mod:`.catalog` has the names alone)."""

from __future__ import annotations

from .attention import attention_case, decoder_case
from .computed import lora_case, tied_head_case, weight_norm_case

# Each entry builds its Case lazily: models are cheap, lowering is not.

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

