"""``python -m xnnfold.bench.multimodal_audio``: the ``audio_encoder`` method of a Voxtral .pte
(:mod:`xnnfold.export.multimodal.audio`) at Voxtral-Mini-3B's encoder dims (Whisper-large-v3's:
1280 wide, 20 heads, feed-forward 5120, 128 mel bins, one 30-second chunk of 3000 frames, 1500
positions, 375 embeddings) and its projector into the text model's 3072, with ``--layers`` of
the encoder's 32 layers, random weights: xnnfold's lowering and stock's of the same program,
their .pte bytes, delegate calls and ops outside, the share of the encoder's time on portable
kernels (an ETDump), its time in interleaved rounds on ``--threads`` runtime threads, and its
outputs against eager's."""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def _model(layers: int):
    import transformers

    audio = transformers.VoxtralEncoderConfig(
        hidden_size=1280, intermediate_size=5120, num_hidden_layers=layers,
        num_attention_heads=20, num_mel_bins=128, max_source_positions=1500)
    # the text model only sets the projector's width (3072): one small layer of it
    text = transformers.LlamaConfig(
        hidden_size=3072, intermediate_size=256, num_hidden_layers=1, num_attention_heads=24,
        num_key_value_heads=8, head_dim=128, vocab_size=256, max_position_embeddings=64)
    config = transformers.VoxtralConfig(audio_config=audio, text_config=text,
                                        audio_token_id=24)
    return transformers.VoxtralForConditionalGeneration(config).eval()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4, help="audio encoder layers (of 32)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="the runtime's threads (one: "
                        "the steadiest figures on a shared machine)")
    args = parser.parse_args(argv)
    from ..export.llm.runtime import set_threads
    from ..export.multimodal.audio import AUDIO_ENCODER, AudioEmbeddings, audio_size
    from ..pte import STOCK, XNNFOLD, PteRunner, compare_outputs, lower
    from ..pte.devtools import DELEGATE, operator_times
    from ..pte.timing import time_interleaved

    set_threads(args.threads)
    torch.manual_seed(0)
    model = _model(args.layers)
    encoder = AudioEmbeddings(model).eval()
    features = torch.randn(1, *audio_size(model))
    start = time.perf_counter()
    with torch.no_grad():
        expected = encoder(features)
        program = torch.export.export(encoder, (features,), strict=True)
    print(f"audio encoder: {args.layers} layer(s), features {tuple(features.shape)} -> "
          f"{tuple(expected.shape)}; eager and export {time.perf_counter() - start:.1f} s",
          flush=True)
    runners = {}
    for variant in (XNNFOLD, STOCK):
        low = lower(program, variant)
        runners[variant] = PteRunner(low.pte)
        # each embedding at its own scale: 1280- and 5120-long fp32 sums in XNNPACK's order
        verdict = compare_outputs(runners[variant].run((features,)), [expected], per_row=True)
        times = operator_times(low.pte, (features,), runs=args.rounds)
        total = sum(times.values())
        portable = sorted(((ms, op) for op, ms in times.items() if op != DELEGATE),
                          reverse=True)[:4]
        print(f"{variant}: lowering {low.lower_seconds:.1f} s; .pte {low.pte_bytes:,} bytes; "
              f"GEMMs outside {len(low.gemms_outside)}; {low.delegate_calls} delegate "
              f"call(s); outside: {sorted(set(low.ops_outside)) or 'nothing'}; {verdict}",
              flush=True)
        print(f"{variant}: {AUDIO_ENCODER} (ETDump, median of {args.rounds}): {total:.1f} ms, "
              f"on portable {(total - times.get(DELEGATE, 0.0)) / total:.2%} (largest: "
              f"{', '.join(f'{op} {ms:.1f} ms' for ms, op in portable) or 'none'})",
              flush=True)
    medians = {variant: statistics.median(times) for variant, times in time_interleaved(
        runners, (features,), args.rounds, warmup=1).items()}
    for variant, median in medians.items():
        print(f"{variant}: {median:.1f} ms, median of {args.rounds} interleaved rounds "
              f"({median / medians[STOCK]:.3f}x stock)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
