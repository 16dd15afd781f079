"""What ``xnnfold bench optimum-multimodal`` measures of each tool's .pte, in the same runner:

- Gemma3 / Voxtral: executorch's ``MultimodalRunner`` (pybindings) on the prompt's tokens
  around the image or the audio (``make_token_input`` / ``make_image_input`` /
  ``make_audio_input``), greedy; the prefill with the encoder and the decode per token from its
  ``Stats`` (whole milliseconds), the encoder method alone timed on ``executorch.runtime``, the
  text against transformers' ``generate`` on the same inputs (fp32), decoded by the folder's
  tokenizer;
- T5: the speech runner's calls (:class:`~xnnfold.export.seq2seq.Seq2SeqProgram`, which runs
  optimum-executorch's seq2seq .pte as it runs xnnfold's): the encoder, a decoder step at one
  position, the greedy ids against ``generate``.

Every timing is one thread, the tools in interleaved rounds (order shuffled each round),
medians; the share outside XNNPACK from an ETDump of the encoder and of a decode call.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from ..pte.timing import medians_interleaved


def _outside(pte: Path, inputs: tuple, method: str) -> str:
    """The share of ``method``'s time outside XNNPACK delegates (ETDump), with its top ops."""
    from ..pte.devtools import DELEGATE, operator_times

    ops = operator_times(pte.read_bytes(), inputs, runs=2, method=method)
    total = sum(ops.values()) or 1.0
    top = sorted(((ms, op) for op, ms in ops.items() if op != DELEGATE), reverse=True)[:3]
    return (f"{100 * (total - ops.get(DELEGATE, 0.0)) / total:.1f}% ("
            + ", ".join(f"{op} {ms:.1f} ms" for ms, op in top) + ")")


def multimodal_inputs(name: str, model, seed: int = 0) -> tuple:
    """(the runner's token ids before the media, the media tensor, its ids after, the whole
    prompt's ids) of a fixed prompt: 12 text tokens, the image's or the audio chunk's run of
    tokens (Gemma3's between its begin / end-of-image tokens, which are text), 12 more."""
    generator = torch.Generator().manual_seed(seed)
    config = model.config
    text = config.text_config
    words = [int(t) for t in torch.randint(100, 2000, (24,), generator=generator)]
    before, after = [text.bos_token_id] + words[:12], words[12:]
    if name == "gemma3":
        size = config.vision_config.image_size
        media = torch.rand(1, 3, size, size, generator=generator) * 2 - 1
        before, after = before + [config.boi_token_index], [config.eoi_token_index] + after
        run = [config.image_token_index] * config.mm_tokens_per_image
    else:
        audio = config.audio_config
        media = torch.randn(1, audio.num_mel_bins, 2 * audio.max_source_positions,
                            generator=generator)
        # the projector takes four of the encoder's states a row: 375 embeddings a chunk
        run = [config.audio_token_id] * (audio.max_source_positions * audio.hidden_size
                                         // audio.intermediate_size)
    return before, media, after, before + run + after


def eager_tokens(name: str, model, ids: list, media: torch.Tensor, new: int) -> list:
    inputs = {"input_ids": torch.tensor([ids])}      # transformers' greedy generate, fp32
    if name == "gemma3":
        inputs["pixel_values"] = media
        inputs["token_type_ids"] = (inputs["input_ids"] == model.config.image_token_index).long()
    else:
        inputs["input_features"] = media
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=new, do_sample=False)
    return out[0, len(ids):].tolist()


def prefill_logits(pte: Path, before: list, media: torch.Tensor, after: list) -> torch.Tensor:
    """The last position's logits after the runner's prefill calls, made on the runtime: the
    text before, the encoder's embeddings, the text after, one ``text_decoder`` call each."""
    from executorch.runtime import Runtime

    from ..pte.runner import load_llm_kernels

    load_llm_kernels(pte.read_bytes())
    program = Runtime.get().load_program(pte)
    embed, decode = program.load_method("token_embedding"), program.load_method("text_decoder")
    (image,) = program.load_method("vision_encoder").execute((media,))
    position, logits = 0, None
    for part in (embed.execute((torch.tensor([before]),))[0], image,
                 embed.execute((torch.tensor([after]),))[0]):
        rows = int(part.shape[1])
        (logits,) = decode.execute((part, torch.arange(position, position + rows)))
        position += rows
    return logits.reshape(-1, logits.shape[-1])[-1:]


def gemma3_mask_check(model, pte: Path, before: list, media, after: list) -> str:
    """The .pte's prefill logits against eager Gemma3's (its image tokens attending to each
    other both ways, ``token_type_ids``) and against eager's with a causal mask over the image
    (no ``token_type_ids``), each at the row's scale (:func:`~xnnfold.pte.compare`)."""
    from ..pte.compare import compare_outputs

    ids = torch.tensor([before + [model.config.image_token_index]
                        * model.config.mm_tokens_per_image + after])
    got = prefill_logits(pte, before, media, after)
    verdicts = []
    with torch.no_grad():
        for label, types in (("bidirectional (transformers')", (ids == model.config.
                              image_token_index).long()), ("causal", None)):
            eager = model(input_ids=ids, pixel_values=media, token_type_ids=types).logits[0, -1:]
            verdicts.append(f"vs eager {label}: {compare_outputs([got], [eager], per_row=True)}"
                            f", max |logit| {eager.abs().max():.2f}")
    return "; ".join(verdicts)


class InMultimodalRunner:
    """executorch's MultimodalRunner on one .pte, and its encoder method on the runtime."""

    def __init__(self, name: str, pte: Path, tokenizer: Path, media: torch.Tensor):
        from executorch.extension.llm.runner import MultimodalRunner
        from executorch.runtime import Runtime

        from ..pte.runner import load_llm_kernels

        load_llm_kernels(pte.read_bytes())
        self.pte, self.media = pte, media
        self.encoder_name = "vision_encoder" if name == "gemma3" else "audio_encoder"
        self.runner = MultimodalRunner(str(pte), str(tokenizer))
        self.encoder = Runtime.get().load_program(pte).load_method(self.encoder_name)

    def generate(self, before: list, after: list, new: int) -> tuple:
        """(prefill ms with the encoder, decode ms per token, text) of one greedy run."""
        from executorch.extension.llm.runner import (GenerationConfig, make_audio_input,
                                                     make_image_input, make_token_input)

        media = (make_image_input(self.media[0]) if self.encoder_name == "vision_encoder"
                 else make_audio_input(self.media))
        pieces, stats = [], []
        self.runner.reset()
        self.runner.generate([make_token_input(before), media, make_token_input(after)],
                             GenerationConfig(echo=False, max_new_tokens=new, temperature=0.0,
                                              warming=True), pieces.append, stats.append)
        s = stats[0]
        decode = (s.inference_end_ms - s.prompt_eval_end_ms) / max(1, s.num_generated_tokens - 1)
        return s.prompt_eval_end_ms - s.inference_start_ms, decode, "".join(pieces)

    def encode_ms(self) -> float:
        start = time.perf_counter()
        self.encoder.execute((self.media,))
        return (time.perf_counter() - start) * 1e3


class _DecodeStep:
    """One ``text_decoder`` call of one embedding at a fixed position (the cache left as the
    last call wrote it): the decode step alone, without the runner's sampling."""

    def __init__(self, pte: Path, width: int, position: int):
        from executorch.runtime import Runtime

        from ..pte.runner import load_llm_kernels

        load_llm_kernels(pte.read_bytes())
        self.method = Runtime.get().load_program(pte).load_method("text_decoder")
        embedding = torch.randn(1, 1, width, generator=torch.Generator().manual_seed(0))
        self.inputs = (embedding, torch.tensor([position]))

    def run(self, _=None):
        self.method.execute(self.inputs)


def decode_steps(ptes: dict, width: int, position: int, rounds: int) -> dict:
    """{tool: median ms} of :class:`_DecodeStep`, interleaved."""
    from ..pte.timing import time_interleaved

    steps = {tool: _DecodeStep(pte, width, position) for tool, pte in ptes.items()}
    return {tool: statistics.median(times)
            for tool, times in time_interleaved(steps, (), rounds).items()}


def measure_multimodal(name: str, folder: Path, ptes: dict, rounds: int, new: int) -> dict:
    """{tool: {column: value}} for Gemma3 / Voxtral (:class:`InMultimodalRunner`)."""
    import transformers
    from tokenizers import Tokenizer

    cls = (transformers.Gemma3ForConditionalGeneration if name == "gemma3"
           else transformers.VoxtralForConditionalGeneration)
    model = cls.from_pretrained(folder, dtype=torch.float32).eval()
    before, media, after, ids = multimodal_inputs(name, model)
    expected = eager_tokens(name, model, ids, media, new)
    masks = {tool: gemma3_mask_check(model, pte, before, media, after)
             for tool, pte in ptes.items()} if name == "gemma3" else {}
    width = model.config.text_config.hidden_size
    del model
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    reference = tokenizer.decode(expected, skip_special_tokens=True)   # the runner prints no end
    runners = {tool: InMultimodalRunner(name, pte, folder / "tokenizer.json", media)
               for tool, pte in ptes.items()}
    rows = {}
    for tool, runner in runners.items():
        _, _, text = runner.generate(before, after, new)
        rows[tool] = {"text equals generate": text == reference, "text": text[:60],
                      "expected": reference[:60], ".pte bytes": runner.pte.stat().st_size,
                      "encoder outside XNNPACK": _outside(runner.pte, (media,),
                                                          runner.encoder_name)}
        if tool in masks:
            rows[tool]["prefill logits"] = masks[tool]
    medians = medians_interleaved(
        runners, lambda r: (r.encode_ms(), *r.generate(before, after, new)[:2]), rounds)
    for tool, (encoder, prefill, decode) in medians.items():
        rows[tool].update({"encoder ms": encoder, "prefill ms": prefill,
                           "decode ms/token": decode, "prompt tokens": len(ids)})
    del runners
    for tool, step in decode_steps(ptes, width, len(ids), 10 * rounds).items():
        rows[tool]["decode step ms"] = step
    return rows


def measure_t5(folder: Path, ptes: dict, rounds: int, new: int, source: int = 128,
               position: int = 32) -> dict:
    """{tool: {column: value}} for T5 (:class:`Seq2SeqProgram` for both tools)."""
    import transformers

    from ..export.seq2seq import Seq2SeqProgram
    from .speech import Variant, portable_share, prepared, time_encoders, time_steps

    model = transformers.T5ForConditionalGeneration.from_pretrained(folder).eval()
    ids = torch.randint(2, model.config.vocab_size, (1, source),
                        generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model.generate(input_ids=ids, max_new_tokens=new, do_sample=False)[0, 1:]
    expected = expected.tolist()
    if expected[-1] == model.config.eos_token_id:       # the loop's tokens leave it out
        expected = expected[:-1]
    start = model.config.decoder_start_token_id
    variants = [Variant(tool, pte, Seq2SeqProgram(pte)) for tool, pte in ptes.items()]
    rows = {}
    for variant in variants:
        done = variant.program.generate(ids, new, [start])
        rows[variant.name] = {"ids equal generate": done.tokens == expected,
                              ".pte bytes": variant.files_bytes}
    prepared(variants, ids, position, expected)
    from .scripts.t5 import step_bytes

    steps = time_steps(variants, position, expected[0], step_bytes(model, source, position),
                       rounds)
    encoders = time_encoders(variants, ids, max(3, rounds // 3))
    for variant in variants:
        rows[variant.name].update({
            "encoder ms": encoders[variant.name], "decode ms/token": steps[variant.name],
            "step outside XNNPACK": portable_share(variant, position, expected[0]),
            "prompt tokens": source})
    return rows
