"""``xnnfold hf`` (a transformers folder to .pte files, :mod:`xnnfold.export.hf`)."""

from __future__ import annotations

from . import checks
from ..usage import UsageError
from .command import Command, CommandFailed, LLM_KERNELS_HELP, require


def _hf_arguments(parser) -> None:
    parser.add_argument("folder", help="the folder save_pretrained wrote (config.json, weights)")
    parser.add_argument("-o", "--output", required=True, help="the .pte to write (Whisper, "
                        "BART, T5: one generation .pte and OUT.ptd, a tied head's table; with "
                        "--no-cache: OUT.encoder.pte and OUT.decoder.pte; CLIP: "
                        "OUT.text.pte and OUT.vision.pte)")
    parser.add_argument("--compare", action="store_true",
                        help="also lower with stock executorch; time both on the runtime")
    parser.add_argument("--tokens", type=int, default=8, help="tokens of a text input: the "
                        "length the .pte takes (a generation .pte: the prompt of the check)")
    parser.add_argument("--attention", choices=["auto", "sdpa", "eager"], default="auto",
                        help="transformers' attn_implementation for the export (auto: sdpa "
                        "where transformers has it for the class, else eager; the choice is "
                        "printed)")
    parser.add_argument("--reps", type=int, default=10, help="timed rounds with --compare")
    parser.add_argument("--prefer", choices=["speed", "size"], default="speed",
                        help="where speed and size trade (a tied nn.Linear head): speed keeps "
                        "stock's choice, size stores the table once (a run-time weight)")
    parser.add_argument("--no-check", action="store_true", help="do not run the .pte on the "
                        "runtime against eager (checked by default; exit 1 when it differs)")
    parser.add_argument("--no-cache", action="store_true", help="a causal LM: the logits of "
                        "--tokens tokens, no KV cache, instead of the generation .pte; Whisper, "
                        "BART, T5: the encoder and one decoder step")
    parser.add_argument("--max-cache", type=int, help="a causal LM: rows of the KV cache "
                        "(default: 1024, at most the model's positions); Whisper, BART, T5: of the "
                        "decoder's self-attention cache (default: its positions; T5's: 512)")
    parser.add_argument("--max-prefill", type=int, help="a causal LM: the most tokens one "
                        "forward call takes (default: 128, at most --max-cache; a longer prompt "
                        "goes in as chunks: executorch's runner reads it as get_max_seq_len)")
    parser.add_argument("--threads", type=int, help="the runtime's threads for the check and "
                        "the timing (default: its own, one per core)")
    parser.add_argument("--llm-kernels", action="store_true", help="a causal LM: " +
                        LLM_KERNELS_HELP + " (with --compare, xnnfold's default beside it)")
    parser.add_argument("--quantize", choices=["8da4w", "int8"], help="a causal LM: its "
                        "linears quantized (torchao): 8da4w, 8-bit dynamic activations and "
                        "4-bit weights in groups of 32 (optimum-executorch's --qlinear 8da4w); "
                        "int8, 8-bit dynamic activations and 8-bit weights per channel")
    parser.add_argument("--force", action="store_true", help="a causal LM: export even where "
                        "its estimated peak memory exceeds the memory available here (refused "
                        "before any work otherwise)")


def _check_hf(args) -> None:
    from ..export.hf.plan import plan     # reads config.json only: no torch, no transformers

    checks.hf_folder(args.folder, args.tokens)
    checks.at_least("--reps", args.reps)
    if args.threads is not None:
        checks.at_least("--threads", args.threads)
    checks.output_file(args.output)
    # the class and the cache sizes first: a class hf does not export is refused as such,
    # whether or not transformers is installed
    args.plan = plan(args.folder, args.tokens, not args.no_cache, args.max_cache,
                     args.max_prefill, args.llm_kernels)
    from ..export.hf import check_generation_options
    check_generation_options(args.plan, args.output, not args.no_cache, args.quantize)
    require("hf", "tabulate", "transformers", install="pip install 'xnnfold[zoo]'")
    if args.quantize:
        require("hf --quantize", "torchao", install="pip install torchao")
    unknown_to = _unknown_to_transformers(args.plan.architecture)
    if unknown_to is not None:
        raise UsageError(f"{args.folder}: transformers {unknown_to} has no class "
                         f"{args.plan.architecture}")
    if not args.force:                    # a folder that cannot fit: before torch loads
        from ..export.hf.fits import check_plan
        check_plan(args.plan, args.quantize, not args.no_cache, args.max_cache,
                   args.max_prefill)


def _unknown_to_transformers(architecture: str):
    """The installed transformers' version if it has no class ``architecture``, else None:
    asked of its lazy module's names (``import transformers`` alone: no torch, which the
    command's run imports first, 4-5 s)."""
    try:
        import transformers
    except Exception:  # noqa: BLE001 - the export says what is wrong with it, as before
        return None
    if architecture in getattr(transformers, "__all__", ()):
        return None
    try:               # a name outside __all__ (an alias) counts if transformers gives it
        getattr(transformers, architecture)
    except AttributeError:                    # at once: nothing imported for a name it lacks
        return transformers.__version__
    except Exception:  # noqa: BLE001 - it has the name; the export's import says the rest
        pass
    return None


def _cmd_hf(args) -> int:
    from ..export import hf
    from ..export.hf import rows as hf_rows
    from ..export.llm.release import map_large_blocks

    if args.threads is not None:
        from ..export.llm.runtime import set_threads
        set_threads(args.threads)
    map_large_blocks()     # this process exports: copies of weights freed go back at once
    exported = hf.export_folder(args.plan, args.output, compare=args.compare,
                                tokens=args.tokens, attention=args.attention, reps=args.reps,
                                prefer=args.prefer, check=not args.no_check,
                                cache=not args.no_cache, max_cache=args.max_cache,
                                max_prefill=args.max_prefill, llm_kernels=args.llm_kernels,
                                quantize=args.quantize, force=True)   # checked before
    print(hf_rows.table(exported.rows))
    for note in exported.notes:
        print(note)
    if exported.wrong:
        raise CommandFailed("; ".join(exported.wrong) + " (eager's outputs differ; the .pte is "
                            "written, do not ship it)")
    return 0


HF = Command("hf", "a transformers model saved with save_pretrained to .pte through xnnfold "
             "(the class config.json names; a causal LM generation-ready)", _hf_arguments,
             _cmd_hf, _check_hf)
