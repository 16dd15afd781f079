"""A small byte-level BPE ``tokenizer.json`` for the tests that run executorch's runner on a
generation .pte: built with the ``tokenizers`` library, trained on seeded random words, exactly
``vocab`` tokens (the runner samples among the tokenizer's ids, so it must have the model's
vocabulary size). Its alphabet is the byte-level characters of printable ASCII only: every token
decodes to ASCII text, so each token the runner emits arrives in Python as a string
(``TextLLMRunner``'s token callback decodes UTF-8 and raises on a lone byte of a multi-byte
character)."""

from __future__ import annotations

import random

# GPT-2's byte-level alphabet maps bytes 33..126 to themselves and the space (32) to chr(288)
ASCII_ALPHABET = [chr(288)] + [chr(b) for b in range(33, 127)]
SPECIAL = ["<s>", "</s>"]


def byte_level_tokenizer(path, vocab: int, seed: int = 0):
    """Train, save to ``path`` and return the tokenizer (``tokenizers.Tokenizer``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 7))) for _ in range(400)]
    text = [" ".join(rng.choice(words) for _ in range(50)) for _ in range(60)]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(text, trainers.BpeTrainer(
        vocab_size=vocab, initial_alphabet=ASCII_ALPHABET, limit_alphabet=len(ASCII_ALPHABET),
        special_tokens=SPECIAL, show_progress=False))
    if tokenizer.get_vocab_size() != vocab:
        raise AssertionError(f"the tokenizer has {tokenizer.get_vocab_size()} tokens, not {vocab}")
    tokenizer.save(str(path))
    return tokenizer


def sentence(words: int, seed: int = 0) -> str:
    """Seeded text of ``words`` short lowercase words (a prompt)."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    return " ".join("".join(rng.choice(letters) for _ in range(rng.randint(2, 6)))
                    for _ in range(words))
