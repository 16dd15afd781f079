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

At a real model's dims, from a folder (``xnnfold bench llm-folder``'s):

    xnnfold bench llm-runner --folder DIR [--folder DIR2] --keep KEEP [--quant none,8da4w]
                             [--threads 1,2] [--optimum-cli PATH] [--llama-cpp BIN_DIR
                             --gguf-converter LLAMA_CPP_TREE --gguf-python PATH]
                             [--xnnfold-kernels default,llm] [--profile] [--export-only]

xnnfold's .pte (``xnnfold hf``), optimum-executorch's (its CLI) and llama.cpp's GGUF (f32 for
fp32, q4_0 for 8da4w; ``llama-bench``) of each folder, exported one at a time under
``/usr/bin/time -v`` into ``KEEP/FOLDER_NAME/`` (a file already there is reused: a rerun only
measures), then per precision and thread count interleaved rounds in ``TextLLMRunner`` and
``llama-bench``; one table of prefill, decode, their ratios and the memory floor, one of the
exports' bytes, wall time and peak resident set (``KEEP/table.md``, rows in
``KEEP/results.jsonl``).
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
    args.add_argument("--quant", help="xnnfold hf --quantize: none, 8da4w or int8 (optimum: "
                      "--qlinear 8da4w / 8da8w); with --folder a comma-separated list of none "
                      "and 8da4w (default: none; with --folder: none,8da4w)")
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
    args.add_argument("--folder", action="append", help="a transformers folder (xnnfold "
                      "bench llm-folder's) to measure instead of the toy model; repeatable; "
                      "needs --keep")
    args.add_argument("--threads", default="1", help="with --folder: comma-separated thread "
                      "counts, each measured (the toy model: 1 only)")
    args.add_argument("--llama-cpp", help="with --folder: llama.cpp's build folder holding "
                      "llama-bench and llama-quantize (the llama.cpp variant; without it, "
                      "skipped)")
    args.add_argument("--gguf-converter", help="with --llama-cpp: the llama.cpp source tree "
                      "whose convert_hf_to_gguf.py converts a folder to f32.gguf (needed only "
                      "when KEEP has none)")
    args.add_argument("--gguf-python", help="the python that runs the converter (with the "
                      "gguf package of that tree; default: this one)")
    args.add_argument("--xnnfold-kernels", default="default", help="with --folder: "
                      "comma-separated, of default (xnnfold hf's .pte: the stock runtime's "
                      "kernels) and llm (xnnfold hf --llm-kernels: executorch's llama:: "
                      "kernels, as optimum's .pte needs; its own file and column); default: "
                      "default")
    args.add_argument("--profile", action="store_true", help="with --folder: also one "
                      "decode step of each .pte at position prompt + new/2 per thread count, "
                      "timed by part from an ETDump (XNNPACK delegate calls, each portable and "
                      "llama:: op) into KEEP/profile.md")
    args.add_argument("--export-only", action="store_true", help="with --folder: make the "
                      "exports and their table, measure nothing")
    return args


def _folder_args(args_parser, args) -> None:
    """The checks of --folder's mode; the lists it runs over."""
    from pathlib import Path

    if not args.keep:
        args_parser.error("--folder needs --keep (the exports are kept there)")
    for folder in args.folder:
        if not (Path(folder) / "config.json").is_file() or \
                not (Path(folder) / "tokenizer.json").is_file():
            args_parser.error(f"--folder {folder}: no config.json and tokenizer.json there")
    precisions = (args.quant or "none,8da4w").split(",")
    if not precisions or any(p not in ("none", "8da4w") for p in precisions):
        args_parser.error(f"--quant {args.quant}: with --folder, of none and 8da4w")
    args.precision_list = ["fp32" if p == "none" else p for p in precisions]
    args.kernel_list = args.xnnfold_kernels.split(",")
    if not args.kernel_list or any(k not in ("default", "llm") for k in args.kernel_list):
        args_parser.error(f"--xnnfold-kernels {args.xnnfold_kernels}: comma-separated, of "
                          "default and llm")
    try:
        args.thread_list = [int(t) for t in args.threads.split(",")]
    except ValueError:
        args.thread_list = []
    if not args.thread_list or min(args.thread_list) < 1:
        args_parser.error(f"--threads {args.threads}: comma-separated counts of at least 1")
    if args.gguf_converter and not (Path(args.gguf_converter) /
                                    "convert_hf_to_gguf.py").is_file():
        args_parser.error(f"--gguf-converter {args.gguf_converter}: no convert_hf_to_gguf.py")
    if args.llama_cpp and not (Path(args.llama_cpp) / "llama-bench").is_file():
        args_parser.error(f"--llama-cpp {args.llama_cpp}: no llama-bench there")


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
    if args.folder:
        _folder_args(args_parser, args)
        return args
    args.quant = args.quant or "none"
    if args.quant not in ("none", "8da4w", "int8"):
        args_parser.error(f"--quant {args.quant}: none, 8da4w or int8")
    if args.threads != "1":
        args_parser.error("--threads: the toy model runs on one thread (use --folder)")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)                  # --help answers before torch is imported
    from xnnfold.pte.quiet import quiet
    stderr_filter = quiet()
    from xnnfold.bench import runner_real, runner_timing

    try:
        (runner_real if args.folder else runner_timing).run(args)
    finally:
        stderr_filter.close()


if __name__ == "__main__":
    main()
