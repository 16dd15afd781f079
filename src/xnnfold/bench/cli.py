"""Command line: ``xnnfold report``, ``xnnfold lower``, ``xnnfold explain``.

Bad input gets one line on stderr naming the problem and exit code 2; ``--debug`` shows the
traceback instead. Dependency noise (torchao, torch's ``_pytree``, the runtime's C++ log lines)
is filtered out unless ``--verbose`` (:mod:`xnnfold.bench.quiet`).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

from .sources import FACTORY_SPEC, UsageError

# What each command imports beyond the pass, and the extra that installs it.
_BENCH_EXTRA = "pip install 'xnnfold[bench]'"
_CHARTS = "matplotlib"


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


def _load(source: str, quantize=None):
    """A .pt2 file, or a ``package.module:function`` factory (told apart by the colon form
    and there being no such file), exported (:mod:`xnnfold.bench.sources`)."""
    from .sources import ModelSource, export, load_program

    if not quantize and not (FACTORY_SPEC.match(source) and not Path(source).exists()):
        return load_program(source)
    return export(ModelSource.of(source, quantize).build())


def _cmd_explain(args) -> int:
    import xnnfold
    from ..explain import Explanation

    if args.all:
        _require("explain --all", "tabulate")
    program = _load(args.program, args.quantize)
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


def _cmd_lower(args) -> int:
    import xnnfold
    from ..explain import Explanation
    from .measure import STOCK, XNNFOLD, lower

    program = _load(args.program, args.quantize)
    output = Path(args.output)
    if output.parent and not output.parent.exists():
        raise UsageError(f"{args.output}: folder {output.parent} does not exist")
    try:
        lowered = lower(program, STOCK if args.stock else XNNFOLD,
                        None if args.stock else {"prefer": args.prefer,
                                                 "llm_kernels": args.llm_kernels})
    except Exception as error:  # noqa: BLE001 - a program stock cannot lower either
        raise UsageError(f"{args.program}: lowering failed ({type(error).__name__}: "
                         f"{str(error).splitlines()[0][:200]})")
    output.write_bytes(lowered.pte)
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
    return 0


def _cmd_report(args) -> int:
    _require("report", "tabulate", "tqdm")
    charts = not _missing(_CHARTS)
    if not charts:
        print(f"xnnfold report: charts need {_CHARTS} ({_BENCH_EXTRA}); writing report.md "
              "and report.json only", file=sys.stderr, flush=True)
    from . import report, tables
    from .measure import CONSTANT_PROP, XNNFOLD_SIZE

    names = [*args.model, *([n for n in args.models.split(",") if n] if args.models else [])]
    names = names or None
    if args.variants is None:
        # constant_prop_pass is there to show its wrong answers on the built-in cases; a user's
        # model gets the variants a user can choose between
        from .sources import is_user_spec
        user = any(is_user_spec(name) for name in names or [])
        args.variants = ",".join(v for v in tables.VARIANTS if v != XNNFOLD_SIZE
                                 and not (user and v == CONSTANT_PROP))
    variants = [v for v in args.variants.split(",") if v]
    if args.prefer == "size" and "xnnfold-size" not in variants:   # next to the default
        variants.insert(variants.index("xnnfold") + 1 if "xnnfold" in variants else 0,
                        "xnnfold-size")
    unknown = [v for v in variants if v not in tables.VARIANTS]
    if unknown or not variants:
        raise UsageError(f"unknown variant {(unknown or [''])[0]!r}; known: "
                         f"{', '.join(tables.VARIANTS)}")
    try:
        result = report.run_report(
            args.size, names, args.reps, Path(args.out), variants=variants, seed=args.seed,
            profile=not args.no_profile, verbose=args.verbose, quantize=args.quantize,
            charts=charts,
            on_skip=lambda name, why: print(f"skipped {name}: {why}", flush=True))
    except KeyError as error:
        raise UsageError(error.args[0])
    print(tables.rounds_line(result))
    print(tables.table(result))
    for name in dict.fromkeys(r["model"] for r in result["rows"]):
        if name not in report._known():      # the user's model: its GEMMs in its own terms
            print(f"\n{name}: GEMMs by module\n{tables.gemm_table(result, name)}")
    beside_ideal = tables.ideal_table(result)
    if beside_ideal:
        print(f"\n{beside_ideal}")
    print(f"\n{tables.lowering_table(result)}")
    written = [f for f in ("report.md", "report.json", "latency.png", "operators.png")
               if (Path(args.out) / f).exists()]
    print(f"\nwritten: {args.out}/{', '.join(written)}")
    return 0


def _cmd_bench(args) -> int:
    """One of the bench's scripts (:mod:`xnnfold.bench.scripts`), in a process of its own with
    this interpreter and this xnnfold importable."""
    import os
    import subprocess

    from .scripts import SCRIPTS

    package_root = str(Path(__file__).resolve().parents[2])     # the folder holding xnnfold
    path = os.pathsep.join([package_root, *filter(None, [os.environ.get("PYTHONPATH")])])
    done = subprocess.run([sys.executable, "-m", f"xnnfold.bench.scripts.{SCRIPTS[args.name]}",
                           *args.args], env={**os.environ, "PYTHONPATH": path})
    return done.returncode


def _cmd_hf(args) -> int:
    _require("hf", "tabulate", "transformers", install="pip install 'xnnfold[zoo]'")
    from . import hf

    rows = hf.export_folder(args.folder, args.output, compare=args.compare, tokens=args.tokens,
                            attention=args.attention, reps=args.reps, prefer=args.prefer)
    print(hf.table(rows))
    return 0


_LLM_KERNELS_HELP = ("a KV cache's update and attention on executorch's llama::update_cache / "
                     "llama::custom_sdpa where proven exact: the .pte then needs a runtime with "
                     "executorch's LLM custom ops")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="xnnfold", description="Fold computed GEMM weights so XNNPACK delegates them.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    parser.add_argument("--verbose", action="store_true",
                        help="show what dependencies print (warnings, the runtime's C++ logs)")
    commands = parser.add_subparsers(dest="command", required=True)

    rep = commands.add_parser("report", help="stock vs xnnfold (vs stock-flag, ideal) on your "
                              "model or built-in ones")
    rep.add_argument("model", nargs="*", help="package.module:function returning (module, "
                     "example_inputs[, dynamic_shapes]), a .pt2, or a built-in model name")
    rep.add_argument("--size", choices=["small", "large", "all"], default="small")
    rep.add_argument("--models", help="comma-separated built-in model names")
    rep.add_argument("--quantize", choices=["dynamic", "static"],
                     help="PT2E-quantize each model first (XNNPACK quantizer, per channel), "
                     "calibrated on its example inputs")
    rep.add_argument("--reps", type=int, default=20, help="timed runs per variant")
    rep.add_argument("--out", default="out/report", help="folder for report.md/.json/.png")
    rep.add_argument("--variants",
                     help="comma-separated: stock, xnnfold, xnnfold-size, stock-flag, ideal, "
                     "eager-export (zoo transformers models exported with eager attention, "
                     "lowered with stock), constant_prop_pass; ideal and eager-export where a "
                     "model has one (default: all but xnnfold-size, which --prefer size adds, "
                     "and without constant_prop_pass when a model is yours)")
    rep.add_argument("--seed", type=int, default=0, help="seed of the per-round order")
    rep.add_argument("--prefer", choices=["speed", "size"], default="speed",
                     help="size: also lower xnnfold with prefer='size' (variant xnnfold-size: "
                     "a tied head's table stored once, repacked on every call)")
    rep.add_argument("--no-profile", action="store_true",
                     help="skip the ETDump per-operator time breakdown")
    rep.set_defaults(func=_cmd_report)

    low = commands.add_parser("lower", help="lower a .pt2 or a model factory to a .pte")
    low.add_argument("program", help="a program saved with torch.export.save, or "
                     "package.module:function returning (module, example_inputs)")
    low.add_argument("-o", "--output", required=True, help="the .pte to write")
    low.add_argument("--stock", action="store_true", help="lower with the stock partitioner")
    low.add_argument("--explain", action="store_true", help="print the per-GEMM table")
    low.add_argument("--quantize", choices=["dynamic", "static"],
                     help="PT2E-quantize a factory's model first (XNNPACK quantizer)")
    low.add_argument("--prefer", choices=["speed", "size"], default="speed",
                     help="where speed and size trade (a tied head): speed keeps stock's choice, "
                     "size stores the table once and repacks it on every call")
    low.add_argument("--llm-kernels", action="store_true", help=_LLM_KERNELS_HELP)
    low.set_defaults(func=_cmd_lower)

    exp = commands.add_parser("explain", help="per-GEMM: plain, folded or declined and why")
    exp.add_argument("program", help="a .pt2, or package.module:function returning "
                     "(module, example_inputs)")
    exp.add_argument("--quantize", choices=["dynamic", "static"],
                     help="PT2E-quantize a factory's model first (XNNPACK quantizer)")
    exp.add_argument("--all", action="store_true",
                     help="also list every op left outside delegates, with XNNPACK's reason")
    exp.add_argument("--llm-kernels", action="store_true", help=_LLM_KERNELS_HELP)
    exp.set_defaults(func=_cmd_explain)
    hug = commands.add_parser("hf", help="a transformers model saved with save_pretrained "
                              "(Whisper, a causal LM, a ViT) to .pte through xnnfold")
    hug.add_argument("folder", help="the folder save_pretrained wrote (config.json, weights)")
    hug.add_argument("-o", "--output", required=True, help="the .pte to write (Whisper: "
                     "OUT.encoder.pte and OUT.decoder.pte)")
    hug.add_argument("--compare", action="store_true",
                     help="also lower with stock executorch; time both on the runtime")
    hug.add_argument("--tokens", type=int, default=8, help="tokens of a decoder's input")
    hug.add_argument("--attention", choices=["sdpa", "eager"], default="sdpa",
                     help="transformers' attn_implementation for the export")
    hug.add_argument("--reps", type=int, default=10, help="timed rounds with --compare")
    hug.add_argument("--prefer", choices=["speed", "size"], default="speed",
                     help="where speed and size trade (a tied nn.Linear head): speed keeps "
                     "stock's choice, size stores the table once (a run-time weight)")
    hug.set_defaults(func=_cmd_hf)

    from .scripts import SCRIPTS

    ben = commands.add_parser("bench", help="one-off measurements: " + ", ".join(SCRIPTS),
                              description="Run one of the bench's scripts (see "
                              "src/xnnfold/bench/scripts/README.md for what each measures).")
    ben.add_argument("name", choices=list(SCRIPTS))
    ben.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    ben.set_defaults(func=_cmd_bench)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "reps", 1) is not None and getattr(args, "reps", 1) < 1:
        parser.error("--reps must be at least 1")
    # torch, torchao and executorch warn on every import and lowering, and the runtime's C++
    # logs to fd 2; none of it is the user's concern unless they ask (--verbose).
    stderr_filter = None
    if not args.verbose:
        from .quiet import quiet
        stderr_filter = quiet()
    try:
        return args.func(args)
    except UsageError as error:
        if args.debug:
            raise
        print(f"xnnfold: error: {error}", file=sys.stderr)
        return 2
    finally:
        if stderr_filter is not None:
            stderr_filter.close()


if __name__ == "__main__":
    sys.exit(main())
