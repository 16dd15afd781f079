"""A tied output head alone: stock vs stock's flag vs xnnfold, .pte bytes and latency.

    python bench/tied_head.py VOCAB EMBED TOKENS ROUNDS      # e.g. 50257 768 8 15

``nn.Embedding(VOCAB, EMBED)``, a linear, and an ``nn.Linear`` head sharing the embedding's
table (GPT-2, T5, BART write it so). Stock delegates the head with the table as a constant, so
its .pte stores the table twice; xnnfold's default (prefer="speed") keeps that; the flag and
xnnfold with prefer="size" take it at run time (repacked on every call). Latency: interleaved
rounds in one process, shuffled order, medians.
"""

import sys

import torch
from torch import nn

from xnnfold.bench.quiet import quiet


class TiedHead(nn.Module):
    def __init__(self, vocab, embed):
        super().__init__()
        self.embedding = nn.Embedding(vocab, embed)
        self.mix = nn.Linear(embed, embed)
        self.head = nn.Linear(embed, vocab, bias=False)
        self.head.weight = self.embedding.weight

    def forward(self, tokens):
        return self.head(torch.relu(self.mix(self.embedding(tokens))))


def main(vocab=50257, embed=768, tokens=8, rounds=15):
    # imported after quiet(): executorch prints on import
    from xnnfold.bench.measure import STOCK, XNNFOLD, XNNFOLD_SIZE, lower
    from xnnfold.bench.side_by_side import lower_and_time
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = TiedHead(vocab, embed).eval()
    inputs = (torch.randint(0, vocab, (1, tokens)),)
    with torch.no_grad():
        expected = model(*inputs)
    ep = torch.export.export(model, inputs)
    kwargs = {"stock": {}, "stock-flag": {"force_non_static_weights_for_f32_linear": True}}
    variants = {"stock": STOCK, "stock-flag": STOCK, "xnnfold": XNNFOLD,
                "xnnfold-size": XNNFOLD_SIZE}
    lower_and_time({label: (lambda label=label, variant=variant:
                            lower(ep, variant, kwargs.get(label, {})))
                    for label, variant in variants.items()},
                   inputs, expected, rounds, against=("stock", "stock-flag"))

if __name__ == "__main__":
    stderr_filter = quiet()
    try:
        main(*(int(a) for a in sys.argv[1:]))
    finally:
        stderr_filter.close()
