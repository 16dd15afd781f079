"""Lowering time: xnnfold against the ideal rewrite and against stock, and the fast probe
against the whole-program probe.

    xnnfold bench lowering-time [--size small|large|all] [--reps 3]

Per model, in one process and interleaved (stock, xnnfold, ideal, stock, ...), after one
warm-up round: the seconds of ``to_edge_transform_and_lower`` + ``to_executorch``
(``xnnfold.pte.lowering.lower``), medians; then ``fold_gemm_params`` alone with the fast probe and
with the whole-program probe, interleaved too. Then two programs with nothing to fold (two
plain linears, a small CNN): xnnfold / stock. The lowerings run with xnnfold's default settings (xnnfold.config: verification off).
"""

from __future__ import annotations

import gc
import json
import statistics
import sys
import time

from xnnfold.models import catalog
from xnnfold.bench.scripts import parser



def nothing_to_fold() -> list:
    """(name, model, inputs) of two programs with nothing to fold: two plain linears, a small
    CNN."""
    import torch
    from torch import nn

    class TwoLinears(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(64, 128), nn.Linear(128, 64)

        def forward(self, x):
            return self.b(torch.relu(self.a(x)))

    class SmallCnn(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),
                                      nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
                                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))

        def forward(self, x):
            return self.body(x)

    return [("two plain linears", TwoLinears().eval(), (torch.randn(8, 64),)),
            ("small CNN", SmallCnn().eval(), (torch.randn(1, 3, 32, 32),))]


def _timed(fn) -> float:
    gc.collect()   # the previous variant's garbage is not this one's cost
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def interleaved(variants: dict, reps: int) -> dict:
    """name -> median seconds; one warm-up round, then ``reps`` rounds in turn."""
    for fn in variants.values():
        fn()
    times = {name: [] for name in variants}
    for _ in range(reps):
        for name, fn in variants.items():
            times[name].append(_timed(fn))
    return {name: statistics.median(t) for name, t in times.items()}


def bench_model(name: str, reps: int, compare_probes: bool = True) -> dict:
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
        XnnpackPartitioner as StockXnnpackPartitioner,
    )

    from xnnfold import pipeline
    from xnnfold.config import Config
    from xnnfold.models.sources import build_named
    from xnnfold.pte import STOCK, XNNFOLD, lower
    from xnnfold.partitioner import fold_gemm_params
    from xnnfold.steps.fold.probe.verified import whole_program_probe

    case = build_named(name)
    ep = torch.export.export(case.model, case.inputs, dynamic_shapes=case.dynamic_shapes)
    variants = {"stock": lambda: lower(ep, STOCK), "xnnfold": lambda: lower(ep, XNNFOLD)}
    if case.ideal is not None:    # the tied-head decoder and the zoo have none
        ideal = torch.export.export(case.ideal, case.inputs, dynamic_shapes=case.dynamic_shapes)
        variants["ideal"] = lambda: lower(ideal, STOCK)
    lowering = interleaved(variants, reps)
    if not compare_probes:
        return {"model": name, **lowering}
    stock_partitioner = StockXnnpackPartitioner()
    fold = interleaved({
        "fold, fast probe": lambda: fold_gemm_params(ep, stock_partitioner,
                                                     config=Config(verify_probe=False)),
        "fold, whole-program probe": lambda: pipeline.run(
            ep, whole_program_probe(stock_partitioner)),
    }, reps)
    return {"model": name, **lowering, **fold}


def bench_nothing_to_fold(reps: int) -> list:
    import torch

    from xnnfold.pte import STOCK, XNNFOLD, lower

    rows = []
    for name, model, inputs in nothing_to_fold():
        ep = torch.export.export(model, inputs)
        times = interleaved({"stock": lambda: lower(ep, STOCK),
                             "xnnfold": lambda: lower(ep, XNNFOLD)}, reps)
        rows.append({"model": name, **times})
    return rows


def build_parser():
    args = parser(__file__, __doc__)
    args.add_argument("--size", choices=["small", "large", "all"], default="all",
                      help="the built-in set of models")
    args.add_argument("--reps", type=int, default=3, help="timed rounds (after one warm-up)")
    args.add_argument("--models", default="",
                      help="comma-separated built-in model names, instead of --size's set")
    args.add_argument("--json", default="", help="also write the rows to this JSON file")
    args.add_argument("--no-probe-compare", default="",
                      help="comma-separated models to time without the fold-only comparison")
    args.add_argument("--skip-nothing-to-fold", action="store_true",
                      help="skip the two programs with nothing to fold")
    return args


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    names = [n for n in args.models.split(",") if n] or list(
        {"small": catalog.SMALL, "large": catalog.LARGE,
         "all": catalog.SMALL + catalog.LARGE}[args.size])
    unknown = [n for n in names if n not in catalog.KNOWN]
    if unknown:
        build_parser().error(f"unknown model {unknown[0]!r}; known: {', '.join(catalog.KNOWN)}")
    import torch
    torch.set_num_threads(1)
    rows = []
    print("| model | stock s | xnnfold s | ideal s | xnnfold / ideal | xnnfold / stock | "
          "fold, fast probe s | fold, whole-program probe s |")
    print("|---|---|---|---|---|---|---|---|")
    for name in names:
        row = bench_model(name, args.reps, name not in args.no_probe_compare.split(","))
        rows.append(row)
        fast, whole = row.get("fold, fast probe"), row.get("fold, whole-program probe")
        ideal = row.get("ideal")
        ideal_s, ratio = (f"{ideal:.2f}", f"{row['xnnfold'] / ideal:.2f}") if ideal else ("-", "-")
        print(f"| {name} | {row['stock']:.2f} | {row['xnnfold']:.2f} | {ideal_s} | {ratio} | "
              f"{row['xnnfold'] / row['stock']:.2f} | "
              f"{f'{fast:.2f}' if fast else '-'} | {f'{whole:.2f}' if whole else '-'} |",
              flush=True)
    print("\n| nothing to fold | stock s | xnnfold s | xnnfold / stock |\n|---|---|---|---|")
    for row in ([] if args.skip_nothing_to_fold else bench_nothing_to_fold(args.reps)):
        rows.append(row)
        print(f"| {row['model']} | {row['stock']:.3f} | {row['xnnfold']:.3f} | "
              f"{row['xnnfold'] / row['stock']:.3f} |", flush=True)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
