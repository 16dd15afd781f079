"""Peak RSS and lowering time of a 16-layer E=1024 nn.TransformerDecoderLayer stack (1 GiB
fp32), stock vs xnnfold (vs ideal), each variant in a process of its own.

The stack has distinct weights, ff=4096; the ideal rewrite is plain q/k/v linears, lowered with
stock.

    xnnfold bench decoder-stack-memory [--layers 16] [--embed 1024] [--ff 4096]

The parent spawns one child per variant (spawn, not fork: no inherited OpenMP pool or heap);
each child builds and exports the model, then lowers it (``to_edge_transform_and_lower`` and
``to_executorch``) and reports its own peak RSS (``ru_maxrss``) and the lowering's seconds.
The lowerings run with xnnfold's default settings (xnnfold.config: verification off).
"""

from __future__ import annotations

import json
import multiprocessing
import resource
import sys
import time

from xnnfold.bench.scripts import parser


def _child(variant: str, layers: int, embed: int, ff: int, queue) -> None:
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
        XnnpackPartitioner as StockXnnpackPartitioner,
    )
    from executorch.exir import to_edge_transform_and_lower
    from torch import nn

    import xnnfold
    import xnnfold.models

    torch.set_num_threads(1)
    torch.manual_seed(0)

    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(
                nn.TransformerDecoderLayer(embed, 16, dim_feedforward=ff, dropout=0.0,
                                           batch_first=True) for _ in range(layers))

        def forward(self, tgt, memory):
            for layer in self.layers:
                tgt = layer(tgt, memory)
            return tgt

    model = Stack().eval()
    if variant == "ideal":   # the same weights as plain q/k/v linears, lowered with stock
        ideal = nn.Module()
        ideal.layers = nn.ModuleList(xnnfold.models.IdealDecoderLayer(layer).eval()
                                     for layer in model.layers)
        ideal.forward = Stack.forward.__get__(ideal)
        model = ideal.eval()
    inputs = (torch.randn(1, 8, embed), torch.randn(1, 16, embed))
    ep = torch.export.export(model, inputs)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    partitioner = (xnnfold.XnnpackPartitioner() if variant == "xnnfold"
                   else StockXnnpackPartitioner())
    start = time.perf_counter()
    edge = to_edge_transform_and_lower(ep, partitioner=[partitioner])
    pte = edge.to_executorch().buffer
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    folded = len(partitioner.last_result.folded) if variant == "xnnfold" else 0
    queue.put({"variant": variant, "lower_seconds": seconds, "peak_rss_gib": peak / 2**20,
               "rss_before_lowering_gib": before / 2**20, "pte_bytes": len(pte),
               "params": sum(p.numel() for p in model.parameters()), "folded": folded})


def run(variant: str, layers: int, embed: int, ff: int) -> dict:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_child, args=(variant, layers, embed, ff, queue))
    process.start()
    result = queue.get()
    process.join()
    return result


def build_parser():
    args = parser(__file__, __doc__)
    args.add_argument("--layers", type=int, default=16, help="decoder layers in the stack")
    args.add_argument("--embed", type=int, default=1024, help="embedding width (16 heads)")
    args.add_argument("--ff", type=int, default=4096, help="feed-forward width")
    args.add_argument("--variants", default="stock,xnnfold",
                      help="comma-separated, each in a process of its own: stock, xnnfold, "
                      "ideal")
    return args


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    results = [run(v, args.layers, args.embed, args.ff) for v in args.variants.split(",")]
    for row in results:
        print(json.dumps(row), flush=True)
    by = {r["variant"]: r for r in results}
    if "stock" in by and "xnnfold" in by:
        print(f"peak RSS xnnfold / stock: "
              f"{by['xnnfold']['peak_rss_gib'] / by['stock']['peak_rss_gib']:.3f}; "
              f"lowering time xnnfold / stock: "
              f"{by['xnnfold']['lower_seconds'] / by['stock']['lower_seconds']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
