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

import time
from pathlib import Path
from typing import Optional

import torch

from . import plan as hf_plan, rows as hf_rows
from ...usage import OptionError
from ...pte.files import write_atomically
from ..multimodal.audio import AUDIO_ENCODER, AUDIO_MARK, AudioEmbeddings, audio_size, \
    export_audio_text_to_text
from ..multimodal.export import TEXT_DECODER
from .multimodal import _lower

PHASES = (AUDIO_ENCODER, "prefill", "decode")
# Voxtral's published tokenizer (mistral-common's Tekken): executorch's runner loads a file of
# this name as one (llm_runner_helper.cpp's load_tokenizer); xnnfold generate's tokenizer does not
TEKKEN = "tekken.json"


def check_prompt(generation, tokens: int, seed: int = 0) -> tuple:
    """(token ids with the audio's run after the first, the features): seeded, random."""
    generator = torch.Generator().manual_seed(seed)
    meta = generation.metadata
    text = torch.randint(0, meta["get_vocab_size"] - 1, (tokens,), generator=generator)
    text[text >= meta["get_audio_token_id"]] += 1          # never the audio token itself
    ids = text.tolist()
    ids = ids[:1] + [meta["get_audio_token_id"]] * meta["get_audio_tokens"] + ids[1:]
    return ids, torch.randn(1, *meta["get_audio_size"], generator=generator)


def check(model, generator, ids: list, features: torch.Tensor) -> tuple:
    """(audio encoder's, prefill's, decode's verdicts) of ``generator`` against eager."""
    from ...pte.compare import compare_outputs

    run = generator.generate(ids, [features], hf_plan.CHECK_STEPS + 1, stop_at_eos=False,
                             keep_logits=True)
    with torch.no_grad():
        embeddings = AudioEmbeddings(model)(features)
        eager = model(input_ids=torch.tensor([ids + run.tokens[:-1]]), input_features=features,
                      use_cache=False).logits[0, len(ids) - 1:]
    got = torch.cat(run.logits)
    return (compare_outputs(generator.encode_audio(features)[0], embeddings[0], per_row=True),
            compare_outputs(got[:1], eager[:1], per_row=True),
            compare_outputs(got[1:], eager[1:], per_row=True))


def _time(generators: dict, ids: list, features, steps: int, rounds: int) -> dict:
    """{variant: (audio encoder ms, prefill ms, decode ms per step)}, medians, interleaved."""
    from ...pte.timing import medians_interleaved

    def measure(generator) -> tuple:
        start = time.perf_counter()
        generator.encode_audio(features)
        encoder = time.perf_counter() - start
        run = generator.generate(ids, [features], steps + 1, stop_at_eos=False)
        return encoder * 1e3, run.prefill_seconds * 1e3, run.decode_seconds * 1e3 / steps

    return medians_interleaved(generators, measure, rounds, warmup=2)


def export_audio_generation(model, output: Path, compare: bool, tokens: int, reps: int,
                            prefer: str, check_it: bool, max_cache: Optional[int],
                            max_prefill: Optional[int], folder: Optional[str] = None
                            ) -> "hf_rows.Exported":
    """The .pte of ``model`` written to ``output``, checked; with ``compare``, stock's beside
    it, timed interleaved. ``folder``'s tokenizer files are copied beside ``output``."""
    from ...pte import STOCK, XNNFOLD
    from ..multimodal.audio_runtime import AudioGenerator

    name = type(model).__name__
    _check_room(model, tokens, max_cache, max_prefill)
    with hf_rows.failing_as_usage(f"{name}: the export of its audio encoder, token embedding "
                                  "and text decoder"):
        generation = export_audio_text_to_text(model, max_cache, max_prefill)
    variants = [STOCK, XNNFOLD] if compare else [XNNFOLD]
    with hf_rows.failing_as_usage(f"lowering {name}'s methods"):
        lowered = {variant: _lower(generation, variant, prefer) for variant in variants}
    write_atomically(output, lowered[XNNFOLD].pte)
    generators = {v: AudioGenerator(low.pte) for v, low in lowered.items()}
    ids, features = check_prompt(generation, tokens)
    verdicts = {v: check(model, g, ids, features) if check_it else (None,) * 3
                for v, g in generators.items()}
    timed = _time(generators, ids, features, hf_plan.CHECK_STEPS, reps) if compare else {}
    exported = hf_rows.Exported([], [], [])
    for variant, low in lowered.items():
        for index, phase in enumerate(PHASES):
            verdict = verdicts[variant][index]
            if verdict is not None and not verdict.ok and variant == XNNFOLD:
                exported.wrong.append(f"{output} ({phase}): {verdict}")
            gemms, calls = low.by_method[AUDIO_ENCODER if index == 0 else TEXT_DECODER]
            exported.rows.append(hf_rows.row(
                phase, variant, low, verdict, timed[variant][index] if timed else None,
                str(output) if variant == XNNFOLD else "", len(gemms), calls))
    meta = generation.metadata
    bins, frames = meta["get_audio_size"]
    exported.notes.append(
        f"{output}: methods audio_encoder (one chunk of {bins} mel bins x {frames} frames: "
        f"{meta['get_audio_tokens']} embeddings), token_embedding, text_decoder (1 to "
        f"{generation.max_prefill} embeddings a call) over a static KV cache of "
        f"{generation.max_cache} rows; the rows above: the audio encoder, the text decoder's "
        f"prefill of {len(ids)} positions with the audio and its decode")
    exported.notes.extend(hf_plan.as_options(line) for line in generation.capped)
    exported.notes += runner_notes(output, folder, meta)
    for variant, (encoder_ms, prefill_ms, decode_ms) in timed.items():
        exported.notes.append(
            f"{variant}: audio encoder {encoder_ms:.3f} ms; prefill of {len(ids)} positions "
            f"(the audio's included) {prefill_ms:.3f} ms; decode {decode_ms:.3f} ms per token;"
            f" medians of {reps} interleaved rounds")
    return exported


def _check_room(model, tokens: int, max_cache: Optional[int], max_prefill: Optional[int]
                ) -> None:
    """One line, before any export, when the check's prompt (its tokens, the audio's
    embeddings, the decode steps) does not fit the cache."""
    from ..llm.sizes import cache_sizes, positions_of

    rows = cache_sizes(positions_of(model), max_cache, max_prefill)[0]
    with torch.no_grad():
        audio_tokens = int(AudioEmbeddings(model)(torch.zeros(1, *audio_size(model))).shape[1])
    if tokens + audio_tokens + hf_plan.CHECK_STEPS > rows:
        raise OptionError(f"`tokens` {tokens}: the check runs {tokens} + the audio's "
                          f"{audio_tokens} + {hf_plan.CHECK_STEPS} positions, the cache has "
                          f"{rows} rows (`max_cache`)")


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
