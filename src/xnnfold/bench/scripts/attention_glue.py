"""The attention glue, measured: Whisper at whisper-tiny's dims (sdpa and eager
exports) and the E=512 demo models, stock vs xnnfold (vs ideal): latency and portable share.

transformers' Whisper at whisper-tiny's published dims (random weights) exported with
``attn_implementation="sdpa"`` (the default) and ``"eager"``, each lowered with stock and with
xnnfold; and the E=512 demo models, stock / xnnfold / ideal. Latency: interleaved rounds, one
thread, medians; portable share: ETDump.

    xnnfold bench attention-glue encoder [--rounds 10]    # 3000 frames (30 s)
    xnnfold bench attention-glue decoder [--rounds 20]    # 8 tokens, 1500 states
    xnnfold bench attention-glue demo [--rounds 30]

The lowerings run with xnnfold's default settings (xnnfold.config: verification off), as users run them.
"""

from __future__ import annotations

import statistics
import sys
import time

from xnnfold.bench.scripts import parser


VOCAB, D_MODEL = 51865, 384


def build_parser():
    args = parser(__file__, __doc__)
    args.add_argument("part", choices=["encoder", "decoder", "demo"],
                      help="Whisper's encoder (3000 frames), a decoder step (8 tokens over 1500 "
                      "states), or the E=512 demo models")
    args.add_argument("--rounds", type=int, default=10, help="interleaved timed rounds")
    return args


def whisper(impl: str):
    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    torch.manual_seed(0)
    config = WhisperConfig(d_model=D_MODEL, encoder_layers=4, decoder_layers=4,
                           encoder_attention_heads=6, decoder_attention_heads=6,
                           encoder_ffn_dim=1536, decoder_ffn_dim=1536, vocab_size=VOCAB,
                           num_mel_bins=80, max_source_positions=1500,
                           max_target_positions=448, attn_implementation=impl)
    return WhisperForConditionalGeneration(config).eval()


def whisper_part_module(part: str, model):
    """Whisper's encoder, or its decoder and tied head (proj_out) on a few tokens over the
    encoder's states."""
    import torch

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = model.model.encoder

        def forward(self, features):
            return self.encoder(input_features=features).last_hidden_state

    class DecoderStep(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.decoder, self.head = model.model.decoder, model.proj_out

        def forward(self, tokens, states):
            return self.head(self.decoder(input_ids=tokens, encoder_hidden_states=states,
                                          use_cache=False).last_hidden_state)

    return Encoder() if part == "encoder" else DecoderStep()


def portable_share(pte: bytes, inputs: tuple) -> tuple:
    from xnnfold.pte.devtools import DELEGATE, operator_times

    ops = operator_times(pte, inputs, runs=3)
    total = sum(ops.values())
    portable = total - ops.get(DELEGATE, 0.0)
    return portable, 100 * portable / total, [(k, round(v, 2)) for k, v in ops.items()
                                              if k != DELEGATE][:5]


def report(variants: dict, inputs: tuple, reference: dict, rounds: int, base: str) -> None:
    from xnnfold.pte.compare import compare_outputs
    from xnnfold.pte import PteRunner
    from xnnfold.pte.timing import time_interleaved

    runners = {name: PteRunner(lowered.pte) for name, lowered in variants.items()}
    for name, lowered in variants.items():
        verdict = compare_outputs(runners[name].run(inputs), reference[name])
        notes = [a.describe() for a in lowered.fold.of("attention")] if lowered.fold else []
        print(f"{name:18s} delegate calls {lowered.delegate_calls:3d}, ops outside "
              f"{len(lowered.ops_outside):3d}, .pte {lowered.pte_bytes:,} B, {verdict}; "
              f"{len(notes)} rewrites" + (f", e.g. {notes[0]}" if notes else ""),
              flush=True)
    medians = {k: statistics.median(v)
               for k, v in time_interleaved(runners, inputs, rounds).items()}
    for name, lowered in variants.items():
        portable, share, top = portable_share(lowered.pte, inputs)
        print(f"{name:18s} {medians[name]:9.2f} ms  {medians[name] / medians[base]:5.2f}x "
              f"{base}; portable {portable:.1f} ms ({share:.1f}%) {top}", flush=True)


def whisper_part(part: str, rounds: int) -> None:
    import torch

    from xnnfold.pte import STOCK, XNNFOLD, lower

    torch.manual_seed(1)
    if part == "encoder":        # Whisper's encoder takes exactly 3000 frames (30 s)
        inputs = (torch.randn(1, 80, 3000),)
    else:
        inputs = (torch.randint(0, VOCAB, (1, 8)), torch.randn(1, 1500, D_MODEL))
    variants, reference = {}, {}
    for impl in ("sdpa", "eager"):
        model = whisper_part_module(part, whisper(impl))
        with torch.no_grad():
            expected = model(*inputs)
            ep = torch.export.export(model, inputs)
        for variant in (STOCK, XNNFOLD):
            start = time.perf_counter()
            variants[f"{impl}-{variant}"] = lower(ep, variant)
            reference[f"{impl}-{variant}"] = expected
            print(f"lowered {impl}-{variant} in {time.perf_counter() - start:.1f} s", flush=True)
    report(variants, inputs, reference, rounds, "eager-stock")


def demo(rounds: int) -> None:
    import torch

    from xnnfold.models.sources import build_named
    from xnnfold.pte import STOCK, XNNFOLD, lower

    for name in ("cross-attention-512", "decoder-layer-512", "self-attention-512"):
        case = build_named(name)
        ep = torch.export.export(case.model, case.inputs)
        variants = {f"{name} stock": lower(ep, STOCK), f"{name} xnnfold": lower(ep, XNNFOLD),
                    f"{name} ideal": lower(torch.export.export(case.ideal, case.inputs), STOCK)}
        with torch.no_grad():
            expected = case.model(*case.inputs)
        report(variants, case.inputs, dict.fromkeys(variants, expected), rounds,
               f"{name} ideal")


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    import torch
    torch.set_num_threads(1)
    if args.part == "demo":
        demo(args.rounds)
    else:
        whisper_part(args.part, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
