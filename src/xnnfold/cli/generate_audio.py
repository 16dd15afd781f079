"""``xnnfold generate OUT.pte --audio FEATURES.pt``: greedy generation with an audio-text-to-text
.pte (:mod:`xnnfold.export.multimodal.audio`), the audio and the prompt as executorch's
``MultimodalRunner`` takes them. The audio is the processor's ``input_features`` (mel
features, (chunks, n_bins, n_frames)) saved with ``torch.save`` (a tensor, or the processor's
output holding one); ``<audio>`` in ``--prompt`` marks where it goes and becomes one run of
the .pte's audio tokens per chunk (in ``--tokens``, give the run yourself); without
``--audio``, a prompt of text alone. A wrong audio or prompt is one line, exit 2."""

from __future__ import annotations

from ..usage import UsageError


def load_features(path: str):
    """The mel features saved at ``path``: a tensor, or a mapping holding ``input_features``."""
    from .generate_image import load_saved

    return load_saved(path, "--audio", "input_features")


def prompt_tokens(args, generator, tokenizer, chunks: int) -> list:
    """``--tokens`` as given, or ``--prompt`` encoded by ``tokenizer`` piece by piece around
    each ``<audio>``, which becomes the audio tokens of ``chunks`` chunks (at least one
    chunk's, so that a mark without ``--audio`` is refused for the audio it asks for)."""
    from ..export.multimodal.audio import AUDIO_MARK

    if args.prompt_ids is not None:
        return args.prompt_ids
    tokens = []
    for index, text in enumerate(args.prompt.split(AUDIO_MARK)):
        if index:
            tokens += [generator.audio_token] * generator.audio_tokens * max(chunks, 1)
        if text:
            tokens += tokenizer.encode(text, args.num_bos if not tokens else 0)
    return tokens


def generate_with_audio(args, tokenizer_of) -> int:
    """``tokenizer_of(args)``: the tokenizer to read and print text with, or None."""
    from ..export.multimodal.audio_runtime import AudioGenerator
    from ..export.multimodal.runtime import BadInput

    if getattr(args, "image", None) is not None:
        raise UsageError("--image and --audio: an audio-text-to-text .pte takes audio only")
    for name, default, option in (("temperature", 0.0, "--temperature"),
                                  ("top_p", 1.0, "--top-p"), ("seed", 0, "--seed")):
        if getattr(args, name) != default:
            raise UsageError(f"{option}: an audio-text-to-text .pte generates greedily here")
    audios = [] if args.audio is None else [load_features(args.audio)]
    try:
        generator = AudioGenerator(args.pte)
        chunks = sum(len(generator.chunks(audio)) for audio in audios)
        tokenizer = tokenizer_of(args)
        tokens = prompt_tokens(args, generator, tokenizer, chunks)
        if args.warmup:       # the first calls set up XNNPACK's operators
            generator.generate(tokens, audios, 1)
        run = generator.generate(tokens, audios, args.max_new,
                                 stop_at_eos=not args.ignore_eos)
    except BadInput as error:
        raise UsageError(f"{args.pte}: {error}")
    if tokenizer is not None:
        print(tokenizer.decode(run.tokens))
    print(run.summary())
    return 0
