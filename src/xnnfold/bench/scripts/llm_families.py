"""The LLM families table: every transformers causal-LM family of xnnfold.models.families
(the families people bring and optimum-executorch's text-generation families, mixtures of
experts) through the public LLM API: exports / lowers / greedy tokens equal eager / decode
time against stock / share on portable / the pass's step, one row per family.

    xnnfold bench llm-families [--fast] [--families llama,mixtral,...] [--output FILE.md]
                               [--hidden 512] [--layers 4] [--vocab 32000] [--cache 1024]
                               [--tokens 300] [--position 512] [--rounds 10]

Random weights (seeded), one thread, each family in a process of its own; --fast: tiny sizes
(hidden 64, 2 layers, vocab 256, cache 64, 12 tokens), no ETDump, for a smoke test.
The lowerings run with xnnfold's default settings (xnnfold.config: verification off), as
users run them.
"""

from __future__ import annotations

from xnnfold.bench.scripts import parser


def build_parser():
    args = parser(__file__, __doc__)
    args.add_argument("--fast", action="store_true",
                      help="tiny sizes, few tokens, no ETDump (a smoke test)")
    args.add_argument("--families", default="",
                      help="comma-separated families (default: all; see --list)")
    args.add_argument("--list", action="store_true", help="list the families and exit")
    args.add_argument("--output", default="", help="also write the table (markdown) here")
    args.add_argument("--hidden", type=int, default=512, help="hidden size (head size 64)")
    args.add_argument("--layers", type=int, default=4, help="decoder layers")
    args.add_argument("--vocab", type=int, default=32_000, help="vocabulary size")
    args.add_argument("--experts", type=int, default=8, help="experts of a mixture, top-2")
    args.add_argument("--cache", type=int, default=1024, help="cache rows")
    args.add_argument("--tokens", type=int, default=300, help="greedy tokens checked")
    args.add_argument("--position", type=int, default=512, help="the decode step timed")
    args.add_argument("--rounds", type=int, default=10, help="interleaved timed rounds")
    return args


def parse_args(argv=None):
    from xnnfold.models.families import FAMILIES

    args_parser = build_parser()
    args = args_parser.parse_args(argv)
    chosen = [f for f in args.families.split(",") if f] or list(FAMILIES)
    unknown = [f for f in chosen if f not in FAMILIES]
    if unknown:
        args_parser.error(f"--families: unknown {', '.join(unknown)}; known: "
                          f"{', '.join(FAMILIES)}")
    if not args.fast and not 0 < args.position < args.cache - 1:
        args_parser.error(f"--position: 1 to the cache - 2 ({args.cache - 2}), "
                          f"not {args.position}")
    args.family_list = chosen
    return args


def main(argv=None) -> None:
    args = parse_args(argv)                 # --help answers before torch is imported
    from xnnfold.models.families import FAMILIES, FAST, Sizes
    if args.list:
        print("\n".join(FAMILIES))
        return
    from xnnfold.bench import families as bench
    from xnnfold.bench.decode import machine_line, one_thread
    from xnnfold.pte.quiet import quiet

    stderr_filter = quiet()
    one_thread()
    if args.fast:
        sizes, options = FAST, bench.FAST
    else:
        heads = max(1, args.hidden // 64)
        sizes = Sizes(hidden=args.hidden, layers=args.layers, heads=heads,
                      kv_heads=max(1, heads // 4), vocab=args.vocab, experts=args.experts)
        options = bench.Options(cache=args.cache, tokens=args.tokens, position=args.position,
                                rounds=args.rounds)
    heading = (f"LLM families: hidden {sizes.hidden}, {sizes.layers} layers, {sizes.heads} "
               f"heads ({sizes.kv_heads} KV), vocab {sizes.vocab:,}, {sizes.experts} experts "
               f"top-{sizes.top_k} for mixtures; cache {options.cache}, {options.tokens} greedy "
               f"tokens, decode at position {options.position} (median of {options.rounds} "
               f"interleaved rounds); {machine_line()}")
    rows = []
    try:
        for family in args.family_list:
            row = bench.isolated_row(family, sizes, options)
            rows.append(row)
            print("| " + " | ".join(bench.cells(row)) + " |", flush=True)
    finally:
        stderr_filter.close()
    table = bench.markdown(rows, heading)
    print("\n" + table)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as out:
            out.write(table)


if __name__ == "__main__":
    main()
