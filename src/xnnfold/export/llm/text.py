"""Text in and out of a generation .pte, with the tokenizer executorch's runner uses.

``TextLLMRunner`` / ``llama_main`` load a tokenizer with executorch's C++ tokenizers library
(pytorch-tokenizers, a dependency of executorch, whose Python package carries the same C++
classes): a Hugging Face ``tokenizer.json``, or a SentencePiece ``tokenizer.model``. They encode
a prompt with ``num_bos`` / ``num_eos`` (0 by default: a tokenizer.json's post-processor then
adds no special token) and print each generated token's piece. :class:`RunnerTokenizer` does
the same through those classes, so that ``xnnfold generate`` reads and prints text exactly as
the runner does. :func:`copy_tokenizer` puts a model folder's tokenizer files beside the .pte.
"""

from __future__ import annotations

import filecmp
import shutil
from pathlib import Path
from typing import Optional, Sequence

# What the runner loads, in the order looked for beside a .pte or in a model folder.
RUNNER_FILES = ("tokenizer.json", "tokenizer.model")
# Copied with it: the runner's tokenizer.json reader also reads these when it is given the
# folder (the BOS / EOS / UNK tokens).
COMPANIONS = ("tokenizer_config.json", "special_tokens_map.json")


def tokenizer_files(folder) -> list:
    """The tokenizer files of ``folder`` that :func:`copy_tokenizer` copies."""
    return [Path(folder) / name for name in RUNNER_FILES + COMPANIONS
            if (Path(folder) / name).is_file()]


def runner_tokenizer(folder) -> Optional[Path]:
    """The file of ``folder`` the runner is given (``tokenizer.json``, else
    ``tokenizer.model``), or None."""
    for name in RUNNER_FILES:
        if (Path(folder) / name).is_file():
            return Path(folder) / name
    return None


def copy_conflicts(folder, destination) -> list:
    """The files :func:`copy_tokenizer` would overwrite with different contents."""
    destination = Path(destination)
    return [destination / f.name for f in tokenizer_files(folder)
            if (destination / f.name).is_file() and
            not filecmp.cmp(f, destination / f.name, shallow=False)]


def copy_tokenizer(folder, destination) -> Optional[Path]:
    """Copy ``folder``'s tokenizer files into ``destination`` (nothing when it is the same
    folder); the file to give the runner there, or None when ``folder`` has none.
    ``ValueError`` (one line) rather than overwrite a different tokenizer."""
    folder, destination = Path(folder), Path(destination)
    conflicts = copy_conflicts(folder, destination)
    if conflicts:
        raise ValueError(f"{conflicts[0]} exists and is not {folder}'s: write the .pte to "
                         "another folder (its tokenizer goes beside it)")
    for source in tokenizer_files(folder):
        if source.resolve() != (destination / source.name).resolve():
            shutil.copyfile(source, destination / source.name)
    found = runner_tokenizer(folder)
    return None if found is None else destination / found.name


class RunnerTokenizer:
    """A tokenizer file loaded by executorch's C++ tokenizers, as the runner loads it."""

    def __init__(self, path):
        import pytorch_tokenizers as tokenizers

        self.path = Path(path)
        kinds = [tokenizers.CppHFTokenizer] if self.path.suffix == ".json" else \
            [tokenizers.CppSPTokenizer, tokenizers.CppLlama2cTokenizer]
        errors = []
        for kind in kinds:
            tokenizer = kind()
            try:
                tokenizer.load(str(self.path))
            except RuntimeError as error:
                errors.append(str(error).splitlines()[0] if str(error) else type(error).__name__)
                continue
            self._tokenizer = tokenizer
            break
        else:
            raise ValueError(f"{self.path}: not a tokenizer executorch's runner loads "
                             f"({'; '.join(errors)})")
        self.vocab_size = int(self._tokenizer.vocab_size())

    def encode(self, text: str, num_bos: int = 0, num_eos: int = 0) -> list:
        """The runner's prompt tokens (``GenerationConfig.num_bos`` / ``num_eos``)."""
        try:
            return [int(t) for t in self._tokenizer.encode(text, num_bos, num_eos)]
        except RuntimeError as error:
            raise ValueError(f"{self.path.name} cannot encode the prompt ({error})")

    def piece(self, token: int) -> str:
        """The text the runner prints for ``token``."""
        try:
            return self._tokenizer.decode(int(token))
        except RuntimeError:
            raise ValueError(f"token {token} has no text in {self.path.name} "
                             f"({self.vocab_size} tokens)")

    def decode(self, tokens: Sequence[int]) -> str:
        return "".join(self.piece(t) for t in tokens)


class SourceTokenizer:
    """A ``tokenizer.json`` read with Hugging Face's ``tokenizers`` (a dependency of
    executorch's ``pytorch-tokenizers``), as transformers' tokenizer reads it: for an encoder-decoder model's source,
    which no executorch runner reads, encoded with the special tokens its post-processor adds
    (BART's ``<s>`` ... ``</s>``, a ``RobertaProcessing`` that executorch's C++ tokenizers do
    not load)."""

    def __init__(self, path):
        from tokenizers import Tokenizer

        self.path = Path(path)
        try:
            self._tokenizer = Tokenizer.from_file(str(self.path))
        except Exception as error:  # noqa: BLE001 - the library raises its own kinds
            raise ValueError(f"{self.path}: not a tokenizer.json the tokenizers library "
                             f"reads ({str(error).splitlines()[0] if str(error) else error})")
        self.vocab_size = int(self._tokenizer.get_vocab_size())

    def encode(self, text: str, num_bos: int = 0) -> list:
        """``text``'s ids, the special tokens included (``num_bos``: 0, for the signature of
        :meth:`RunnerTokenizer.encode`)."""
        if num_bos:
            raise ValueError(f"num_bos {num_bos}: the tokenizer.json adds its own")
        return list(self._tokenizer.encode(text).ids)

    def decode(self, tokens: Sequence[int]) -> str:
        return self._tokenizer.decode([int(t) for t in tokens], skip_special_tokens=False)
