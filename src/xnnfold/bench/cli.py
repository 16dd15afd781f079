"""Command line: ``xnnfold report``, ``lower``, ``explain``, ``hf``, ``generate``, ``bench``.

Each subcommand is one :class:`Command` of :data:`COMMANDS`: its arguments, a check of them
that imports nothing heavy (:mod:`xnnfold.bench.checks`), and the work. Bad input gets one line
on stderr naming the problem and exit code 2, before any heavy import or lowering; work done
whose result is wrong (a .pte that does not run or does not match eager, every variant of a
model failed) one line and exit code 1; Ctrl-C exit code 130. ``--debug`` shows the traceback
instead. Dependency noise (torchao, torch's ``_pytree``, the runtime's C++ log lines) is
filtered out unless ``--verbose`` (:mod:`xnnfold.bench.quiet`).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import checks
from .arguments import CommandParser, ParserError
from .sources import UsageError, is_user_spec
from .variants import CONSTANT_PROP, VARIANTS, XNNFOLD, XNNFOLD_SIZE

# What each command imports beyond the pass, and the extra that installs it.
_BENCH_EXTRA = "pip install 'xnnfold[bench]'"
_CHARTS = "matplotlib"
_QUANTIZE = ("dynamic", "static")


class CommandFailed(Exception):
    """The work was done and its result is wrong (a .pte that does not run or does not match
    eager; every variant of a model failed): one line, exit code 1."""


@dataclass(frozen=True)
class Command:
    """A subcommand: ``arguments(parser)`` adds its arguments, ``check(args)`` checks them
    before any heavy import (raising :class:`UsageError`), ``run(args)`` does the work and
    returns the exit code. ``description``: the help's text, or a function making it (default:
    ``help``). ``in_process=False``: the work runs in another process (no torch imported here:
    the dependency noise is filtered on the file descriptor only)."""

    name: str
    help: str
    arguments: Callable
    run: Callable
    check: Callable = lambda args: None
    description: object = ""
    in_process: bool = True


def _missing(*modules: str) -> list:
    """The modules of ``modules`` that do not import here (without importing them)."""
    missing = []
    for name in modules:
        if name in sys.modules:
            if sys.modules[name] is None:         # an import blocked on purpose
                missing.append(name)
            continue
        try:
            if importlib.util.find_spec(name) is None:
                missing.append(name)
        except (ImportError, ValueError):
            missing.append(name)
    return missing


def _require(command: str, *modules: str, install: str = _BENCH_EXTRA) -> None:
    """One line naming what ``command`` needs and how to install it, before any work."""
    missing = _missing(*modules)
    if missing:
        raise UsageError(f"xnnfold {command} needs {', '.join(sorted(missing))}: {install}")


def _case(source: str, quantize=None):
    """The model of a factory, a .pt2 (with its saved example inputs) or a built-in name,
    PT2E-quantized with ``quantize`` (:mod:`xnnfold.bench.sources`)."""
    from .sources import ModelSource
    return ModelSource.of(source, quantize).build()


def _program(source: str, quantize=None):
    """A .pt2 file as saved, or the model of a factory or a built-in name exported (quantized
    first with ``quantize``)."""
    from .sources import export, load_program

    if not quantize and checks.is_pt2(source):
        return load_program(source)
    return export(_case(source, quantize))


# --------------------------------------------------------------------------------------------
# explain

_LLM_KERNELS_HELP = ("a KV cache's update and attention on executorch's llama::update_cache / "
                     "llama::custom_sdpa where proven exact: the .pte then needs a runtime with "
                     "executorch's LLM custom ops")


def _explain_arguments(parser) -> None:
    parser.add_argument("program", help="a .pt2, package.module:function returning "
                        "(module, example_inputs), or a built-in model name")
    parser.add_argument("--quantize", choices=_QUANTIZE,
                        help="PT2E-quantize the model first (XNNPACK quantizer, per channel)")
    parser.add_argument("--all", action="store_true",
                        help="also list every op left outside delegates, with XNNPACK's reason")
    parser.add_argument("--llm-kernels", action="store_true", help=_LLM_KERNELS_HELP)


def _check_explain(args) -> None:
    checks.program(args.program)
    if args.all:
        _require("explain --all", "tabulate")


def _cmd_explain(args) -> int:
    import xnnfold
    from ..explain import Explanation

    program = _program(args.program, args.quantize)
    if not args.all:
        result = xnnfold.fold_gemm_params(program, llm_kernels=args.llm_kernels)
        print(xnnfold.format_explanation(Explanation.of(result)))
        return 0
    from tabulate import tabulate

    from .devtools import why_not_delegated

    # One lowering answers both: the GEMM table from its fold, the rest from XNNPACK's log.
    partitioner = xnnfold.XnnpackPartitioner(llm_kernels=args.llm_kernels)
    rows = why_not_delegated(program, partitioner)
    result = partitioner.last_result
    print(xnnfold.format_explanation(Explanation.of(result)))
    print(f"\nops left outside delegates after xnnfold: {len(rows)} (reason as XNNPACK's "
          "partitioner logged it)")
    if rows:
        print(tabulate([[r.node, r.op, r.reason] for r in rows],
                       headers=["node", "op", "XNNPACK's reason"]))
    return 0


# --------------------------------------------------------------------------------------------
# lower

def _lower_arguments(parser) -> None:
    parser.add_argument("program", help="a program saved with torch.export.save, "
                        "package.module:function returning (module, example_inputs), or a "
                        "built-in model name")
    parser.add_argument("-o", "--output", required=True, help="the .pte to write")
    parser.add_argument("--stock", action="store_true",
                        help="lower with executorch's stock partitioner instead")
    parser.add_argument("--explain", action="store_true", help="print the per-GEMM table")
    parser.add_argument("--quantize", choices=_QUANTIZE,
                        help="PT2E-quantize the model first (XNNPACK quantizer, per channel), "
                        "calibrated on its example inputs")
    parser.add_argument("--prefer", choices=["speed", "size"], default="speed",
                        help="where speed and size trade (a tied head): speed keeps stock's "
                        "choice, size stores the table once and repacks it on every call")
    parser.add_argument("--check", action="store_true",
                        help="run the written .pte on the ExecuTorch runtime (in a process of "
                        "its own) on the example inputs and compare it with the model in "
                        "eager (a quantized model: with an absolute tolerance of 3%% of its "
                        "largest output); exit code 1 if it does not run or differs")
    parser.add_argument("--llm-kernels", action="store_true", help=_LLM_KERNELS_HELP)


def _check_lower(args) -> None:
    checks.program(args.program)
    checks.output_file(args.output)
    if args.stock and args.llm_kernels:
        raise UsageError("--llm-kernels is xnnfold's: not with --stock")


def _cmd_lower(args) -> int:
    import xnnfold
    from ..explain import Explanation
    from .measure import STOCK, XNNFOLD, lower
    from .sources import export

    case = _case(args.program, args.quantize) if args.check else None
    program = export(case) if case is not None else _program(args.program, args.quantize)
    try:
        lowered = lower(program, STOCK if args.stock else XNNFOLD,
                        None if args.stock else {"prefer": args.prefer,
                                                 "llm_kernels": args.llm_kernels})
    except Exception as error:  # noqa: BLE001 - a program stock cannot lower either
        from .sources import first_line
        raise UsageError(f"{args.program}: lowering failed ({first_line(error, 200)})")
    output = Path(args.output)
    try:
        output.write_bytes(lowered.pte)
    except OSError as error:
        raise UsageError(f"{args.output}: cannot be written ({error.strerror})")
    fold = lowered.fold
    if fold is not None:
        print(f"folded {len(fold.constants)} constant(s) for "
              f"{len(fold.folded)} GEMM operand(s); packed projections split: {len(fold.split_projections)}; "
              f"freed params: {', '.join(fold.freed_params) or 'none'}")
        if fold.fallback:
            print(f"fell back to stock: {fold.fallback}")
        if args.explain:
            print(xnnfold.format_explanation(Explanation.of(fold)))
    print(f"GEMMs outside delegates: {len(lowered.gemms_outside)}; delegate calls: "
          f"{lowered.delegate_calls}; .pte bytes: {lowered.pte_bytes:,}; written to {output}")
    if case is not None:
        print(f"check: {_check(str(output), case, quantized=bool(args.quantize))}")
    return 0


def _check(path: str, case, quantized: bool) -> str:
    """``lower --check``: the .pte at ``path`` against ``case.model`` in eager
    (:func:`xnnfold.bench.isolated.check_pte`); :class:`CommandFailed` when it does not run or
    differs."""
    import torch

    from .isolated import check_pte

    with torch.no_grad():
        expected = case.model(*case.inputs)
    verdict = check_pte(path, case.inputs, expected, quantized)
    if not verdict.ok:
        raise CommandFailed(f"{path}: check failed: {verdict.reason}")
    return f"runs on the ExecuTorch runtime and matches eager ({verdict})"


# --------------------------------------------------------------------------------------------
# report

def _report_arguments(parser) -> None:
    parser.add_argument("model", nargs="*", help="package.module:function returning (module, "
                        "example_inputs[, dynamic_shapes]), a .pt2, or a built-in model name")
    parser.add_argument("--size", choices=["small", "large", "all"], default="small",
                        help="the built-in set measured when no model is named")
    parser.add_argument("--models", help="comma-separated built-in model names")
    parser.add_argument("--quantize", choices=_QUANTIZE,
                        help="PT2E-quantize each model first (XNNPACK quantizer, per channel), "
                        "calibrated on its example inputs")
    parser.add_argument("--reps", type=int, default=20, help="timed rounds per variant")
    parser.add_argument("--out", default="out/report", help="folder for report.md/.json/.png")
    parser.add_argument("--variants",
                        help="comma-separated: stock, xnnfold, xnnfold-size, stock-flag, ideal, "
                        "eager-export (zoo transformers models exported with eager attention, "
                        "lowered with stock), constant_prop_pass; ideal and eager-export where "
                        "a model has one (default: all but xnnfold-size, which --prefer size "
                        "adds, and without constant_prop_pass when a model is yours)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the per-round order")
    parser.add_argument("--prefer", choices=["speed", "size"], default="speed",
                        help="size: also lower xnnfold with prefer='size' (variant "
                        "xnnfold-size: a tied head's table stored once, repacked on every "
                        "call)")
    parser.add_argument("--no-profile", action="store_true",
                        help="skip the ETDump per-operator time breakdown")


def _check_report(args) -> None:
    """The model names, variants, reps and output folder; resolves ``args.names`` and
    ``args.variants`` (a list)."""
    names = [*args.model, *([n for n in args.models.split(",") if n] if args.models else [])]
    checks.models(names)
    args.names = names or None
    if args.variants is None:
        # constant_prop_pass is there to show its wrong answers on the built-in cases; a user's
        # model gets the variants a user can choose between
        user = any(is_user_spec(name) for name in names)
        variants = [v for v in VARIANTS if v != XNNFOLD_SIZE
                    and not (user and v == CONSTANT_PROP)]
    else:
        variants = [v for v in args.variants.split(",") if v]
    if args.prefer == "size" and XNNFOLD_SIZE not in variants:   # next to the default
        variants.insert(variants.index(XNNFOLD) + 1 if XNNFOLD in variants else 0, XNNFOLD_SIZE)
    checks.variants(variants)
    args.variants = variants
    checks.at_least("--reps", args.reps)
    checks.output_folder(args.out)
    _require("report", "tabulate", "tqdm")


def _cmd_report(args) -> int:
    charts = not _missing(_CHARTS)
    if not charts:
        print(f"xnnfold report: charts need {_CHARTS} ({_BENCH_EXTRA}); writing report.md "
              "and report.json only", file=sys.stderr, flush=True)
    from . import report, tables

    try:
        result = report.run_report(
            args.size, args.names, args.reps, Path(args.out), variants=args.variants,
            seed=args.seed, profile=not args.no_profile, verbose=args.verbose,
            quantize=args.quantize, charts=charts,
            on_skip=lambda name, why: print(f"skipped {name}: {why}", flush=True))
    except KeyError as error:
        raise UsageError(error.args[0])
    print(tables.rounds_line(result))
    print(tables.table(result))
    from .sources import ModelSource
    users = {ModelSource.of(n, args.quantize).name for n in args.names or [] if is_user_spec(n)}
    for name in dict.fromkeys(r["model"] for r in result["rows"]):
        if name in users:                    # the user's model: its GEMMs in its own terms
            gemms = tables.gemm_table(result, name)
            if gemms:
                print(f"\n{name}: GEMMs by module\n{gemms}")
    beside_ideal = tables.ideal_table(result)
    if beside_ideal:
        print(f"\n{beside_ideal}")
    print(f"\n{tables.lowering_table(result)}")
    written = [f for f in ("report.md", "report.json", *report.CHARTS)
               if (Path(args.out) / f).exists()]
    print(f"\nwritten: {args.out}/{', '.join(written)}")
    failed = [name for name, found in tables._by_model(result).items()
              if all(r["error"] for r in found.values())]
    if failed:
        first = next(r["error"] for r in result["rows"] if r["model"] == failed[0])
        raise CommandFailed(f"every variant of {', '.join(failed)} failed (first: {first})")
    return 0


# --------------------------------------------------------------------------------------------
# hf

def _hf_arguments(parser) -> None:
    parser.add_argument("folder", help="the folder save_pretrained wrote (config.json, weights)")
    parser.add_argument("-o", "--output", required=True, help="the .pte to write (Whisper, T5, "
                        "BART: OUT.encoder.pte and OUT.decoder.pte; CLIP: OUT.text.pte and "
                        "OUT.vision.pte)")
    parser.add_argument("--compare", action="store_true",
                        help="also lower with stock executorch; time both on the runtime")
    parser.add_argument("--tokens", type=int, default=8, help="tokens of a text input (a "
                        "causal LM: the prompt of the check)")
    parser.add_argument("--attention", choices=["sdpa", "eager"], default="sdpa",
                        help="transformers' attn_implementation for the export")
    parser.add_argument("--reps", type=int, default=10, help="timed rounds with --compare")
    parser.add_argument("--prefer", choices=["speed", "size"], default="speed",
                        help="where speed and size trade (a tied nn.Linear head): speed keeps "
                        "stock's choice, size stores the table once (a run-time weight)")
    parser.add_argument("--no-check", action="store_true", help="do not run the .pte on the "
                        "runtime against eager (checked by default; exit 1 when it differs)")
    parser.add_argument("--no-cache", action="store_true", help="a causal LM: the logits of "
                        "--tokens tokens, no KV cache, instead of prefill + decode")
    parser.add_argument("--max-cache", type=int, help="a causal LM: rows of the KV cache "
                        "(default: 1024, at most the model's positions)")
    parser.add_argument("--max-prefill", type=int, help="a causal LM: the longest prompt one "
                        "prefill call takes (default: 128, at most --max-cache; longer prompts "
                        "go in as chunks)")
    parser.add_argument("--threads", type=int, help="the runtime's threads for the check and "
                        "the timing (default: its own, one per core)")
    parser.add_argument("--llm-kernels", action="store_true", help="a causal LM: " +
                        _LLM_KERNELS_HELP + " (with --compare, xnnfold's default beside it)")


def _check_hf(args) -> None:
    from .hf_plan import plan     # reads config.json only: no torch, no transformers

    checks.hf_folder(args.folder, args.tokens)
    checks.at_least("--reps", args.reps)
    if args.threads is not None:
        checks.at_least("--threads", args.threads)
    checks.output_file(args.output)
    # the class and the cache sizes first: a class hf does not export is refused as such,
    # whether or not transformers is installed
    args.plan = plan(args.folder, args.tokens, not args.no_cache, args.max_cache,
                     args.max_prefill)
    _require("hf", "tabulate", "transformers", install="pip install 'xnnfold[zoo]'")


def _cmd_hf(args) -> int:
    from . import hf

    if args.threads is not None:
        from ..llm.runtime import set_threads
        set_threads(args.threads)
    exported = hf.export_folder(args.plan, args.output, compare=args.compare,
                                tokens=args.tokens, attention=args.attention, reps=args.reps,
                                prefer=args.prefer, check=not args.no_check,
                                cache=not args.no_cache, max_cache=args.max_cache,
                                max_prefill=args.max_prefill, llm_kernels=args.llm_kernels)
    print(hf.table(exported.rows))
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
                        "(methods prefill and decode)")
    parser.add_argument("--tokens", required=True, help="the prompt's token ids, e.g. 1,2,3")
    parser.add_argument("--max-new", type=int, default=32, help="tokens to generate")
    parser.add_argument("--ignore-eos", action="store_true",
                        help="do not stop at the EOS ids the .pte names")
    parser.add_argument("--threads", type=int, help="the runtime's threads (default: its own, "
                        "one per core)")
    parser.add_argument("--no-warmup", dest="warmup", action="store_false", help="time the "
                        "first calls too (by default a prefill and one decode step run first, "
                        "untimed)")


def _check_generate(args) -> None:
    try:
        args.prompt = [int(t) for t in args.tokens.split(",") if t.strip()]
    except ValueError:
        raise UsageError(f"--tokens {args.tokens!r}: expected comma-separated token ids")
    if not args.prompt:
        raise UsageError("--tokens: give at least one token id")
    if args.max_new < 1:
        raise UsageError(f"--max-new {args.max_new}: generate at least one token")
    if args.threads is not None:
        checks.at_least("--threads", args.threads)
    if not Path(args.pte).is_file():
        raise UsageError(f"{args.pte}: no such file")


def _cmd_generate(args) -> int:
    from ..llm.runtime import Generator, NotAGenerationProgram, set_threads

    if args.threads is not None:
        set_threads(args.threads)
    try:
        generator = Generator(args.pte)
        if args.warmup:                   # the first calls set up XNNPACK's operators
            generator.generate(args.prompt, 2, stop_at_eos=False)
        result = generator.generate(args.prompt, args.max_new,
                                    stop_at_eos=not args.ignore_eos)
    except (NotAGenerationProgram, ValueError) as error:
        raise UsageError(f"{args.pte}: {error}")
    except RuntimeError as error:                  # the runtime could not load it
        raise UsageError(f"{args.pte}: the runtime could not load it ({type(error).__name__}: "
                         f"{str(error).splitlines()[0][:160]})")
    print(result.summary())
    return 0


# --------------------------------------------------------------------------------------------
# bench

def _bench_description() -> str:
    import textwrap

    from .scripts import SCRIPTS, summary

    lines = "\n".join(textwrap.fill(summary(name), 96, initial_indent=f"  {name:22s} ",
                                    subsequent_indent=" " * 25) for name in SCRIPTS)
    return textwrap.fill(
        "Run one of the bench's one-off measurements, each in a process of its own (the "
        "bench's main measurement is `xnnfold report`). `xnnfold bench NAME --help` shows a "
        "script's own arguments.", 96) + f"\n\nscripts:\n{lines}"


def _bench_arguments(parser) -> None:
    from .scripts import SCRIPTS

    parser.add_argument("name", choices=list(SCRIPTS), metavar="NAME",
                        help="the script: " + ", ".join(SCRIPTS))
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")


def _cmd_bench(args) -> int:
    """One of the bench's scripts (:mod:`xnnfold.bench.scripts`), in a process of its own with
    this interpreter and this xnnfold importable."""
    import os
    import subprocess

    from .scripts import SCRIPTS

    package_root = str(Path(__file__).resolve().parents[2])     # the folder holding xnnfold
    path = os.pathsep.join([package_root, *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, "PYTHONPATH": path}
    if not args.verbose:
        env.setdefault("PYTHONWARNINGS", "ignore")
    done = subprocess.run([sys.executable, "-m", "xnnfold.bench.scripts.run",
                           SCRIPTS[args.name], *args.args], env=env)
    if done.returncode == 130:
        raise KeyboardInterrupt      # the script was interrupted: say so, exit 130
    return done.returncode


# --------------------------------------------------------------------------------------------
# the command line

COMMANDS = (
    Command("report", "stock vs xnnfold (vs stock-flag, ideal) on your model or built-in ones",
            _report_arguments, _cmd_report, _check_report),
    Command("lower", "lower a .pt2, a model factory or a built-in model to a .pte",
            _lower_arguments,
            _cmd_lower, _check_lower),
    Command("explain", "per-GEMM: plain, folded or declined and why", _explain_arguments,
            _cmd_explain, _check_explain),
    Command("hf", "a transformers model saved with save_pretrained to .pte through xnnfold "
            "(the class config.json names; a causal LM generation-ready)", _hf_arguments,
            _cmd_hf, _check_hf),
    Command("generate", "greedy decoding with a .pte `xnnfold hf` wrote for a causal LM; "
            "prints tokens/s of prefill and decode", _generate_arguments, _cmd_generate,
            _check_generate),
    Command("bench", "one-off measurements (xnnfold bench --help lists them)",
            _bench_arguments, _cmd_bench, description=_bench_description, in_process=False),
)


class _Version(argparse.Action):
    """``--version``: xnnfold's and the versions it runs with (read from the installed
    packages' metadata, nothing imported)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        import platform
        from importlib.metadata import PackageNotFoundError, version

        from .. import __version__

        def of(name: str) -> str:
            try:
                return version(name)
            except PackageNotFoundError:
                return "not installed"

        print(f"xnnfold {__version__} (torch {of('torch')}, executorch {of('executorch')}, "
              f"python {platform.python_version()})")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="xnnfold", description="Fold computed GEMM weights so XNNPACK delegates them.")
    parser.add_argument("--version", action=_Version, help="show the versions and exit")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    parser.add_argument("--verbose", action="store_true",
                        help="show what dependencies print (warnings, the runtime's C++ logs)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        description = command.description() if callable(command.description) else \
            command.description or command.help
        sub = commands.add_parser(command.name, help=command.help, description=description)
        command.arguments(sub)
        sub.set_defaults(command_=command)
    return parser


def main(argv=None) -> int:
    try:
        return _run(argv)
    except KeyboardInterrupt:
        pass             # anywhere, parsing included; the work's own handlers stopped its processes
    print("xnnfold: interrupted", file=sys.stderr)
    if argv is None:         # this process's own command line (the script, python -m xnnfold)
        sys.stdout.flush()
        sys.stderr.flush()
        # at once: the interpreter's teardown of torch and executorch takes 1-2 s more on a
        # loaded machine, and nothing is left to save
        os._exit(130)
    return 130


def _run(argv) -> int:
    args = None
    try:
        args = build_parser().parse_args(argv)
        command = args.command_
        command.check(args)              # before any heavy import
    except (ParserError, UsageError) as error:
        if args is not None and args.debug:
            raise
        print(f"xnnfold: error: {error}", file=sys.stderr)
        return 2
    # torch, torchao and executorch warn on every import and lowering, and the runtime's C++
    # logs to fd 2; none of it is the user's concern unless they ask (--verbose).
    stderr_filter = None
    try:
        if not args.verbose:
            from .quiet import quiet
            stderr_filter = quiet(python=command.in_process)
        return command.run(args)
    except (UsageError, CommandFailed) as error:
        if args.debug:
            raise
        print(f"xnnfold: error: {error}", file=sys.stderr)
        return 2 if isinstance(error, UsageError) else 1
    finally:
        if stderr_filter is not None:
            stderr_filter.close()

if __name__ == "__main__":
    sys.exit(main())
