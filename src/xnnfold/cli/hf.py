"""``xnnfold hf`` (a transformers folder to .pte files, :mod:`xnnfold.export.hf`) and
``xnnfold generate`` (generation with a generation .pte, :mod:`xnnfold.export.llm`: text in and
out with the tokenizer beside it, as executorch's runner reads and prints it)."""

from __future__ import annotations

from pathlib import Path

from . import checks
from ..usage import UsageError
from .command import Command, CommandFailed, LLM_KERNELS_HELP, require


def _hf_arguments(parser) -> None:
    parser.add_argument("folder", help="the folder save_pretrained wrote (config.json, weights)")
    parser.add_argument("-o", "--output", required=True, help="the .pte to write (Whisper, "
                        "BART: one generation .pte and OUT.ptd, its tied head's table; with "
                        "--no-cache, and T5: OUT.encoder.pte and OUT.decoder.pte; CLIP: "
                        "OUT.text.pte and OUT.vision.pte)")
    parser.add_argument("--compare", action="store_true",
                        help="also lower with stock executorch; time both on the runtime")
    parser.add_argument("--tokens", type=int, default=8, help="tokens of a text input: the "
                        "length the .pte takes (a generation .pte: the prompt of the check)")
    parser.add_argument("--attention", choices=["auto", "sdpa", "eager"], default="auto",
                        help="transformers' attn_implementation for the export (auto: sdpa "
                        "where transformers has it for the class, else eager; the choice is "
                        "printed)")
    parser.add_argument("--reps", type=int, default=10, help="timed rounds with --compare")
    parser.add_argument("--prefer", choices=["speed", "size"], default="speed",
                        help="where speed and size trade (a tied nn.Linear head): speed keeps "
                        "stock's choice, size stores the table once (a run-time weight)")
    parser.add_argument("--no-check", action="store_true", help="do not run the .pte on the "
                        "runtime against eager (checked by default; exit 1 when it differs)")
    parser.add_argument("--no-cache", action="store_true", help="a causal LM: the logits of "
                        "--tokens tokens, no KV cache, instead of the generation .pte; Whisper, "
                        "BART: the encoder and one decoder step")
    parser.add_argument("--max-cache", type=int, help="a causal LM: rows of the KV cache "
                        "(default: 1024, at most the model's positions); Whisper, BART: of the "
                        "decoder's self-attention cache (default: its positions)")
    parser.add_argument("--max-prefill", type=int, help="a causal LM: the most tokens one "
                        "forward call takes (default: 128, at most --max-cache; a longer prompt "
                        "goes in as chunks: executorch's runner reads it as get_max_seq_len)")
    parser.add_argument("--threads", type=int, help="the runtime's threads for the check and "
                        "the timing (default: its own, one per core)")
    parser.add_argument("--llm-kernels", action="store_true", help="a causal LM: " +
                        LLM_KERNELS_HELP + " (with --compare, xnnfold's default beside it)")
    parser.add_argument("--quantize", choices=["8da4w", "int8"], help="a causal LM: its "
                        "linears quantized (torchao): 8da4w, 8-bit dynamic activations and "
                        "4-bit weights in groups of 32 (optimum-executorch's --qlinear 8da4w); "
                        "int8, 8-bit dynamic activations and 8-bit weights per channel")


def _check_hf(args) -> None:
    from ..export.hf.plan import plan     # reads config.json only: no torch, no transformers

    checks.hf_folder(args.folder, args.tokens)
    checks.at_least("--reps", args.reps)
    if args.threads is not None:
        checks.at_least("--threads", args.threads)
    checks.output_file(args.output)
    # the class and the cache sizes first: a class hf does not export is refused as such,
    # whether or not transformers is installed
    args.plan = plan(args.folder, args.tokens, not args.no_cache, args.max_cache,
                     args.max_prefill, args.llm_kernels)
    from ..export.hf import check_generation_options
    check_generation_options(args.plan, args.output, not args.no_cache, args.quantize)
    require("hf", "tabulate", "transformers", install="pip install 'xnnfold[zoo]'")
    if args.quantize:
        require("hf --quantize", "torchao", install="pip install torchao")


def _cmd_hf(args) -> int:
    from ..export import hf
    from ..export.hf import rows as hf_rows

    if args.threads is not None:
        from ..export.llm.runtime import set_threads
        set_threads(args.threads)
    exported = hf.export_folder(args.plan, args.output, compare=args.compare,
                                tokens=args.tokens, attention=args.attention, reps=args.reps,
                                prefer=args.prefer, check=not args.no_check,
                                cache=not args.no_cache, max_cache=args.max_cache,
                                max_prefill=args.max_prefill, llm_kernels=args.llm_kernels,
                                quantize=args.quantize)
    print(hf_rows.table(exported.rows))
    for note in exported.notes:
        print(note)
    if exported.wrong:
        raise CommandFailed("; ".join(exported.wrong) + " (eager's outputs differ; the .pte is "
                            "written, do not ship it)")
    return 0


# --------------------------------------------------------------------------------------------
# generate

def _generate_arguments(parser) -> None:
    parser.add_argument("pte", help="the generation .pte `xnnfold hf` wrote for a causal LM "
                        "(one forward method), or for a text encoder-decoder model (BART: "
                        "--tokens are the encoder's input)")
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
    parser.add_argument("--ignore-eos", action="store_true",
                        help="do not stop at the EOS ids the .pte names")
    parser.add_argument("--threads", type=int, help="the runtime's threads (default: its own, "
                        "one per core)")
    parser.add_argument("--no-warmup", dest="warmup", action="store_false", help="time the "
                        "first calls too (by default a prefill and one decode step run first, "
                        "untimed)")


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
    if not Path(args.pte).is_file():
        raise UsageError(f"{args.pte}: no such file")
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
    try:
        try:
            generator = Generator(args.pte)
        except NotAGenerationProgram:
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


# what an encoder-decoder .pte's generation does not take (greedy from token ids only)
_NOT_FOR_SEQ2SEQ = (("prompt", None, "--prompt"), ("tokenizer", None, "--tokenizer"),
                    ("temperature", 0.0, "--temperature"), ("top_p", 1.0, "--top-p"),
                    ("seed", 0, "--seed"), ("num_bos", 0, "--num-bos"))


def _has_methods(pte: str, *names: str) -> bool:
    from executorch.runtime import Runtime

    try:
        methods = Runtime.get().load_program(pte).method_names
    except RuntimeError:          # a .ptd it needs is not given: the methods are listed anyway
        return False
    return set(names) <= set(methods)


def _generate_seq2seq(args) -> int:
    """An encoder-decoder .pte (BART...): ``--tokens`` are the encoder's input; greedy tokens
    from the .pte's start token."""
    import torch

    from ..export.seq2seq import Seq2SeqProgram

    program = Seq2SeqProgram(args.pte)
    if program.speech:
        raise UsageError(f"{args.pte}: a speech model (its encoder takes features): use "
                         "`xnnfold transcribe`")
    for name, default, option in _NOT_FOR_SEQ2SEQ:
        if getattr(args, name) != default:
            raise UsageError(f"{args.pte}: an encoder-decoder .pte generates greedily from the "
                             f"source's --tokens ids; {option} is for a causal LM's .pte")
    source = torch.tensor([args.prompt_ids], dtype=torch.long)
    if program.input_sizes and source.shape[1] > program.input_sizes[-1]:
        raise UsageError(f"{args.pte}: {source.shape[1]} source tokens; its encoder takes at "
                         f"most {program.input_sizes[-1]}")
    try:
        if args.warmup:
            program.step(program.start, program.encode(source), 0)
        run = program.generate(source, args.max_new, stop_at_eos=not args.ignore_eos)
    except ValueError as error:
        raise UsageError(f"{args.pte}: {error}")
    print(run.summary())
    return 0


HF = Command("hf", "a transformers model saved with save_pretrained to .pte through xnnfold "
             "(the class config.json names; a causal LM generation-ready)", _hf_arguments,
             _cmd_hf, _check_hf)
GENERATE = Command("generate", "text generation with a .pte `xnnfold hf` wrote for a causal "
                   "LM (greedy or sampled); prints the text, the tokens and tokens/s of prefill "
                   "and decode", _generate_arguments, _cmd_generate,
                   _check_generate)
