"""``python -m xnnfold.bench.multimodal``: an image-text-to-text .pte (:mod:`xnnfold.export.
multimodal`) with a Llama text model of SmolLM2-135M's widths (``--layers`` of them) and, by
``--family``, LLaVA's vision at CLIP ViT-B/16 224 px dims (768 wide, 12 layers, 196 patches)
with its projector, or SmolVLM-256M's (SigLIP-base-patch16-512: 768 wide, 12 layers, 1024
patches; the pixel shuffle by 4, 64 embeddings a crop), random weights: the .pte's bytes,
each method's lowering, the vision encoder's time and the share of it on portable kernels (an
ETDump), the prefill of a prompt with the image (one call for its embeddings) and the decode
per token, medians, on the runtime. The runner's calls
(:class:`~xnnfold.export.multimodal.runtime.MultimodalGenerator`); the text decoder's greedy
tokens are checked against eager transformers'. ``--stock``: stock's lowering beside
xnnfold's, timed in interleaved rounds."""

from __future__ import annotations

import argparse
import time

import torch


def _text_config(transformers, layers: int, vocab: int):
    return transformers.LlamaConfig(
        hidden_size=576, intermediate_size=1536, num_hidden_layers=layers,
        num_attention_heads=9, num_key_value_heads=3, vocab_size=vocab,
        max_position_embeddings=2048, bos_token_id=0, eos_token_id=1, tie_word_embeddings=True)


def _smolvlm(layers: int):
    """SmolVLM-256M's dims (its config: image token 49190 of 49280)."""
    import transformers

    vision = transformers.SmolVLMVisionConfig(
        hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
        image_size=512, patch_size=16)
    config = transformers.SmolVLMConfig(
        vision_config=vision.to_dict(), text_config=_text_config(transformers, layers,
                                                                 49280).to_dict(),
        image_token_id=49190, scale_factor=4, tie_word_embeddings=True)
    return transformers.SmolVLMForConditionalGeneration(config).eval()


def _llava(layers: int):
    import transformers

    vision = transformers.CLIPVisionConfig(
        hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
        image_size=224, patch_size=16, projection_dim=512)
    text = _text_config(transformers, layers, 49152)
    config = transformers.LlavaConfig(
        vision_config=vision, text_config=text, image_token_id=49151, image_seq_length=196,
        vision_feature_layer=-2, vision_feature_select_strategy="default")
    return transformers.LlavaForConditionalGeneration(config).eval()


def _lowered(generation, variant: str):
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
        XnnpackPartitioner as StockXnnpackPartitioner,
    )

    from ..export.llm.export import lower_generation
    from ..pte import inspect_lowered

    start = time.perf_counter()
    lowered = lower_generation(
        generation, StockXnnpackPartitioner if variant == "stock" else None,
        before_emit=lambda edge: {m: inspect_lowered(edge.exported_program(m))[:2]
                                  for m in generation.programs})
    print(f"{variant}: lowering {time.perf_counter() - start:.1f} s; .pte "
          f"{len(lowered.pte):,} bytes")
    for method, (ops, calls) in lowered.inspected.items():
        print(f"  {method}: {calls} delegate call(s); outside: {sorted(set(ops)) or 'nothing'}")
    return lowered.pte


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=("llava", "smolvlm"), default="llava")
    parser.add_argument("--layers", type=int, default=4, help="text decoder layers")
    parser.add_argument("--max-cache", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=16, help="decode steps timed")
    parser.add_argument("--threads", type=int, default=1, help="the runtime's threads (one: "
                        "the steadiest figures on a shared machine)")
    parser.add_argument("--stock", action="store_true", help="stock's lowering beside, timed "
                        "interleaved")
    args = parser.parse_args(argv)
    from ..export.multimodal.export import (VISION_ENCODER, export_image_text_to_text,
                                            image_embeddings)
    from ..export.hf.multimodal import check_prompt
    from ..export.multimodal.runtime import MultimodalGenerator
    from ..pte.devtools import DELEGATE, operator_times
    from ..export.llm.runtime import set_threads
    from ..pte.timing import medians_interleaved

    set_threads(args.threads)
    torch.manual_seed(0)
    model = (_smolvlm if args.family == "smolvlm" else _llava)(args.layers)
    start = time.perf_counter()
    generation = export_image_text_to_text(model, args.max_cache)
    print(f"export: {time.perf_counter() - start:.1f} s")
    variants = ["xnnfold"] + (["stock"] if args.stock else [])
    ptes = {variant: _lowered(generation, variant) for variant in variants}
    ids, image = check_prompt(generation, 16)
    with torch.no_grad():
        eager = model.generate(input_ids=torch.tensor([ids]),
                               pixel_values=image_embeddings(model).model_pixels(image),
                               max_new_tokens=args.steps + 1, do_sample=False)
    generators = {}
    for variant, pte in ptes.items():
        times = operator_times(pte, (image,), runs=args.rounds, method=VISION_ENCODER)
        total = sum(times.values())
        print(f"{variant}: vision encoder (ETDump, median of {args.rounds}): {total:.1f} ms, "
              f"on portable {(total - times.get(DELEGATE, 0.0)) / total:.2%}")
        generators[variant] = MultimodalGenerator(pte)
        tokens = generators[variant].generate(ids, [image], args.steps + 1,
                                              stop_at_eos=False).tokens
        print(f"{variant}: greedy tokens equal eager's: "
              f"{tokens == eager[0, len(ids):].tolist()}")

    def text_prefill(generator, embeddings) -> float:
        """Seconds of the text decoder's calls over the prompt, the image's embeddings given:
        the prefill without the encoder."""
        start, position = time.perf_counter(), 0
        for kind, value in generator.pieces(ids, [image]):
            part = embeddings if kind == "image" else generator.embed(value)
            generator.decode(part, position)
            position += int(part.shape[1])
        return time.perf_counter() - start

    def measure(generator) -> tuple:
        start = time.perf_counter()
        embeddings = generator.encode_image(image)
        encoder = time.perf_counter() - start
        text = text_prefill(generator, embeddings)
        run = generator.generate(ids, [image], args.steps + 1, stop_at_eos=False)
        return (encoder * 1e3, run.prefill_seconds * 1e3, text * 1e3,
                run.decode_seconds * 1e3 / args.steps)

    for variant, (encoder, prefill, text, decode) in medians_interleaved(
            generators, measure, args.rounds).items():
        print(f"{variant}: vision encoder {encoder:.1f} ms; prefill of {len(ids)} positions "
              f"with the image (encoder included) {prefill:.1f} ms, the text decoder's calls "
              f"alone {text:.1f} ms; decode {decode:.2f} ms per token; medians of "
              f"{args.rounds} interleaved rounds after a warm-up")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
