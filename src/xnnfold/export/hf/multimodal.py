"""``xnnfold hf`` on an image-text-to-text folder (:data:`xnnfold.export.multimodal.export.
SUPPORTED`): the .pte
executorch's ``MultimodalRunner`` runs, written, checked against eager and, with ``--compare``,
beside stock's lowering of the same programs, timed; the folder's tokenizer copied beside it
and the runner's command lines printed.

The check: one seeded random image, a prompt of ``--tokens`` random text tokens with the
image's run of image tokens after the first, then
:data:`~xnnfold.export.hf.plan.CHECK_STEPS` greedy steps (the runner's calls:
:class:`~xnnfold.export.multimodal.runtime.MultimodalGenerator`); the image's embeddings
against eager's (``vision_encoder``), the prompt's last logits (``prefill``) and each step's (``decode``) against eager transformers'
logits of the whole sequence at once, with the image (no cache), each row at its own scale.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable, Optional

import torch

from . import plan as hf_plan, rows as hf_rows
from ...usage import OptionError
from ...pte.files import write_atomically
from ..multimodal.export import (TEXT_DECODER, VISION_ENCODER, export_image_text_to_text,
                                 image_embeddings, image_size)

@dataclass(frozen=True)
class Front:
    """What an encoder-fronted model's export, check and notes differ by (an image's or an
    audio's): the rest, :func:`export_encoder_generation`, is one."""
    kind: str                   # "image", "audio": the .pte's get_<kind>_* constants' names
    encoder: str                # its method (vision_encoder, audio_encoder)
    export: Callable            # (model, max_cache, max_prefill) -> the generation's programs
    generator: Callable         # a .pte's bytes -> its generator on the runtime
    embeddings: Callable        # model -> the module of one input's embeddings (1, N, hidden)
    eager_inputs: Callable      # (that module, the input) -> the model's forward's keywords
    size: Callable              # model -> one input's shape, without the batch
    describe: Callable          # the .pte's constants -> what the encoder takes, in words
    runner_notes: Callable      # (output, folder, constants, architecture) -> notes

    @property
    def label(self) -> str:
        return self.encoder.replace("_", " ")


class _Lowering:
    """What a table row reads of one lowered .pte: its bytes, its lowering's seconds, and per
    method the GEMMs left outside XNNPACK and the delegate calls."""

    def __init__(self, pte: bytes, seconds: float, inspected: dict):
        from ...analysis.gemms import EDGE_GEMM_NAMES

        self.pte, self.pte_bytes, self.lower_seconds = pte, len(pte), seconds
        self.by_method = {method: ([op for op in ops if op in EDGE_GEMM_NAMES], calls)
                          for method, (ops, calls) in inspected.items()}


def _lower(generation, variant: str, prefer: str) -> _Lowering:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
        XnnpackPartitioner as StockXnnpackPartitioner,
    )

    from ..llm import lower_generation
    from ...pte import STOCK, inspect_lowered

    def inspect(edge) -> dict:
        return {m: inspect_lowered(edge.exported_program(m))[:2] for m in generation.programs}

    start = time.perf_counter()
    if variant == STOCK:
        lowered = lower_generation(generation, StockXnnpackPartitioner, before_emit=inspect)
    else:
        lowered = lower_generation(generation, partitioner_kwargs={"prefer": prefer},
                                   before_emit=inspect)
    return _Lowering(lowered.pte, time.perf_counter() - start, lowered.inspected)


def check_prompt(generation, tokens: int, kind: str = "image", seed: int = 0) -> tuple:
    """(token ids with one ``kind`` input's run after the first, the input): seeded,
    random."""
    generator = torch.Generator().manual_seed(seed)
    meta = generation.metadata
    token = meta[f"get_{kind}_token_id"]
    text = torch.randint(0, meta["get_vocab_size"] - 1, (tokens,), generator=generator)
    text[text >= token] += 1          # never the input's token itself
    ids = text.tolist()
    ids = ids[:1] + [token] * meta[f"get_{kind}_tokens"] + ids[1:]
    return ids, torch.randn(1, *meta[f"get_{kind}_size"], generator=generator)


def check(front: Front, model, generator, ids: list, value: torch.Tensor) -> tuple:
    """(the encoder's, prefill's, decode's verdicts) of ``generator`` against eager."""
    from ...pte.compare import compare_outputs

    run = generator.generate(ids, [value], hf_plan.CHECK_STEPS + 1, stop_at_eos=False,
                             keep_logits=True)
    encoder = front.embeddings(model)
    with torch.no_grad():
        embeddings = encoder(value)
        eager = model(input_ids=torch.tensor([ids + run.tokens[:-1]]),
                      **front.eager_inputs(encoder, value),
                      use_cache=False).logits[0, len(ids) - 1:]
    got = torch.cat(run.logits)
    return (compare_outputs(generator.encode(front.kind, value)[0], embeddings[0],
                            per_row=True),
            compare_outputs(got[:1], eager[:1], per_row=True),
            compare_outputs(got[1:], eager[1:], per_row=True))


def _time(front: Front, generators: dict, ids: list, value, steps: int, rounds: int) -> dict:
    """{variant: (encoder ms, prefill ms, decode ms per step)}, medians, interleaved."""
    from ...pte.timing import medians_interleaved

    def measure(generator) -> tuple:
        start = time.perf_counter()
        generator.encode(front.kind, value)
        encoder = time.perf_counter() - start
        run = generator.generate(ids, [value], steps + 1, stop_at_eos=False)
        return encoder * 1e3, run.prefill_seconds * 1e3, run.decode_seconds * 1e3 / steps

    return medians_interleaved(generators, measure, rounds, warmup=2)


def export_encoder_generation(front: Front, model, output: Path, compare: bool, tokens: int,
                              reps: int, prefer: str, check_it: bool, max_cache: Optional[int],
                              max_prefill: Optional[int], folder: Optional[str] = None
                              ) -> "hf_rows.Exported":
    """The .pte of ``model`` written to ``output``, checked; with ``compare``, stock's beside
    it, timed interleaved. ``folder``'s tokenizer files are copied beside ``output``."""
    from ...pte import STOCK, XNNFOLD

    name, kind = type(model).__name__, front.kind
    _check_room(front, model, tokens, max_cache, max_prefill)
    with hf_rows.failing_as_usage(f"{name}: the export of its {front.label}, token embedding "
                                  "and text decoder"):
        generation = front.export(model, max_cache, max_prefill)
    variants = [STOCK, XNNFOLD] if compare else [XNNFOLD]
    with hf_rows.failing_as_usage(f"lowering {name}'s methods"):
        lowered = {variant: _lower(generation, variant, prefer) for variant in variants}
    write_atomically(output, lowered[XNNFOLD].pte)
    generators = {v: front.generator(low.pte) for v, low in lowered.items()}
    ids, value = check_prompt(generation, tokens, kind)
    verdicts = {v: check(front, model, g, ids, value) if check_it else (None,) * 3
                for v, g in generators.items()}
    timed = _time(front, generators, ids, value, hf_plan.CHECK_STEPS, reps) if compare else {}
    exported = hf_rows.Exported([], [], [])
    for variant, low in lowered.items():
        for index, phase in enumerate((front.encoder, "prefill", "decode")):
            verdict = verdicts[variant][index]
            if verdict is not None and not verdict.ok and variant == XNNFOLD:
                exported.wrong.append(f"{output} ({phase}): {verdict}")
            gemms, calls = low.by_method[front.encoder if index == 0 else TEXT_DECODER]
            exported.rows.append(hf_rows.row(
                phase, variant, low, verdict, timed[variant][index] if timed else None,
                str(output) if variant == XNNFOLD else "", len(gemms), calls))
    meta = generation.metadata
    exported.notes.append(
        f"{output}: methods {front.encoder} ({front.describe(meta)}: "
        f"{meta[f'get_{kind}_tokens']} embeddings), token_embedding, text_decoder (1 to "
        f"{generation.max_prefill} embeddings a call) over a static KV cache of "
        f"{generation.max_cache} rows; the rows above: the {front.label}, the text decoder's "
        f"prefill of {len(ids)} positions with the {kind} and its decode")
    exported.notes.extend(hf_plan.as_options(line) for line in generation.capped)
    exported.notes += front.runner_notes(output, folder, meta, name)
    for variant, (encoder_ms, prefill_ms, decode_ms) in timed.items():
        exported.notes.append(
            f"{variant}: {front.label} {encoder_ms:.3f} ms; prefill of {len(ids)} positions "
            f"(the {kind}'s included) {prefill_ms:.3f} ms; decode {decode_ms:.3f} ms per "
            f"token; medians of {reps} interleaved rounds")
    return exported


def _check_room(front: Front, model, tokens: int, max_cache: Optional[int],
                max_prefill: Optional[int]) -> None:
    """One line, before any export, when the check's prompt (its tokens, the input's
    embeddings, the decode steps) does not fit the cache."""
    from ..llm.sizes import cache_sizes, positions_of

    rows = cache_sizes(positions_of(model), max_cache, max_prefill)[0]
    with torch.no_grad():
        count = int(front.embeddings(model)(torch.zeros(1, *front.size(model))).shape[1])
    if tokens + count + hf_plan.CHECK_STEPS > rows:
        raise OptionError(f"`tokens` {tokens}: the check runs {tokens} + the {front.kind}'s "
                          f"{count} + {hf_plan.CHECK_STEPS} positions, the cache has "
                          f"{rows} rows (`max_cache`)")


# How each family's processor is called for one image, and how its output reaches the runner:
# executorch's generate_hf takes one image and one run of image tokens (LLaVA's); SmolVLM's
# pixel_values are (1, K, C, H, W), K - 1 crops and the global image, each with its own run
# (one without splitting), which xnnfold's runner_inputs gives the runner as a list.
_RUNNER_CALLS = {
    "LlavaForConditionalGeneration": (
        "USER: <image>\\nWhat is in it? ASSISTANT:", "", "USER: <image>\\nWhat is in it? "
        "ASSISTANT:",
        "generate_hf(inputs, GenerationConfig(max_new_tokens=32, temperature=0), "
        "image_token_id={image_token})"),
    "SmolVLMForConditionalGeneration": (
        "User:<image>What is in it?<end_of_utterance>\\nAssistant:",
        ", do_image_splitting=False",
        "User:<fake_token_around_image><global-img><image><fake_token_around_image>What is in "
        "it?<end_of_utterance>\\nAssistant:",
        "generate(runner_inputs(inputs, {image_token}), GenerationConfig(max_new_tokens=32, "
        "temperature=0)) (runner_inputs: from xnnfold.export.multimodal; it takes the crops "
        "of do_image_splitting=True too)"),
}


def runner_notes(output: Path, folder: Optional[str], metadata: dict, architecture: str
                 ) -> list:
    """The folder's tokenizer copied beside ``output``, and how to run the .pte with it."""
    from ..llm.text import copy_tokenizer

    tokenizer = None if folder is None else copy_tokenizer(folder, output.parent)
    if tokenizer is None:
        return [f"no tokenizer in {folder} (tokenizer.json, tokenizer.model): executorch's "
                "runner needs one"]
    prompt, processor_options, cli_prompt, call = _RUNNER_CALLS[architecture]
    pixels = "pixel_values" + (f" (with{processor_options[1:]})" if processor_options else "")
    return [f"its tokenizer: {tokenizer} (copied from {folder})",
            f"run it: xnnfold generate {output} --image IMAGE.pt --prompt '{cli_prompt}' "
            f"--max-new 32 (IMAGE.pt: the processor's {pixels}, saved with torch.save)",
            "executorch's runner (Python): from PIL import Image; from transformers import "
            "AutoProcessor; from executorch.extension.llm.runner import GenerationConfig, "
            f"MultimodalRunner; inputs = AutoProcessor.from_pretrained({str(folder)!r})("
            f"images=Image.open('image.png'), text='{prompt}'{processor_options}, "
            f"return_tensors='pt'); MultimodalRunner({str(output)!r}, {str(tokenizer)!r})."
            + call.format(image_token=metadata["get_image_token_id"])]


def _generator(pte: bytes):
    from ..multimodal.runtime import MultimodalGenerator

    return MultimodalGenerator(pte)


IMAGE = Front(
    kind="image", encoder=VISION_ENCODER, export=export_image_text_to_text,
    generator=_generator, embeddings=image_embeddings,
    eager_inputs=lambda vision, image: {"pixel_values": vision.model_pixels(image)},
    size=image_size,
    describe=lambda meta: "one image of " + " x ".join(str(s) for s in meta["get_image_size"]),
    runner_notes=runner_notes)
export_multimodal_generation = partial(export_encoder_generation, IMAGE)
