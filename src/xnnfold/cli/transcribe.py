"""``xnnfold transcribe``: speech to tokens (and text) with the Whisper .pte ``xnnfold hf``
writes (:mod:`xnnfold.export.seq2seq`), through the calls executorch's speech runner makes;
prompt and processors are transformers' ``generate``'s, from the model folder's generation
config."""

from __future__ import annotations

import json
from pathlib import Path

from . import checks
from ..export.seq2seq.extractor import WHERE, feature_extractor_file
from ..usage import UsageError
from .command import Command, runtime_arguments


def _arguments(parser) -> None:
    parser.add_argument("pte", help="the .pte `xnnfold hf` wrote for a Whisper folder (methods "
                        "encoder and text_decoder; its .ptd beside it is loaded with it)")
    parser.add_argument("input", help="log-mel features, a .npy or .pt of (mels, frames) as "
                        "the .pte takes them (Whisper: (80, 3000)), or a 16 kHz PCM .wav "
                        "(its features computed with the folder's feature extractor: "
                        "preprocessor_config.json, or processor_config.json as "
                        "WhisperProcessor.save_pretrained writes it)")
    parser.add_argument("--folder", help="the model folder: generation_config.json (the "
                        "prompt: language, task; suppressed tokens), preprocessor_config.json "
                        "or processor_config.json (for a .wav), tokenizer.json (to print the "
                        "text). Without it: greedy tokens from the start token alone, as "
                        "executorch's runner does")
    parser.add_argument("--language", help="e.g. en (default: detected, as generate does)")
    parser.add_argument("--task", choices=["transcribe", "translate"],
                        help="default: the generation config's")
    parser.add_argument("--max-new", type=int, default=64, help="tokens to generate at most")
    parser.add_argument("--data", help="the .ptd (default: the .pte's name with .ptd, if "
                        "there)")
    runtime_arguments(parser, "one encoder call and one decoder step")


def _check(args) -> None:
    if args.max_new < 1:
        raise UsageError(f"--max-new {args.max_new}: generate at least one token")
    if args.threads is not None:
        checks.at_least("--threads", args.threads)
    checks.pte_file(args.pte)
    for name in ("input", "data"):
        value = getattr(args, name)
        if value is not None and not Path(value).is_file():
            raise UsageError(f"{value}: no such file")
    if args.folder is not None and not Path(args.folder).is_dir():
        raise UsageError(f"--folder {args.folder}: no such folder")
    if Path(args.input).suffix.lower() == ".wav":
        try:
            extractor = args.folder and feature_extractor_file(args.folder)
        except ValueError as error:
            raise UsageError(str(error))
        if not extractor:
            raise UsageError(f"{args.input}: a WAV needs the model folder's feature extractor "
                             f"(--folder with {WHERE})")
    args.generation = None
    if args.folder is not None:
        path = Path(args.folder) / "generation_config.json"
        if path.is_file():
            try:
                args.generation = json.loads(path.read_text())
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
                raise UsageError(f"{path}: not a readable JSON file ({error})")
    if (args.language or args.task) and args.generation is None:
        raise UsageError("--language / --task need the folder's generation_config.json "
                         "(--folder)")


def _text(folder, tokens: list):
    """The text of ``tokens`` with the folder's tokenizer.json (special tokens skipped), or
    None when there is none or the tokenizers package is absent."""
    path = Path(folder) / "tokenizer.json" if folder else None
    if path is None or not path.is_file():
        return None
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return None
    return Tokenizer.from_file(str(path)).decode(tokens, skip_special_tokens=True)


def _run(args) -> int:
    from ..export.llm.runtime import set_threads
    from ..export.seq2seq import NotASeq2SeqProgram, Seq2SeqProgram, WhisperPrompt, \
        read_features
    from ..pte.runner import NotAPte

    if args.threads is not None:
        set_threads(args.threads)
    try:
        program = Seq2SeqProgram(args.pte, args.data)
    except NotASeq2SeqProgram as error:
        raise UsageError(f"{args.pte}: {error}; write one with `xnnfold hf` on a Whisper folder")
    except NotAPte as error:                      # not a program, or a corrupt one
        raise UsageError(f"{args.pte}: {error}")
    except RuntimeError as error:                 # the runtime could not load it
        raise UsageError(f"{args.pte}: the runtime could not load it (a .ptd it needs "
                         f"missing?) ({type(error).__name__}: {str(error).splitlines()[0][:160]})")
    if not program.speech or len(program.input_sizes) != 3:
        raise UsageError(f"{args.pte}: its encoder takes {program.input_sizes} token ids, not "
                         "speech features; use `xnnfold generate` for a text model")
    _, mels, frames = program.input_sizes
    try:
        features = read_features(args.input, args.folder, mels, frames)
        prompt = WhisperPrompt(args.generation, args.language, args.task) \
            if args.generation is not None else None
    except ValueError as error:
        raise UsageError(str(error))
    try:
        if args.warmup:                         # the first calls set up XNNPACK's operators
            program.step(program.start, program.encode(features), 0)
        run = program.generate(features, args.max_new, prompt.prompt if prompt else None,
                               prompt)
    except ValueError as error:
        raise UsageError(f"{args.pte}: {error}")
    if prompt is None:
        print("no generation config (--folder): greedy from the start token alone, without "
              "Whisper's prompt and suppressed tokens")
    print(run.summary())
    print("decoder calls, ms: " + ", ".join(f"{s * 1e3:.1f}" for s in run.step_seconds))
    text = _text(args.folder, run.tokens)
    if text is not None:
        print(f"text: {text}")
    return 0


TRANSCRIBE = Command("transcribe", "speech to tokens and text with a Whisper .pte `xnnfold hf` "
                     "wrote (log-mel features or a 16 kHz WAV); per-token timing", _arguments,
                     _run, _check)
