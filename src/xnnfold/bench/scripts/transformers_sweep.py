"""transformers' exporter over every model class its auto mappings build at tiny dims, stock
against stock with its force_non_static_weights_for_f32_linear flag against xnnfold (register():
the "xnnfold" format), each class in a process of its own: exports
(with the one-line reason where not), outputs against eager at each row's scale, delegate calls,
ops outside delegates and their share of the run's time, .pte bytes, latency ratio.

    xnnfold bench transformers-sweep -o DIR [--classes PATTERN] [--limit N] [--timeout S]
                                     [--rounds N] [--redo-missing-variant]
    xnnfold bench transformers-sweep -o DIR --merge OTHER_DIR [--merge ...]

Writes DIR/sweep.csv (one row per class, appended as each finishes; a class already there is
skipped, so a sweep interrupted resumes; --redo-missing-variant first measures again the rows
written before the stock flag's columns were) and DIR/sweep.md (the totals, the largest speed-ups,
every class where xnnfold gains nothing or fails and why, the whole table). The most used
families come first (BERT, GPT-2, Llama, ViT, CLIP, Whisper, T5, ...: their base models, then
their heads). Run it niced on a shared machine; it holds one process at a time. To use two
cores, run two sweeps over disjoint --classes into two folders, then --merge one into the
other (a class in both keeps the row with more exports): it measures nothing.
"""

from __future__ import annotations

import re
import sys

from xnnfold.bench.scripts import parser


def build_parser():
    args = parser(__file__, __doc__)
    args.add_argument("-o", "--output", required=True, help="the folder of sweep.csv/.md")
    args.add_argument("--classes", default="",
                      help="a regular expression the class names must match (re.search)")
    args.add_argument("--limit", type=int, default=0, help="classes to measure (0: all)")
    args.add_argument("--timeout", type=float, default=900, help="seconds per class")
    args.add_argument("--rounds", type=int, default=20, help="interleaved timing rounds")
    args.add_argument("--redo-missing-variant", action="store_true",
                      help="first measure again the classes whose rows lack a variant")
    args.add_argument("--merge", action="append", default=[], metavar="OTHER_DIR",
                      help="add another sweep folder's rows to -o's table, measure nothing")
    return args


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        re.compile(args.classes)
    except re.error as error:
        print(f"xnnfold: error: bench transformers-sweep: --classes {args.classes!r}: {error}",
              file=sys.stderr)
        return 2
    if args.limit < 0 or args.timeout <= 0 or args.rounds < 1:
        print("xnnfold: error: bench transformers-sweep: --limit >= 0, --timeout > 0, "
              "--rounds >= 1", file=sys.stderr)
        return 2
    from pathlib import Path

    from xnnfold.bench.transformers_sweep import sweep
    from xnnfold.pte.quiet import quiet

    if args.merge:
        from xnnfold.bench.transformers_sweep import merge

        try:
            changed = merge(Path(args.output), args.merge)
        except FileNotFoundError as error:
            print(f"xnnfold: error: bench transformers-sweep: --merge {error}", file=sys.stderr)
            return 2
        print(f"{changed} rows added or replaced: {args.output}/sweep.csv, "
              f"{args.output}/sweep.md")
        return 0
    quiet()             # the runtime's log lines, this process's and the children's
    rows = sweep(Path(args.output), args.classes, args.limit, args.timeout, args.rounds,
                 echo=lambda line: print(line, flush=True),
                 redo_missing_variant=args.redo_missing_variant)
    print(f"{len(rows)} classes measured: {args.output}/sweep.csv, {args.output}/sweep.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
