"""Whisper and BART built from configs with random weights (no downloads), at published dims or
test-sized, with the generation config Whisper's ``generate`` reads and the feature extractor's
``preprocessor_config.json``: what ``xnnfold bench whisper`` and the tests export
(:mod:`xnnfold.export.seq2seq`).

``init_std`` is raised from transformers' 0.02 so that the greedy tokens depend on the input
(at 0.02 a random Whisper repeats one token whatever it hears).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from ..export.transformers import import_transformers

# (d_model, encoder and decoder layers, heads, ffn) of OpenAI's checkpoints
WHISPER_DIMS = {"tiny": (384, 4, 6, 1536), "base": (512, 6, 8, 2048),
                "test": (64, 2, 4, 128)}
WHISPER_VOCAB = 51_865          # whisper-tiny / base (multilingual, v2 tokenizer)
_LANGUAGES = 99                 # the v2 tokenizer's language tokens
_SUPPRESS = [1, 2, 7, 8, 9, 10, 14, 25, 26, 27, 28, 29, 31, 58, 59, 60, 61, 62, 63, 90, 91,
             92, 93, 359, 503, 522, 542, 873, 893, 902, 918, 922, 931, 1350, 1853, 1982]


def whisper_special_tokens(vocab: int) -> dict:
    """The special tokens' ids as OpenAI's v2 tokenizer places them after ``vocab - 1608``
    text tokens (51,865 -> text 0 .. 50,256): end of text, start of transcript, 99 languages,
    translate, transcribe, start of LM, start of previous, no speech, no timestamps, then the
    1,501 timestamps. A smaller ``vocab`` keeps the order with fewer text tokens."""
    eot = vocab - 1608
    languages = eot + 2
    return {"eot": eot, "sot": eot + 1, "languages": languages,
            "translate": languages + _LANGUAGES, "transcribe": languages + _LANGUAGES + 1,
            "prev": languages + _LANGUAGES + 3, "no_timestamps": languages + _LANGUAGES + 5}


def whisper_generation_config(vocab: int):
    """A generation config with the structure of openai/whisper-tiny's (multilingual: the
    language detected unless given, then transcribe, no timestamps; tokens suppressed)."""
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    GenerationConfig = import_transformers().GenerationConfig

    t = whisper_special_tokens(vocab)
    codes = list(LANGUAGES)[:_LANGUAGES]
    suppress = [s for s in _SUPPRESS if s < t["eot"]] + \
        [t["sot"], t["translate"], t["transcribe"], t["transcribe"] + 1, t["prev"],
         t["prev"] + 1]
    return GenerationConfig(
        decoder_start_token_id=t["sot"], bos_token_id=t["eot"], eos_token_id=t["eot"],
        pad_token_id=t["eot"], begin_suppress_tokens=[min(220, t["eot"] - 1), t["eot"]],
        suppress_tokens=suppress, is_multilingual=True,
        lang_to_id={f"<|{c}|>": t["languages"] + i for i, c in enumerate(codes)},
        task_to_id={"translate": t["translate"], "transcribe": t["transcribe"]},
        no_timestamps_token_id=t["no_timestamps"], prev_sot_token_id=t["prev"],
        max_initial_timestamp_index=50, max_length=448,
        forced_decoder_ids=[[1, None], [2, t["transcribe"]]], return_timestamps=False)


def whisper(dims: str = "tiny", vocab: int = WHISPER_VOCAB, init_std: float = 0.2,
            frames: int = 3000, seed: int = 0):
    """A ``WhisperForConditionalGeneration`` (eval) at ``dims`` (:data:`WHISPER_DIMS`),
    ``frames`` log-mel frames per window (3,000: 30 s), random weights."""
    tf = import_transformers()
    width, layers, heads, ffn = WHISPER_DIMS[dims]
    t = whisper_special_tokens(vocab)
    config = tf.WhisperConfig(
        vocab_size=vocab, num_mel_bins=80, max_source_positions=frames // 2,
        max_target_positions=448, d_model=width, encoder_layers=layers, decoder_layers=layers,
        encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=ffn,
        decoder_ffn_dim=ffn, decoder_start_token_id=t["sot"], bos_token_id=t["eot"],
        eos_token_id=t["eot"], pad_token_id=t["eot"], init_std=init_std)
    torch.manual_seed(seed)
    model = tf.WhisperForConditionalGeneration(config).eval()
    model.generation_config = whisper_generation_config(vocab)
    return model


def save_whisper_folder(folder, dims: str = "tiny", vocab: int = WHISPER_VOCAB,
                        init_std: float = 0.2, frames: int = 3000, seed: int = 0) -> Path:
    """:func:`whisper` saved as a transformers folder, with ``preprocessor_config.json``."""
    folder = Path(folder)
    model = whisper(dims, vocab, init_std, frames, seed)
    model.save_pretrained(folder)
    import_transformers().WhisperFeatureExtractor(feature_size=80, chunk_length=frames // 100,
                            n_samples=frames * 160, nb_max_frames=frames).save_pretrained(folder)
    return folder


def bart(vocab: int = 300, width: int = 64, layers: int = 2, heads: int = 4,
         positions: int = 128, init_std: float = 0.2, seed: int = 0):
    """A ``BartForConditionalGeneration`` (eval), random weights, tied head."""
    tf = import_transformers()
    config = tf.BartConfig(vocab_size=vocab, d_model=width, encoder_layers=layers,
                        decoder_layers=layers, encoder_attention_heads=heads,
                        decoder_attention_heads=heads, encoder_ffn_dim=2 * width,
                        decoder_ffn_dim=2 * width, max_position_embeddings=positions,
                        init_std=init_std)
    torch.manual_seed(seed)
    return tf.BartForConditionalGeneration(config).eval()


def features(mels: int = 80, frames: int = 3000, seed: int = 0,
             scale: Optional[float] = 0.5) -> torch.Tensor:
    """Random log-mel features (1, mels, frames), seeded."""
    return torch.randn(1, mels, frames, generator=torch.Generator().manual_seed(seed)) * scale
