"""LLM generation in executorch's own runner: xnnfold's generation .pte (one
``forward``) run by ``TextLLMRunner`` and timed with the runner's own Stats, beside the
two-method layout xnnfold wrote before (a static ``decode`` method, run as ``xnnfold generate``
ran it) and, given its command line, optimum-executorch's ``--use_custom_sdpa
--use_custom_kv_cache`` .pte of the same folder in the same runner.

    xnnfold bench llm-runner [--hidden 512] [--cache 1024] [--prompt 128] [--new 64]
                             [--quant none|8da4w|int8] [--variants ...] [--rounds 7]
                             [--optimum-cli PATH/optimum-cli] [--keep DIR]

The model: transformers' Llama at ``--hidden`` (head size 64, a KV head per 4 query heads; 512:
llm-decode's 8 / 2 heads, 4 layers, vocabulary 32,000), random weights; a tokenizer.json of
exactly the vocabulary, each prompt character one token. Every variant generates ``--new``
tokens after the same ``--prompt``-token prompt once per round, in a shuffled order, one thread;
prefill ms (the whole prompt) and decode ms per token are medians over the rounds. The texts
generated are compared (greedy: the same tokens). Verification is off: lowered as users lower.
"""

from __future__ import annotations

from xnnfold.bench.scripts import parser

VARIANTS = ("runner", "runner-llm", "generate", "generate-llm", "two-method",
            "two-method-llm", "optimum")
DEFAULT_VARIANTS = ("runner", "runner-llm", "two-method", "two-method-llm", "optimum")



def build_parser():
    args = parser(__file__, __doc__)
    args.add_argument("--hidden", type=int, default=512, help="hidden size (head size 64, a "
                      "KV head per 4 query heads)")
    args.add_argument("--layers", type=int, default=4, help="decoder layers")
    args.add_argument("--vocab", type=int, default=32_000, help="vocabulary size")
    args.add_argument("--cache", type=int, default=1024, help="KV cache rows")
    args.add_argument("--prompt", type=int, default=128, help="prompt tokens (the prefill "
                      "timed; the .pte's longest chunk, get_max_seq_len, is 128)")
    args.add_argument("--new", type=int, default=64, help="tokens generated per round")
    args.add_argument("--rounds", type=int, default=7, help="interleaved rounds")
    args.add_argument("--quant", choices=["none", "8da4w", "int8"], default="none",
                      help="xnnfold hf --quantize (optimum: --qlinear 8da4w / 8da8w)")
    args.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                      help=f"comma-separated, of: {', '.join(VARIANTS)} (runner*: "
                      "TextLLMRunner on xnnfold's forward .pte, its Stats; generate*: xnnfold "
                      "generate's Generator on it; two-method*: the former layout's static "
                      "decode method as xnnfold generate ran it; -llm: --llm-kernels; optimum: "
                      "TextLLMRunner on optimum-executorch's .pte)")
    args.add_argument("--optimum-cli", help="optimum-cli of an environment with "
                      "optimum-executorch (it pins transformers 5.0.0rc1: a venv of its own) "
                      "for the optimum variant; without it, that variant is skipped")
    args.add_argument("--keep", help="a folder to keep the model folder and the .pte files in "
                      "(default: a temporary one); a .pte already there is reused (for the same "
                      "arguments: the file names say the variant only)")
    return args


def parse_args(argv=None):
    args_parser = build_parser()
    args = args_parser.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or not variants:
        args_parser.error(f"--variants: unknown {', '.join(unknown) or '(none given)'}; known: "
                          f"{', '.join(VARIANTS)}")
    for option in ("hidden", "layers", "vocab", "cache", "prompt", "new", "rounds"):
        if getattr(args, option) < 1:
            args_parser.error(f"--{option}: at least 1")
    if args.prompt + args.new > args.cache:
        args_parser.error(f"--prompt {args.prompt} + --new {args.new} exceed --cache "
                          f"{args.cache}")
    if args.vocab < 200:
        args_parser.error("--vocab: at least 200 (the tokenizer's characters and fillers)")
    args.variant_list = variants
    return args


def main(argv=None) -> None:
    args = parse_args(argv)                  # --help answers before torch is imported
    from xnnfold.pte.quiet import quiet
    stderr_filter = quiet()
    from xnnfold.bench import runner_timing as bench

    try:
        bench.run(args)
    finally:
        stderr_filter.close()


if __name__ == "__main__":
    main()
