"""LLM decode with a KV cache: one decode step (or a prefill) of a decoder-only LM,
exported the plain way (transformers' ``TorchExportableModuleForDecoderOnlyLM``, static cache)
and lowered with stock and with xnnfold (default, and ``llm_kernels=True``), beside executorch's
own LLM flow (its example Llama with the custom KV cache and ``llama::custom_sdpa``) on the same
dims; the memory floor (bytes of weights and cache one step reads / this machine's measured
copy bandwidth) and the share of the step on portable kernels (ETDump).

    xnnfold bench llm-decode [--hidden 512] [--cache 1024] [--positions 16,512,1000]
                             [--rounds 30] [--variants ...] [--prefill 128] [--quant int8]
                             [--arch gemma2] [--dynamic 128]

Every variant is first run for 4 steps from an empty cache and compared with its eager module;
then all are timed interleaved in one process, one thread, medians per position.
The lowerings run with xnnfold's default settings (xnnfold.config: verification off), as users run them.
"""

from __future__ import annotations

from xnnfold.bench.scripts import parser

VARIANTS = ("hf-stock", "hf-stock-flag", "hf-xnnfold", "hf-xnnfold-llm", "et-stock",
            "et-plain-stock", "et-plain-xnnfold", "et-plain-xnnfold-llm")
# stock's own flag beside stock: xnnfold must beat both
DEFAULT_VARIANTS = ("hf-stock", "hf-stock-flag", "hf-xnnfold", "hf-xnnfold-llm", "et-stock")
ARCHITECTURES = ("llama", "qwen2", "phi3", "gemma", "smollm", "gemma2", "bloom", "opt", "mpt",
                 "falcon-alibi")   # models.decoder_lm.ARCHITECTURES, without importing torch
NOTES = {
    "hf-stock": "transformers static cache, stock partitioner",
    "hf-stock-flag": "transformers static cache, stock partitioner with "
                     "force_non_static_weights_for_f32_linear",
    "hf-xnnfold": "transformers static cache, xnnfold (default kernels)",
    "hf-xnnfold-llm": "transformers static cache, xnnfold llm_kernels=True",
    "et-stock": "executorch's LLM flow (custom KV cache + llama::custom_sdpa), stock",
    "et-plain-stock": "executorch's example Llama, plain KV cache and SDPA, stock",
    "et-plain-xnnfold": "executorch's example Llama, plain KV cache and SDPA, xnnfold",
    "et-plain-xnnfold-llm": "executorch's example Llama, plain KV cache and SDPA, xnnfold "
                            "llm_kernels=True",
}


def build_parser():
    args = parser(__file__, __doc__)
    args.add_argument("--hidden", default="512", help="comma-separated hidden sizes "
                      "(head size 64, a KV head per 4 query heads; 512 -> 8 / 2 heads)")
    args.add_argument("--cache", default="1024", help="comma-separated cache lengths")
    args.add_argument("--positions", default="16,512,1000",
                      help="comma-separated decode positions (each < cache)")
    args.add_argument("--layers", type=int, default=4, help="decoder layers")
    args.add_argument("--vocab", type=int, default=32_000, help="vocabulary size")
    args.add_argument("--rounds", type=int, default=30, help="interleaved timed rounds")
    args.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                      help=f"comma-separated, of: {', '.join(VARIANTS)}; a variant "
                      "+reinplace runs to_executorch with run_reinplace_pass=True")
    args.add_argument("--arch", default="llama", choices=ARCHITECTURES,
                      help="the transformers architecture")
    args.add_argument("--prefill", type=int, default=0,
                      help="time a prefill of this many tokens at position 0 instead (0: a "
                      "decode step)")
    args.add_argument("--dynamic", type=int, default=0,
                      help="export one program for steps of 1 to this many tokens (the "
                      "generation .pte's one method: prefill and decode through it) and time "
                      "its decode step (0: a program of the step's own static length)")
    args.add_argument("--last-logits", action="store_true",
                      help="the transformers road computes the last token's logits only "
                      "(logits_to_keep=1), as executorch's flow does (for --prefill)")
    args.add_argument("--quant", choices=["none", "int8", "8da4w", "pt2e-int8"], default="none",
                      help="what `xnnfold hf --quantize` ships (torchao): int8, 8-bit dynamic "
                      "activations and 8-bit weights per channel; 8da4w, 8-bit dynamic "
                      "activations and 4-bit weights in groups of 32; pt2e-int8: XNNPACK's PT2E "
                      "quantizer, dynamic per channel (what int8 measured before 2026-12-05)")
    args.add_argument("--no-etdump", action="store_true", help="skip the portable share")
    return args


def parse_args(argv=None):
    """The arguments, checked (one line, exit 2) before anything heavy is imported."""
    args_parser = build_parser()
    args = args_parser.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v.split("+")[0] not in VARIANTS or
               v.split("+")[1:] not in ([], ["reinplace"])]
    if unknown or not variants:
        args_parser.error(f"--variants: unknown {', '.join(unknown) or '(none given)'}; known: "
                          f"{', '.join(VARIANTS)}")
    for option in ("hidden", "cache", "positions"):
        try:
            values = _ints(getattr(args, option))
        except ValueError:
            values = []
        if not values or min(values) < (0 if option == "positions" else 1):
            args_parser.error(f"--{option}: comma-separated positive integers, not "
                              f"{getattr(args, option)!r}")
    if max(_ints(args.positions)) >= min(_ints(args.cache)) and not args.prefill:
        args_parser.error(f"--positions: each must be below the cache ({args.cache})")
    if args.dynamic < 0 or args.dynamic >= min(_ints(args.cache)) or \
            (args.dynamic and args.prefill > args.dynamic):
        args_parser.error(f"--dynamic: 0, or 1 .. the cache ({args.cache}) less one, at least "
                          f"--prefill, not {args.dynamic}")
    if args.prefill < 0 or args.prefill > min(_ints(args.cache)):
        args_parser.error(f"--prefill: 0 .. the cache ({args.cache}), not {args.prefill}")
    args.variant_list = variants
    return args


def _ints(text: str) -> list:
    return [int(x) for x in text.split(",") if x]


def main(argv=None) -> None:
    args = parse_args(argv)                 # --help answers before torch is imported
    from xnnfold.pte.quiet import quiet
    stderr_filter = quiet()
    from xnnfold.bench import decode as bench
    bench.one_thread()

    variants = args.variant_list
    print(f"machine: {bench.machine_line()}", flush=True)
    bandwidth = bench.copy_bandwidth()
    print(f"copy bandwidth, one thread (256 MB torch copy, bytes read + written per second): "
          f"{bandwidth / 1e9:.2f} GB/s", flush=True)
    try:
        for cache in _ints(args.cache):
            for hidden in _ints(args.hidden):
                bench.run_size(hidden, cache, args, variants, bandwidth)
    finally:
        stderr_filter.close()


if __name__ == "__main__":
    main()
