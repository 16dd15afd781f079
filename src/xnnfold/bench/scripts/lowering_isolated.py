"""Lowering seconds of the models whose lowering cost was measured, each lowering in a process of its own.

    xnnfold bench lowering-isolated [--reps 2] [CASE ...]

The quantized and DETR-style cases are the test suite's models: run it from a source checkout
(they are imported from its tests/ folder).

Per case: export once per process, then time ``xnnfold.pte.lowering.lower`` (to_edge_transform
_and_lower + to_executorch) as stock and as xnnfold, in fresh processes, interleaved (stock,
xnnfold, stock, ...); medians and the ratio. The lowerings run with xnnfold's default settings (xnnfold.config: verification off). A
variant that cannot lower the program prints "raises".
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

from xnnfold.bench.scripts import parser

HERE = os.path.dirname(os.path.abspath(__file__))


def _case(name):
    import torch
    sys.path.insert(0, os.path.join(HERE, *[".."] * 4, "tests"))   # the checkout's tests/
    torch.manual_seed(0)
    if name == "attention-pooling-dynamic-int8":
        from test_quantized import AttentionPooling, quantize
        inputs = (torch.randn(2, 6, 32),)
        return torch.export.export(quantize(AttentionPooling().eval(), inputs, True), inputs)
    if name == "detr-style-decoder":
        from test_passthrough import DetrStyleDecoder
        return torch.export.export(DetrStyleDecoder().eval(), (torch.randn(2, 10, 16),))
    if name == "wav2vec2-dynamic":
        import transformers
        config = transformers.Wav2Vec2Config(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
            num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2)
        model = transformers.Wav2Vec2Model(config).eval()
        return torch.export.export(model, (torch.randn(1, 1600),), dynamic_shapes=(
            {1: 10 * torch.export.Dim("frames", min=80, max=400)},))
    if name in ("gpt2", "llama", "whisper-decoder"):
        from xnnfold.bench.scripts.tied_models import build
        model, inputs = build(name)
        return torch.export.export(model, inputs)
    raise SystemExit(f"unknown case {name!r}")


CASES = ["attention-pooling-dynamic-int8", "detr-style-decoder", "wav2vec2-dynamic", "gpt2"]
MORE = ["llama", "whisper-decoder"]      # tied heads (bench tied-models), on request


def build_parser():
    args = parser(__file__, __doc__)
    args.add_argument("--reps", type=int, default=2,
                      help="lowerings per variant (each in a fresh process)")
    args.add_argument("cases", nargs="*", choices=CASES + MORE, metavar="CASE",
                      help=f"the cases (default: all of {', '.join(CASES)}; also "
                      f"{', '.join(MORE)})")
    return args


def _child(name: str, variant: str) -> None:
    import torch
    torch.set_num_threads(1)
    from xnnfold.pte import lower
    ep = _case(name)
    try:
        seconds = lower(ep, variant).lower_seconds
    except Exception:  # noqa: BLE001 - stock cannot lower some of them
        seconds = None
    print(json.dumps({"seconds": seconds}))


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    reps = args.reps
    for name in args.cases or CASES:
        times = {"stock": [], "xnnfold": []}
        for _ in range(reps):
            for variant in times:
                out = subprocess.run([sys.executable, __file__, "--child", name, variant],
                                     capture_output=True, text=True, env=os.environ)
                line = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
                times[variant].append(json.loads(line[-1])["seconds"] if line else None)
        med = {v: (statistics.median(t) if None not in t else None) for v, t in times.items()}
        show = {v: f"{m:.1f} s" if m is not None else "raises" for v, m in med.items()}
        ratio = f"{med['xnnfold'] / med['stock']:.2f}x" if None not in med.values() else "-"
        print(f"{name}: stock {show['stock']}, xnnfold {show['xnnfold']} ({ratio})", flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:        # this script's own lowering processes
        _child(sys.argv[2], sys.argv[3])
    else:
        sys.exit(main())
