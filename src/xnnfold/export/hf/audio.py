"""``xnnfold hf`` on an audio-text-to-text folder (:data:`xnnfold.export.multimodal.audio.
AUDIO_SUPPORTED`: Voxtral): the .pte executorch's ``MultimodalRunner`` runs with an ``Audio``
input, written, checked against eager and, with ``--compare``, beside stock's lowering of the
same programs, timed; the folder's tokenizer copied beside it and the runner's command lines
printed.

The check: one seeded random chunk of mel features, a prompt of ``--tokens`` random text
tokens with the chunk's run of audio tokens after the first, then
:data:`~xnnfold.export.hf.plan.CHECK_STEPS` greedy steps (the runner's calls:
:class:`~xnnfold.export.multimodal.audio_runtime.AudioGenerator`); the audio's embeddings
against eager's (``audio_encoder``), the prompt's last logits (``prefill``) and each step's
(``decode``) against eager transformers' logits of the whole sequence at once, with the audio
(no cache), each row at its own scale.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Optional

from ..multimodal.audio import AUDIO_ENCODER, AUDIO_MARK, AudioEmbeddings, audio_size, \
    export_audio_text_to_text
from .multimodal import Front, export_encoder_generation

# Voxtral's published tokenizer (mistral-common's Tekken): executorch's runner loads a file of
# this name as one (llm_runner_helper.cpp's load_tokenizer); xnnfold generate's tokenizer does not
TEKKEN = "tekken.json"


def _copy_tekken(folder: Path, destination: Path) -> Optional[Path]:
    """``folder``'s tekken.json copied into ``destination`` (where it is not already), or None
    when another file of that name is there."""
    import filecmp
    import shutil

    source, target = folder / TEKKEN, destination / TEKKEN
    if target.is_file() and not filecmp.cmp(source, target, shallow=False):
        return None
    if source.resolve() != target.resolve():
        shutil.copyfile(source, target)
    return target


def runner_notes(output: Path, folder: Optional[str], metadata: dict) -> list:
    """The folder's tokenizer copied beside ``output``, and how to run the .pte with it."""
    from ..llm.text import copy_tokenizer

    tokenizer = None if folder is None else copy_tokenizer(folder, output.parent)
    if tokenizer is None and folder is not None and (Path(folder) / TEKKEN).is_file():
        tokenizer = _copy_tekken(Path(folder), output.parent)
        if tokenizer is None:
            return [f"{output.parent / TEKKEN} exists and is not {folder}'s: not copied; give "
                    f"executorch's runner {Path(folder) / TEKKEN}"]
    if tokenizer is None:
        return [f"no tokenizer in {folder} (tokenizer.json, tokenizer.model, {TEKKEN}): "
                "executorch's runner needs one"]
    token, count = metadata["get_audio_token_id"], metadata["get_audio_tokens"]
    # xnnfold generate reads text with the tokenizers it loads as the runner's (not Tekken)
    prompt = f"--tokens IDS (the prompt's ids, {count} audio tokens {token} a chunk)" \
        if tokenizer.name == TEKKEN else f"--prompt '{AUDIO_MARK} What is said?'"
    return [f"its tokenizer: {tokenizer} (copied from {folder})",
            f"run it: xnnfold generate {output} --audio FEATURES.pt {prompt} --max-new 32 "
            "(FEATURES.pt: the processor's input_features, saved with torch.save)",
            "executorch's runner (Python): from executorch.extension.llm.runner import "
            "GenerationConfig, MultimodalRunner, make_audio_input, make_token_input; "
            f"MultimodalRunner({str(output)!r}, {str(tokenizer)!r}).generate([make_token_input("
            f"BEFORE), make_audio_input(input_features), make_token_input(AFTER)], "
            "GenerationConfig(max_new_tokens=32, temperature=0), print) (BEFORE, AFTER: the "
            f"prompt's token ids around its run of {count} audio tokens {token})"]


def _generator(pte: bytes):
    from ..multimodal.audio_runtime import AudioGenerator

    return AudioGenerator(pte)


AUDIO = Front(
    kind="audio", encoder=AUDIO_ENCODER, export=export_audio_text_to_text,
    generator=_generator, embeddings=lambda model: AudioEmbeddings(model),
    eager_inputs=lambda _, features: {"input_features": features}, size=audio_size,
    describe=lambda meta: "one chunk of {} mel bins x {} frames".format(
        *meta["get_audio_size"]),
    runner_notes=lambda output, folder, meta, _: runner_notes(output, folder, meta))
export_audio_generation = partial(export_encoder_generation, AUDIO)
