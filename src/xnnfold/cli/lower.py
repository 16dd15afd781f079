"""``xnnfold lower`` and ``xnnfold explain``: a program (a .pt2, a factory, a built-in model) to a
.pte through xnnfold, and what the fold did with each GEMM."""

from __future__ import annotations

from pathlib import Path

from . import checks
from ..usage import UsageError
from .command import LLM_KERNELS_HELP, QUANTIZE, Command, CommandFailed, model_case, program_of


def _explain_arguments(parser) -> None:
    parser.add_argument("program", help="a .pt2, package.module:function returning "
                        "(module, example_inputs), or a built-in model name")
    parser.add_argument("--quantize", choices=QUANTIZE,
                        help="PT2E-quantize the model first (XNNPACK quantizer, per channel)")
    parser.add_argument("--all", action="store_true",
                        help="also list every op left outside delegates, with XNNPACK's reason")
    parser.add_argument("--llm-kernels", action="store_true", help=LLM_KERNELS_HELP)


def _check_explain(args) -> None:
    checks.program(args.program)


def _cmd_explain(args) -> int:
    import xnnfold
    from ..explain import Explanation

    program = program_of(args.program, args.quantize)
    if not args.all:
        # xnnfold's partitioner: the steps its lowering runs (its configs opened for them)
        result = xnnfold.fold_gemm_params(
            program, xnnfold.XnnpackPartitioner(llm_kernels=args.llm_kernels))
        print(xnnfold.format_explanation(Explanation.of(result)))
        return 0
    from ..explain import columns
    from ..pte.devtools import why_not_delegated

    # One lowering answers both: the GEMM table from its fold, the rest from XNNPACK's log.
    partitioner = xnnfold.XnnpackPartitioner(llm_kernels=args.llm_kernels)
    rows = why_not_delegated(program, partitioner)
    result = partitioner.last_result
    print(xnnfold.format_explanation(Explanation.of(result)))
    print(f"\nops left outside delegates after xnnfold: {len(rows)} (reason as XNNPACK's "
          "partitioner logged it)")
    if rows:
        print(columns(["node", "op", "XNNPACK's reason"], [[r.node, r.op, r.reason] for r in rows]))
    return 0


def _lower_arguments(parser) -> None:
    parser.add_argument("program", help="a program saved with torch.export.save, "
                        "package.module:function returning (module, example_inputs), or a "
                        "built-in model name")
    parser.add_argument("-o", "--output", required=True, help="the .pte to write")
    parser.add_argument("--stock", action="store_true",
                        help="lower with executorch's stock partitioner instead")
    parser.add_argument("--explain", action="store_true", help="print the per-GEMM table")
    parser.add_argument("--quantize", choices=QUANTIZE,
                        help="PT2E-quantize the model first (XNNPACK quantizer, per channel), "
                        "calibrated on its example inputs")
    parser.add_argument("--prefer", choices=["speed", "size"], default="speed",
                        help="where speed and size trade (a tied head): speed keeps stock's "
                        "choice, size stores the table once and repacks it on every call")
    parser.add_argument("--check", action="store_true",
                        help="run the written .pte on the ExecuTorch runtime (in a process of "
                        "its own) on the example inputs and compare it with the model in "
                        "eager (a quantized model: with an absolute tolerance of 10%% of its "
                        "largest output); exit code 1 if it does not run or differs")
    parser.add_argument("--llm-kernels", action="store_true", help=LLM_KERNELS_HELP)


def _check_lower(args) -> None:
    checks.program(args.program)
    checks.output_file(args.output)
    if args.stock and args.llm_kernels:
        raise UsageError("--llm-kernels is xnnfold's: not with --stock")


def _cmd_lower(args) -> int:
    import xnnfold
    from ..explain import Explanation
    from ..pte import STOCK, XNNFOLD, lower
    from ..pte.files import write_atomically
    from ..steps import projections
    from ..models.sources import export

    case = model_case(args.program, args.quantize) if args.check else None
    program = export(case) if case is not None else program_of(args.program, args.quantize)
    try:
        lowered = lower(program, STOCK if args.stock else XNNFOLD,
                        None if args.stock else {"prefer": args.prefer,
                                                 "llm_kernels": args.llm_kernels})
    except Exception as error:  # noqa: BLE001 - a program stock cannot lower either
        from ..usage import first_line
        raise UsageError(f"{args.program}: lowering failed ({first_line(error, 200)})")
    output = Path(args.output)
    try:
        write_atomically(output, lowered.pte)     # whole, or the name left as it was
    except OSError as error:
        raise UsageError(f"{args.output}: cannot be written ({error.strerror})")
    fold = lowered.fold
    if fold is not None:
        split = projections.split_in(fold)
        print(f"folded {len(fold.constants)} constant(s) for {len(fold.folded)} GEMM "
              f"operand(s); packed projections split: {len(split)}; freed params: "
              f"{', '.join(fold.freed_params) or 'none'}")
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
    (:func:`xnnfold.pte.isolated.check_pte`); :class:`CommandFailed` when it does not run or
    differs."""
    import torch

    from ..pte.isolated import check_pte

    with torch.no_grad():
        expected = case.model(*case.inputs)
    verdict = check_pte(path, case.inputs, expected, quantized)
    if not verdict.ok:
        raise CommandFailed(f"{path}: check failed: {verdict.reason}")
    return f"runs on the ExecuTorch runtime and matches eager ({verdict})"


LOWER = Command("lower", "lower a .pt2, a model factory or a built-in model to a .pte",
                _lower_arguments, _cmd_lower, _check_lower)
EXPLAIN = Command("explain", "per-GEMM: plain, folded or declined and why", _explain_arguments,
                  _cmd_explain, _check_explain)
