"""``xnnfold generate``: generation with a generation .pte (:mod:`xnnfold.export.llm`: text in
and out with the tokenizer beside it, as executorch's runner reads and prints it; an
encoder-decoder .pte, :mod:`xnnfold.export.seq2seq`)."""

from __future__ import annotations

from pathlib import Path

from . import checks
from ..usage import UsageError
from .command import Command, runtime_arguments


def _generate_arguments(parser) -> None:
    parser.add_argument("pte", help="the generation .pte `xnnfold hf` wrote for a causal LM "
                        "(one forward method), or for a text encoder-decoder model (BART, T5: "
                        "the prompt is the encoder's input), or for LLaVA (--image) or Voxtral "
                        "(--audio)")
    prompt = parser.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="the prompt's text, encoded by the tokenizer beside "
                        "the .pte (or --tokenizer) as executorch's runner encodes it")
    prompt.add_argument("--tokens", help="the prompt's token ids, e.g. 1,2,3")
    parser.add_argument("--tokenizer", help="the tokenizer file (default: tokenizer.json or "
                        "tokenizer.model beside the .pte, which `xnnfold hf` copies there)")
    parser.add_argument("--max-new", type=int, default=32, help="tokens to generate")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy, "
                        "the tokens of executorch's runner at temperature 0; more: sampled from "
                        "softmax(logits / temperature)")
    parser.add_argument("--top-p", type=float, default=1.0, help="with a temperature: sample "
                        "among the most likely tokens whose probabilities sum to this "
                        "(default 1: all)")
    parser.add_argument("--seed", type=int, default=0, help="the sampling's random seed")
    parser.add_argument("--num-bos", type=int, default=0, help="BOS tokens the tokenizer adds "
                        "to a --prompt (its post-processor's special tokens for a "
                        "tokenizer.json), as the runner's num_bos (default 0, as the runner's)")
    parser.add_argument("--image", help="an image-text-to-text .pte (LLaVA, SmolVLM): the "
                        "image, the processor's pixel_values saved with torch.save (SmolVLM's "
                        "crops: one per run of image tokens); <image> in --prompt marks where "
                        "it goes")
    parser.add_argument("--audio", help="an audio-text-to-text .pte (Voxtral): the audio, the "
                        "processor's input_features saved with torch.save; <audio> in --prompt "
                        "marks where it goes")
    parser.add_argument("--ignore-eos", action="store_true",
                        help="do not stop at the EOS ids the .pte names")
    runtime_arguments(parser, "a prefill and one decode step")


def _check_generate(args) -> None:
    args.prompt_ids = None
    if args.tokens is not None:
        try:
            args.prompt_ids = [int(t) for t in args.tokens.split(",") if t.strip()]
        except ValueError:
            raise UsageError(f"--tokens {args.tokens!r}: expected comma-separated token ids")
        if not args.prompt_ids:
            raise UsageError("--tokens: give at least one token id")
        negative = [t for t in args.prompt_ids if t < 0]
        if negative:
            raise UsageError(f"--tokens {args.tokens!r}: token ids are 0 or more, "
                             f"not {negative[0]}")
    elif not args.prompt:
        raise UsageError("--prompt: give some text")
    if args.max_new < 1:
        raise UsageError(f"--max-new {args.max_new}: generate at least one token")
    if not args.temperature >= 0:
        raise UsageError(f"--temperature {args.temperature}: 0 (greedy) or more")
    if not 0 < args.top_p <= 1:
        raise UsageError(f"--top-p {args.top_p}: more than 0, at most 1")
    checks.at_least("--num-bos", args.num_bos, 0)
    if args.threads is not None:
        checks.at_least("--threads", args.threads)
    checks.pte_file(args.pte)
    if args.tokenizer is not None and not Path(args.tokenizer).is_file():
        raise UsageError(f"--tokenizer {args.tokenizer}: no such file")


def _tokenizer(args):
    """The tokenizer to read and print text with, or None (token ids only)."""
    from ..export.llm.text import RunnerTokenizer, runner_tokenizer

    path = args.tokenizer or runner_tokenizer(Path(args.pte).parent)
    if path is None:
        if args.prompt is not None:
            raise UsageError(f"--prompt: no tokenizer beside {args.pte} (tokenizer.json, "
                             "tokenizer.model): give --tokenizer, or --tokens ids")
        return None
    try:
        return RunnerTokenizer(path)
    except ValueError as error:
        raise UsageError(str(error))


def _cmd_generate(args) -> int:
    from ..export.llm.runtime import Generator, NotAGenerationProgram, Sampling, set_threads

    if args.threads is not None:
        set_threads(args.threads)
    if args.audio is not None:
        from .generate_audio import generate_with_audio
        return generate_with_audio(args, _tokenizer)
    if args.image is not None:
        from .generate_image import generate_with_image
        return generate_with_image(args, _tokenizer)
    try:
        try:
            generator = Generator(args.pte)
        except NotAGenerationProgram:
            if _has_methods(args.pte, "vision_encoder", "text_decoder"):   # a prompt without
                from .generate_image import generate_with_image         # an image
                return generate_with_image(args, _tokenizer)
            if _has_methods(args.pte, "audio_encoder", "text_decoder"):    # a prompt without
                from .generate_audio import generate_with_audio         # an audio
                return generate_with_audio(args, _tokenizer)
            if not _has_methods(args.pte, "encoder", "text_decoder"):
                raise
            return _generate_seq2seq(args)
        tokenizer = _tokenizer(args)
        prompt = args.prompt_ids if args.prompt_ids is not None else \
            tokenizer.encode(args.prompt, args.num_bos)
        sampling = Sampling(args.temperature, args.top_p, args.seed,
                            None if tokenizer is None else
                            min(tokenizer.vocab_size, generator.vocab_size))
        generator.check(prompt, args.max_new)
        if args.warmup:       # the first calls set up XNNPACK's operators; never more
            generator.generate(prompt, min(2, args.max_new), stop_at_eos=False)
        result = generator.generate(prompt, args.max_new, stop_at_eos=not args.ignore_eos,
                                    sampling=sampling)
        text = None if tokenizer is None else tokenizer.decode(result.tokens)
    except (NotAGenerationProgram, ValueError) as error:
        raise UsageError(f"{args.pte}: {error}")
    except RuntimeError as error:                  # the runtime could not load it
        raise UsageError(f"{args.pte}: the runtime could not load it ({type(error).__name__}: "
                         f"{str(error).splitlines()[0][:160]})")
    if text is not None:
        print(text)
    print(result.summary())
    return 0


# what an encoder-decoder .pte's generation does not take (greedy only)
_NOT_FOR_SEQ2SEQ = (("temperature", 0.0, "--temperature"), ("top_p", 1.0, "--top-p"),
                    ("seed", 0, "--seed"))


def _has_methods(pte: str, *names: str) -> bool:
    from executorch.runtime import Runtime

    try:
        methods = Runtime.get().load_program(pte).method_names
    except RuntimeError:          # a .ptd it needs is not given: the methods are listed anyway
        return False
    return set(names) <= set(methods)


def _source_tokenizer(args):
    """The tokenizer of an encoder-decoder's source: a tokenizer.json read by Hugging Face's
    tokenizers (executorch's pytorch-tokenizers depends on it) as transformers reads it, the
    special tokens included (BART's post-processor is one executorch's C++ tokenizers do not
    load); a tokenizer.model as :func:`_tokenizer` reads it."""
    from ..export.llm.text import SourceTokenizer, runner_tokenizer

    path = args.tokenizer or runner_tokenizer(Path(args.pte).parent)
    if path is None or Path(path).suffix != ".json":
        return _tokenizer(args)
    if args.num_bos:
        raise UsageError(f"--num-bos {args.num_bos}: an encoder-decoder's source takes the "
                         f"special tokens {Path(path).name} adds, as transformers encodes it")
    try:
        return SourceTokenizer(path)
    except ValueError as error:
        raise UsageError(str(error))


def _generate_seq2seq(args) -> int:
    """An encoder-decoder .pte (BART, T5...): the prompt (``--tokens``, or ``--prompt`` encoded by
    the tokenizer beside it, which `xnnfold hf` copies there) is the encoder's input; greedy
    tokens from the .pte's start token, printed as text too where there is a tokenizer."""
    import torch

    from ..export.seq2seq import Seq2SeqProgram

    program = Seq2SeqProgram(args.pte)
    if program.speech:
        raise UsageError(f"{args.pte}: a speech model (its encoder takes features): use "
                         "`xnnfold transcribe`")
    for name, default, option in _NOT_FOR_SEQ2SEQ:
        if getattr(args, name) != default:
            raise UsageError(f"{args.pte}: an encoder-decoder .pte generates greedily; "
                             f"{option} is for a causal LM's .pte")
    tokenizer = _source_tokenizer(args)
    try:
        ids = args.prompt_ids if args.prompt_ids is not None else \
            tokenizer.encode(args.prompt, args.num_bos)
    except ValueError as error:
        raise UsageError(f"--prompt: {error}")
    if not ids:
        raise UsageError(f"--prompt {args.prompt!r}: no token")
    source = torch.tensor([ids], dtype=torch.long)
    if program.input_sizes and source.shape[1] > program.input_sizes[-1]:
        raise UsageError(f"{args.pte}: {source.shape[1]} source tokens; its encoder takes at "
                         f"most {program.input_sizes[-1]}")
    try:
        if args.warmup:
            program.step(program.start, program.encode(source), 0)
        run = program.generate(source, args.max_new, stop_at_eos=not args.ignore_eos)
        text = None if tokenizer is None else tokenizer.decode(run.tokens)
    except ValueError as error:
        raise UsageError(f"{args.pte}: {error}")
    if text is not None:
        print(text)
    print(run.summary())
    return 0


GENERATE = Command("generate", "text generation with a .pte `xnnfold hf` wrote for a causal "
                   "LM (greedy or sampled) or a text encoder-decoder model (greedy); prints the "
                   "text, the tokens and their times", _generate_arguments, _cmd_generate,
                   _check_generate)
