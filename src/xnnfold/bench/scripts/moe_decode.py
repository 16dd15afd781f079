"""Mixture-of-experts decode: the weights one decode step reads against the active parameters
(router + top-k experts + the rest), xnnfold's routed export (one cond per expert) against every
expert run on every token, transformers' batched_mm (gathered weights, a run-time batched matmul)
and the floor (the same model with E = k experts: all of them active), Mixtral's code.

    xnnfold bench moe-decode [--hidden 512] [--layers 4] [--experts 8] [--vocab 32000]
                             [--position 512] [--rounds 20] [--variants routed,...]

One decode step (transformers' static cache of 1,024 rows), each variant lowered with xnnfold and
checked against eager, then timed interleaved, one thread, medians; bytes by count of the
weights each variant's step reads (decode is memory-bound: time over the floor's ~ bytes over
the active ones).
The lowerings run with xnnfold's default settings (xnnfold.config: verification off), as
users run them.
"""

from __future__ import annotations

from xnnfold.bench.scripts import parser

VARIANTS = ("routed", "all-experts", "batched-mm", "floor")


def build_parser():
    args = parser(__file__, __doc__)
    args.add_argument("--hidden", type=int, default=512, help="hidden size (head size 64)")
    args.add_argument("--layers", type=int, default=4, help="decoder layers")
    args.add_argument("--experts", type=int, default=8, help="experts per layer (top-2)")
    args.add_argument("--expert-mlp", type=int, default=0,
                      help="each expert's intermediate size (default: 3 x hidden)")
    args.add_argument("--vocab", type=int, default=32_000, help="vocabulary size")
    args.add_argument("--position", type=int, default=512, help="the decode step's position")
    args.add_argument("--rounds", type=int, default=20, help="interleaved timed rounds")
    args.add_argument("--variants", default=",".join(VARIANTS),
                      help=f"comma-separated, of: {', '.join(VARIANTS)}")
    return args


def parse_args(argv=None):
    args_parser = build_parser()
    args = args_parser.parse_args(argv)
    args.variant_list = [v for v in args.variants.split(",") if v]
    unknown = [v for v in args.variant_list if v not in VARIANTS]
    if unknown or not args.variant_list:
        args_parser.error(f"--variants: unknown {', '.join(unknown) or '(none given)'}; known: "
                          f"{', '.join(VARIANTS)}")
    if args.experts < 3:
        args_parser.error(f"--experts: at least 3 (top-2 of them), not {args.experts}")
    if not 0 <= args.position < 1023:
        args_parser.error(f"--position: 0 to 1022, not {args.position}")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)                 # --help answers before torch is imported
    from xnnfold.pte.quiet import quiet
    stderr_filter = quiet()
    from xnnfold.bench import moe
    from xnnfold.bench.decode import machine_line, one_thread
    from xnnfold.models.families import Sizes

    one_thread()
    heads = max(1, args.hidden // 64)
    sizes = Sizes(hidden=args.hidden, layers=args.layers, heads=heads,
                  kv_heads=max(1, heads // 4), vocab=args.vocab, experts=args.experts,
                  top_k=2)
    mlp = args.expert_mlp or 3 * args.hidden
    print(f"machine: {machine_line()}", flush=True)
    print(f"Mixtral: hidden {sizes.hidden}, {sizes.layers} layers, {sizes.heads} heads "
          f"({sizes.kv_heads} KV), vocab {sizes.vocab:,}, {sizes.experts} experts of "
          f"intermediate {mlp}, top-2; decode at position {args.position}", flush=True)
    try:
        lowered, bytes_read = {}, {}
        for variant in args.variant_list:
            model = moe.build(sizes, experts=2 if variant == "floor" else None,
                              intermediate=mlp)
            low = moe.lower_decode(model, variant, cache=1024)
            lowered[variant] = low
            bytes_read[variant] = moe.weight_bytes(model, variant, sizes.top_k)
            print(f"{variant:12s} lowered in {low.seconds:6.1f} s, .pte {len(low.pte):,} B, "
                  f"{len(low.ops_outside)} ops outside delegates; vs eager: {low.check}",
                  flush=True)
        medians = moe.time_interleaved({v: low.pte for v, low in lowered.items()},
                                       args.position, args.rounds)
    finally:
        stderr_filter.close()
    active = next(iter(bytes_read.values()))["active"]
    floor = medians.get("floor")
    print(f"\nactive parameters (router + top-2 experts + the rest): {active / 1e6:.1f} MB\n")
    print(f"| variant | weights read per step | x active | decode step (median of "
          f"{args.rounds}) | x floor's time |")
    print("|---|---|---|---|---|")
    for variant in lowered:
        total = bytes_read[variant]["total"]
        ratio = f"{medians[variant] / floor:.2f}x" if floor else ""
        print(f"| {variant} | {total / 1e6:.1f} MB | {total / active:.2f}x | "
              f"{medians[variant]:.2f} ms | {ratio} |")


if __name__ == "__main__":
    main()
