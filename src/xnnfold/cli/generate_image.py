"""``xnnfold generate OUT.pte --image PIXELS.pt``: greedy generation with an image-text-to-text
.pte (:mod:`xnnfold.export.multimodal`), the image and the prompt as executorch's
``MultimodalRunner`` takes them. The image is the processor's ``pixel_values`` saved with
``torch.save`` (a tensor, or the processor's output holding one): one image, or several
(SmolVLM's crops and global image, (1, K, C, H, W)), each for its own run of image tokens in
the prompt, in order; ``<image>`` in ``--prompt`` marks where each goes (in ``--tokens``, the
runs of the image token); without ``--image``, a prompt of text alone. A wrong image or prompt
is one line, exit 2."""

from __future__ import annotations

from pathlib import Path

from ..usage import UsageError

# where the image goes in --prompt, as the LLaVA processor marks it
IMAGE_MARK = "<image>"


def load_saved(path: str, option: str, key: str):
    """The tensor saved at ``path`` for ``option``: a tensor, or a mapping (the processor's
    output) holding it under ``key``; else one line."""
    import torch

    if not Path(path).is_file():
        raise UsageError(f"{option} {path}: no such file")
    try:
        value = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - whatever torch.load raises, one line
        raise UsageError(f"{option} {path}: not a tensor saved with torch.save "
                         f"({type(error).__name__}); save the processor's {key}")
    if not isinstance(value, torch.Tensor) and hasattr(value, "get"):
        value = value.get(key)
    if not isinstance(value, torch.Tensor):
        raise UsageError(f"{option} {path}: holds no tensor ({key})")
    return value


def load_pixels(path: str):
    """The pixel values saved at ``path``: a tensor, or a mapping holding ``pixel_values``."""
    return load_saved(path, "--image", "pixel_values")


def prompt_tokens(args, generator, tokenizer) -> list:
    """``--tokens`` as given, or ``--prompt`` encoded by ``tokenizer`` piece by piece around
    each :data:`IMAGE_MARK`, which becomes the .pte's run of image tokens."""
    if args.prompt_ids is not None:
        return args.prompt_ids
    tokens = []
    for index, text in enumerate(args.prompt.split(IMAGE_MARK)):
        if index:
            tokens += [generator.image_token] * generator.image_tokens
        if text:
            tokens += tokenizer.encode(text, args.num_bos if not tokens else 0)
    return tokens


def generate_with_image(args, tokenizer_of) -> int:
    """``tokenizer_of(args)``: the tokenizer to read and print text with, or None."""
    from ..export.multimodal.processor_inputs import images_of
    from ..export.multimodal.runtime import BadInput, MultimodalGenerator

    for name, default, option in (("temperature", 0.0, "--temperature"),
                                  ("top_p", 1.0, "--top-p"), ("seed", 0, "--seed")):
        if getattr(args, name) != default:
            raise UsageError(f"{option}: an image-text-to-text .pte generates greedily here")
    pixels = None if args.image is None else load_pixels(args.image)
    try:
        images = [] if pixels is None else images_of(pixels)
        generator = MultimodalGenerator(args.pte)
        tokenizer = tokenizer_of(args)
        tokens = prompt_tokens(args, generator, tokenizer)
        if args.warmup:       # the first calls set up XNNPACK's operators
            generator.generate(tokens, images, 1)
        run = generator.generate(tokens, images, args.max_new,
                                 stop_at_eos=not args.ignore_eos)
    except BadInput as error:
        raise UsageError(f"{args.pte}: {error}")
    if tokenizer is not None:
        print(tokenizer.decode(run.tokens))
    print(run.summary())
    return 0
