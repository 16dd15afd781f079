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
from pathlib import Path
from typing import Optional

import torch

from . import plan as hf_plan, rows as hf_rows
from ...usage import OptionError
from ...pte.files import write_atomically
from ..multimodal.export import (TEXT_DECODER, VISION_ENCODER, export_image_text_to_text,
                                 image_embeddings)

PHASES = (VISION_ENCODER, "prefill", "decode")


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


def check_prompt(generation, tokens: int, seed: int = 0) -> tuple:
    """(token ids with the image's run after the first, the image): seeded, random."""
    generator = torch.Generator().manual_seed(seed)
    meta = generation.metadata
    text = torch.randint(0, meta["get_vocab_size"] - 1, (tokens,), generator=generator)
    text[text >= meta["get_image_token_id"]] += 1          # never the image token itself
    ids = text.tolist()
    ids = ids[:1] + [meta["get_image_token_id"]] * meta["get_image_tokens"] + ids[1:]
    return ids, torch.randn(1, *meta["get_image_size"], generator=generator)


def check(model, generator, ids: list, image: torch.Tensor) -> tuple:
    """(vision encoder's, prefill's, decode's verdicts) of ``generator`` against eager."""
    from ...pte.compare import compare_outputs

    run = generator.generate(ids, [image], hf_plan.CHECK_STEPS + 1, stop_at_eos=False,
                             keep_logits=True)
    vision = image_embeddings(model)
    with torch.no_grad():
        embeddings = vision(image)
        eager = model(input_ids=torch.tensor([ids + run.tokens[:-1]]),
                      pixel_values=vision.model_pixels(image),
                      use_cache=False).logits[0, len(ids) - 1:]
    got = torch.cat(run.logits)
    return (compare_outputs(generator.encode_image(image)[0], embeddings[0], per_row=True),
            compare_outputs(got[:1], eager[:1], per_row=True),
            compare_outputs(got[1:], eager[1:], per_row=True))


def _time(generators: dict, ids: list, image, steps: int, rounds: int) -> dict:
    """{variant: (vision encoder ms, prefill ms, decode ms per step)}, medians, interleaved."""
    from ...pte.timing import medians_interleaved

    def measure(generator) -> tuple:
        start = time.perf_counter()
        generator.encode_image(image)
        encoder = time.perf_counter() - start
        run = generator.generate(ids, [image], steps + 1, stop_at_eos=False)
        return encoder * 1e3, run.prefill_seconds * 1e3, run.decode_seconds * 1e3 / steps

    return medians_interleaved(generators, measure, rounds, warmup=2)


def export_multimodal_generation(model, output: Path, compare: bool, tokens: int, reps: int,
                                 prefer: str, check_it: bool, max_cache: Optional[int],
                                 max_prefill: Optional[int], folder: Optional[str] = None
                                 ) -> "hf_rows.Exported":
    """The .pte of ``model`` written to ``output``, checked; with ``compare``, stock's beside
    it, timed interleaved. ``folder``'s tokenizer files are copied beside ``output``."""
    from ...pte import STOCK, XNNFOLD
    from ..multimodal.runtime import MultimodalGenerator

    name = type(model).__name__
    _check_room(model, tokens, max_cache, max_prefill)
    with hf_rows.failing_as_usage(f"{name}: the export of its vision encoder, token embedding "
                                  "and text decoder"):
        generation = export_image_text_to_text(model, max_cache, max_prefill)
    variants = [STOCK, XNNFOLD] if compare else [XNNFOLD]
    with hf_rows.failing_as_usage(f"lowering {name}'s methods"):
        lowered = {variant: _lower(generation, variant, prefer) for variant in variants}
    write_atomically(output, lowered[XNNFOLD].pte)
    generators = {v: MultimodalGenerator(low.pte) for v, low in lowered.items()}
    ids, image = check_prompt(generation, tokens)
    verdicts = {v: check(model, g, ids, image) if check_it else (None,) * 3
                for v, g in generators.items()}
    timed = _time(generators, ids, image, hf_plan.CHECK_STEPS, reps) if compare else {}
    exported = hf_rows.Exported([], [], [])
    for variant, low in lowered.items():
        for index, phase in enumerate(PHASES):
            verdict = verdicts[variant][index]
            if verdict is not None and not verdict.ok and variant == XNNFOLD:
                exported.wrong.append(f"{output} ({phase}): {verdict}")
            gemms, calls = low.by_method[VISION_ENCODER if index == 0 else TEXT_DECODER]
            exported.rows.append(hf_rows.row(
                phase, variant, low, verdict, timed[variant][index] if timed else None,
                str(output) if variant == XNNFOLD else "", len(gemms), calls))
    exported.notes.append(
        f"{output}: methods vision_encoder (one image of "
        f"{' x '.join(str(s) for s in generation.metadata['get_image_size'])}: "
        f"{generation.metadata['get_image_tokens']} embeddings), token_embedding, "
        f"text_decoder (1 to {generation.max_prefill} embeddings a call) over a static KV "
        f"cache of {generation.max_cache} rows; the rows above: the vision encoder, the "
        f"text decoder's prefill of {len(ids)} positions with the image and its decode")
    exported.notes.extend(hf_plan.as_options(line) for line in generation.capped)
    exported.notes += runner_notes(output, folder, generation.metadata, name)
    for variant, (encoder_ms, prefill_ms, decode_ms) in timed.items():
        exported.notes.append(
            f"{variant}: vision encoder {encoder_ms:.3f} ms; prefill of {len(ids)} positions "
            f"(the image's included) {prefill_ms:.3f} ms; decode {decode_ms:.3f} ms per token;"
            f" medians of {reps} interleaved rounds")
    return exported


def _check_room(model, tokens: int, max_cache: Optional[int], max_prefill: Optional[int]
                ) -> None:
    """One line, before any export, when the check's prompt (its tokens, the image's
    embeddings, the decode steps) does not fit the cache."""
    from ..llm.sizes import cache_sizes, positions_of
    from ..multimodal.export import image_size

    rows = cache_sizes(positions_of(model), max_cache, max_prefill)[0]
    with torch.no_grad():
        image_tokens = int(image_embeddings(model)(torch.zeros(1, *image_size(model))).shape[1])
    if tokens + image_tokens + hf_plan.CHECK_STEPS > rows:
        raise OptionError(f"`tokens` {tokens}: the check runs {tokens} + the image's "
                          f"{image_tokens} + {hf_plan.CHECK_STEPS} positions, the cache has "
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
