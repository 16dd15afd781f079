"""Whisper's prompt and logits processors, as transformers' ``generate`` builds them for a
short-form (one window, <= 30 s) input from the generation config, and the inputs a
transcription reads (log-mel features, or a 16 kHz WAV through the folder's feature extractor).

The prompt (``WhisperGenerationMixin._retrieve_init_tokens``): the start token; the language,
given or detected (``detect_language``: the first step's logits, over the language tokens
only); the task (given, else the config's ``forced_decoder_ids``, else ``transcribe`` when a
language is given); ``<|notimestamps|>`` unless the config asks for timestamps. Then, at each
generated step, ``suppress_tokens`` are never chosen and ``begin_suppress_tokens`` not at the
first one. Timestamps (``return_timestamps``) are not supported: refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from ...usage import first_line
from .extractor import WHERE, feature_extractor_file

SAMPLE_RATE = 16_000


class WhisperPrompt:
    """``generate``'s prompt (:attr:`prompt`, a ``None`` where the language is detected) and
    processors, from a generation config (the dict of generation_config.json)."""

    def __init__(self, config: dict, language: Optional[str] = None,
                 task: Optional[str] = None):
        if config.get("return_timestamps"):
            raise ValueError("the generation config asks for timestamps "
                             "(return_timestamps): not supported")
        if "decoder_start_token_id" not in config:
            raise ValueError("the generation config has no decoder_start_token_id")
        self.config = config
        self.prompt = self._prompt(language, task)
        self.suppress = torch.tensor(config.get("suppress_tokens") or [], dtype=torch.long)
        self.begin = torch.tensor(config.get("begin_suppress_tokens") or [], dtype=torch.long)

    def _language_id(self, language: str) -> int:
        ids = self.config.get("lang_to_id") or {}
        token = language if language in ids else f"<|{language.lower()}|>"
        if token not in ids:
            raise ValueError(f"language {language!r} is not one of the generation config's "
                             f"{len(ids)} (lang_to_id)")
        return ids[token]

    def _prompt(self, language, task) -> list:
        config = self.config
        tokens = [config["decoder_start_token_id"]]
        forced = config.get("forced_decoder_ids")
        if task is None and language is None and forced and forced[0][0] == 1:
            for index, (at, token) in enumerate(forced, start=1):
                if at != index:
                    raise ValueError(f"forced_decoder_ids {forced}: not Whisper's prompt")
                tokens.append(token)
        undefined = len(tokens) <= 1 or tokens[1] is None
        detect = language is None and bool(config.get("lang_to_id")) and undefined
        if language is not None:
            tokens[1:2] = [self._language_id(language)]
        elif detect:
            tokens[1:2] = [None]
        tasks = config.get("task_to_id") or {}
        if task is not None:
            if task not in tasks:
                raise ValueError(f"task {task!r} is not one of the generation config's "
                                 f"{sorted(tasks)} (task_to_id)")
            present = [i for i, t in enumerate(tokens) if t in tasks.values()]
            if present:
                tokens[present[0]] = tasks[task]
            else:
                tokens.append(tasks[task])
        elif language is not None and tasks and not any(t in tokens for t in tasks.values()):
            tokens.append(tasks["transcribe"])
        no_timestamps = config.get("no_timestamps_token_id")
        if no_timestamps is not None and tokens[-1] != no_timestamps:
            tokens.append(no_timestamps)
        return [t for i, t in enumerate(tokens) if t is not None or (detect and i == 1)]

    def fill(self, logits: torch.Tensor, position: int) -> int:
        """The language: the likeliest language token after the start token."""
        ids = torch.tensor(list(self.config["lang_to_id"].values()), dtype=torch.long)
        return int(ids[logits[ids].argmax()])

    def __call__(self, logits: torch.Tensor, index: int, prompt_length: int) -> torch.Tensor:
        """``logits`` of the token at ``index`` of the sequence, processed."""
        logits = logits.clone()
        logits[self.suppress] = float("-inf")
        if index == prompt_length:
            logits[self.begin] = float("-inf")
        return logits


def read_wav(path: Path) -> torch.Tensor:
    """A 16 kHz PCM WAV (8, 16, 24 or 32-bit integers; channels averaged) as float samples in
    [-1, 1], with the standard library's reader."""
    import wave

    import numpy as np

    try:
        with wave.open(str(path), "rb") as wav:
            rate, width, channels = wav.getframerate(), wav.getsampwidth(), wav.getnchannels()
            frames = wav.readframes(wav.getnframes())
    except (wave.Error, EOFError) as error:
        raise ValueError(f"not a PCM WAV file Python's wave module reads ({error})")
    if rate != SAMPLE_RATE:
        raise ValueError(f"sampled at {rate} Hz: Whisper takes {SAMPLE_RATE} Hz (resample it "
                         "first, e.g. with sox or ffmpeg)")
    if width == 3:                        # 24-bit: widen to 32 bits, sign kept
        raw = np.frombuffer(frames, np.uint8).reshape(-1, 3)
        samples = (np.pad(raw, ((0, 0), (1, 0))).view("<i4")[:, 0] >> 8).astype(np.float32)
        scale = 2.0 ** 23
    elif width == 1:                      # 8-bit WAV is unsigned
        samples = np.frombuffer(frames, np.uint8).astype(np.float32) - 128.0
        scale = 128.0
    else:
        samples = np.frombuffer(frames, {2: "<i2", 4: "<i4"}[width]).astype(np.float32)
        scale = 2.0 ** (8 * width - 1)
    samples = samples.reshape(-1, channels).mean(axis=1) / scale
    return torch.from_numpy(np.ascontiguousarray(samples))


def read_features(path, folder=None, mels: int = 80, frames: int = 3000) -> torch.Tensor:
    """Log-mel features ``(1, mels, frames)`` from a ``.npy`` / ``.pt`` file of
    ``(mels, frames)`` or ``(1, mels, frames)``, or from a 16 kHz ``.wav`` through the
    ``WhisperFeatureExtractor`` of ``folder`` (its preprocessor_config.json or
    processor_config.json: :mod:`.extractor`). ValueError, one line, for anything else."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".wav":
        if folder is None or feature_extractor_file(folder) is None:
            raise ValueError(f"{path}: a WAV needs the model folder's feature extractor "
                             f"({WHERE}) to compute its log-mel features")
        from ..transformers import import_transformers

        try:
            extractor = import_transformers().WhisperFeatureExtractor.from_pretrained(
                str(folder), local_files_only=True)
        except (OSError, ValueError, TypeError) as error:
            raise ValueError(f"{folder}: its feature extractor does not load "
                             f"({first_line(error)})")
        audio = read_wav(path)
        if len(audio) > extractor.n_samples:
            raise ValueError(f"{path}: {len(audio) / SAMPLE_RATE:.1f} s; one window takes "
                             f"{extractor.n_samples / SAMPLE_RATE:.0f} s (long-form audio is "
                             "not supported)")
        features = extractor(audio.numpy(), sampling_rate=SAMPLE_RATE,
                             return_tensors="pt").input_features
    elif suffix == ".npy":
        import numpy as np

        features = torch.from_numpy(np.load(path, allow_pickle=False))
    elif suffix in (".pt", ".pth"):
        features = torch.load(path, weights_only=True)
    else:
        raise ValueError(f"{path}: give log-mel features (.npy or .pt) or a 16 kHz .wav")
    if not isinstance(features, torch.Tensor) or features.dim() not in (2, 3):
        raise ValueError(f"{path}: not a tensor of (mels, frames) or (1, mels, frames)")
    features = features.reshape(1, *features.shape[-2:]).to(torch.float32)
    if tuple(features.shape[1:]) != (mels, frames):
        raise ValueError(f"{path}: features of shape {tuple(features.shape[1:])}, the .pte "
                         f"takes ({mels}, {frames})")
    return features
