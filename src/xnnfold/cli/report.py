"""``xnnfold report``: stock against xnnfold against the ideal rewrite (:mod:`xnnfold.bench.report`),
its tables printed and its files written."""

from __future__ import annotations

import sys
from pathlib import Path

from . import checks
from ..models.sources import is_user_spec
from ..pte.variants import CONSTANT_PROP, VARIANTS, XNNFOLD, XNNFOLD_SIZE
from ..usage import UsageError
from .command import BENCH_EXTRA, CHARTS, Command, CommandFailed, not_installed, QUANTIZE, require


def _report_arguments(parser) -> None:
    parser.add_argument("model", nargs="*", help="package.module:function returning (module, "
                        "example_inputs[, dynamic_shapes]), a .pt2, or a built-in model name")
    parser.add_argument("--size", choices=["small", "large", "all"], default="small",
                        help="the built-in set measured when no model is named")
    parser.add_argument("--models", help="comma-separated built-in model names")
    parser.add_argument("--quantize", choices=QUANTIZE,
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
    require("report", "tabulate", "tqdm")


def _cmd_report(args) -> int:
    charts = not not_installed(CHARTS)
    if not charts:
        print(f"xnnfold report: charts need {CHARTS} ({BENCH_EXTRA}); writing report.md "
              "and report.json only", file=sys.stderr, flush=True)
    from ..bench import report, tables

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
    from ..models.sources import ModelSource
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


REPORT = Command("report", "stock vs xnnfold (vs stock-flag, ideal) on your model or built-in ones",
                 _report_arguments, _cmd_report, _check_report)
