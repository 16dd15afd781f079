"""A tied output head alone: stock vs stock's flag vs xnnfold, .pte bytes and latency.

    xnnfold bench tied-head [VOCAB EMBED TOKENS ROUNDS]      # e.g. 50257 768 8 15

``nn.Embedding(VOCAB, EMBED)``, a linear, and an ``nn.Linear`` head sharing the embedding's
table (GPT-2, T5, BART write it so). Stock delegates the head with the table as a constant, so
its .pte stores the table twice; xnnfold's default (prefer="speed") keeps that; the flag and
xnnfold with prefer="size" take it at run time (repacked on every call). Latency: interleaved
rounds in one process, shuffled order, medians.
"""

import sys

from xnnfold.bench.scripts import parser


def build_parser():
    args = parser(__file__, __doc__)
    args.add_argument("vocab", type=int, nargs="?", default=50257, metavar="VOCAB",
                      help="rows of the embedding table (default: 50257, GPT-2's)")
    args.add_argument("embed", type=int, nargs="?", default=768, metavar="EMBED",
                      help="embedding width (default: 768)")
    args.add_argument("tokens", type=int, nargs="?", default=8, metavar="TOKENS",
                      help="tokens of the input (default: 8)")
    args.add_argument("rounds", type=int, nargs="?", default=15, metavar="ROUNDS",
                      help="interleaved timed rounds (default: 15)")
    return args


def tied_head(vocab: int, embed: int):
    import torch
    from torch import nn

    class TiedHead(nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(vocab, embed)
            self.mix = nn.Linear(embed, embed)
            self.head = nn.Linear(embed, vocab, bias=False)
            self.head.weight = self.embedding.weight

        def forward(self, tokens):
            return self.head(torch.relu(self.mix(self.embedding(tokens))))

    return TiedHead().eval()


def run(vocab=50257, embed=768, tokens=8, rounds=15):
    import torch

    from xnnfold.pte import STOCK, XNNFOLD, XNNFOLD_SIZE, lower
    from xnnfold.pte.timing import lower_and_time
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = tied_head(vocab, embed)
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


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from xnnfold.pte.quiet import quiet
    stderr_filter = quiet()          # before executorch's import: it prints on import
    try:
        run(args.vocab, args.embed, args.tokens, args.rounds)
    finally:
        stderr_filter.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
