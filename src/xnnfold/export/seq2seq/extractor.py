"""Which file of a model folder holds its audio feature extractor, found the way transformers'
``FeatureExtractionMixin.get_feature_extractor_dict`` (5.x) finds it: ``processor_config.json``
when it holds the extractor's settings (``WhisperProcessor.save_pretrained`` writes them there,
under ``feature_extractor``), else ``preprocessor_config.json`` (``WhisperFeatureExtractor.
save_pretrained``, and transformers 4's processors). The standard library only: the command
line checks a WAV's folder with it before any heavy import."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

PROCESSOR_CONFIG = "processor_config.json"
PREPROCESSOR_CONFIG = "preprocessor_config.json"
# the keys of processor_config.json under which transformers looks for the extractor
_EXTRACTOR_KEYS = ("feature_extractor", "audio_processor")

WHERE = (f"{PREPROCESSOR_CONFIG}, or {PROCESSOR_CONFIG} with a feature_extractor entry as "
         "WhisperProcessor.save_pretrained writes it")


def feature_extractor_file(folder) -> Optional[Path]:
    """The file of ``folder`` its feature extractor loads from, or None when it has none.
    ValueError, one line, for a processor_config.json that is not a JSON object (transformers
    reads it first and fails on it)."""
    folder = Path(folder)
    processor = folder / PROCESSOR_CONFIG
    if processor.is_file():
        try:
            settings = json.loads(processor.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as error:
            raise ValueError(f"{processor}: not a readable JSON file ({error})")
        if not isinstance(settings, dict):
            raise ValueError(f"{processor}: not a JSON object")
        if any(key in settings for key in _EXTRACTOR_KEYS):
            return processor
    preprocessor = folder / PREPROCESSOR_CONFIG
    return preprocessor if preprocessor.is_file() else None
