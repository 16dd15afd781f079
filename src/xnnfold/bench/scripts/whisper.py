"""Whisper generation: xnnfold's generation .pte (encoder once per window returning
the cross keys/values, a cached decoder, the tied table once in a .ptd) at whisper-tiny's (or
-base's) dims, random weights, beside optimum-executorch's .pte of the same folder when given:
a decoder step against the memory floor, the encoder, a whole transcription (30 s of features,
64 tokens), .pte bytes against the weights, the step's share on portable kernels.

    xnnfold bench whisper [--dims tiny|base] [--folder DIR] [--optimum MODEL.pte]
                          [--position 32] [--tokens 64] [--rounds 30] [--keep DIR]

Without --folder a folder is built (random weights, init_std 0.2, openai's generation-config
structure, preprocessor_config.json). optimum-executorch 1.1.0 pins transformers 5.0.0rc1: make
its .pte in a venv of its own, from the same folder (--keep DIR keeps the folder built here):
``optimum-cli export executorch --model DIR --task automatic-speech-recognition --recipe
xnnpack --output_dir OUT`` (OUT/model.pte). One thread; interleaved rounds, medians.
The lowerings run with xnnfold's default settings (xnnfold.config: verification off), as users run them.
"""

from __future__ import annotations

from xnnfold.bench.scripts import parser


def build_parser():
    args = parser(__file__, __doc__)
    args.add_argument("--dims", choices=["tiny", "base"], default="tiny",
                      help="the published model whose dims the random one takes")
    args.add_argument("--folder", help="a Whisper folder (save_pretrained) instead of one built")
    args.add_argument("--init-std", type=float, default=0.1, help="the built folder's "
                      "init_std (transformers' 0.02 repeats one token whatever the input; "
                      "at 0.2 fp32 rounding of the encoder's XNNPACK kernels, stock's as "
                      "xnnfold's, reaches 5e-3 in the logits at whisper-tiny's dims)")
    args.add_argument("--optimum", help="optimum-executorch's model.pte of the same folder")
    args.add_argument("--position", type=int, default=32, help="the decoder step timed")
    args.add_argument("--tokens", type=int, default=64,
                      help="tokens of the timed transcription (none stops at the end token)")
    args.add_argument("--rounds", type=int, default=30, help="interleaved rounds of the step")
    args.add_argument("--encoder-rounds", type=int, default=5,
                      help="interleaved rounds of the encoder and of the transcription")
    args.add_argument("--keep", help="write the folder (when built) and the .pte here")
    args.add_argument("--no-etdump", action="store_true", help="skip the portable share")
    return args


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)       # --help answers before torch is imported
    if not 1 <= args.position < 400 or args.tokens < 1 or args.rounds < 1:
        build_parser().error("--position 1..399, --tokens and --rounds at least 1")
    from xnnfold.pte.quiet import quiet
    stderr_filter = quiet()
    try:
        _run(args)
    finally:
        stderr_filter.close()


def _run(args) -> None:
    import os
    import tempfile
    import time
    from pathlib import Path

    import torch

    from xnnfold.bench import decode, speech as bench
    from xnnfold.export.seq2seq import Seq2SeqProgram, WhisperPrompt, export_seq2seq, \
        lower_seq2seq
    from xnnfold.export.transformers import import_transformers
    from xnnfold.models import speech

    decode.one_thread()
    print(f"machine: {decode.machine_line()}", flush=True)
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="xnnfold-whisper-"))
    work.mkdir(parents=True, exist_ok=True)
    folder = Path(args.folder) if args.folder else \
        speech.save_whisper_folder(work / f"whisper-{args.dims}-random", args.dims,
                                   init_std=args.init_std)
    model = import_transformers().WhisperForConditionalGeneration.from_pretrained(
        str(folder)).eval()
    config = model.config
    print(f"model: {folder} (d_model {config.d_model}, {config.encoder_layers}+"
          f"{config.decoder_layers} layers, vocab {config.vocab_size:,}); weights "
          f"{bench.weight_bytes(model):,} bytes", flush=True)
    start = time.perf_counter()
    lowered = lower_seq2seq(export_seq2seq(model))
    pte = work / "whisper.pte"
    pte.write_bytes(lowered.pte)
    if lowered.ptd is not None:
        pte.with_suffix(".ptd").write_bytes(lowered.ptd)
    print(f"xnnfold: exported and lowered in {time.perf_counter() - start:.1f} s; .pte "
          f"{len(lowered.pte):,} + .ptd {len(lowered.ptd or b''):,} bytes", flush=True)
    variants = [bench.Variant("xnnfold", pte, Seq2SeqProgram(pte))]
    if args.optimum:
        variants.append(bench.Variant("optimum", Path(args.optimum),
                                      Seq2SeqProgram(args.optimum, data=None)))
    weights = bench.weight_bytes(model)
    for v in variants:
        print(f"{v.name}: {v.files_bytes:,} bytes on disk ({v.files_bytes / weights:.3f}x the "
              f"weights)", flush=True)

    features = speech.features(config.num_mel_bins, 2 * config.max_source_positions, seed=0)
    generation = model.generation_config.to_dict()
    prompt = WhisperPrompt(generation, "en")
    with torch.no_grad():
        expected = model.generate(features, max_new_tokens=24, language="en")[0].tolist()
    for v in variants:
        got = v.program.generate(features, 24, prompt.prompt, prompt).tokens
        print(f"{v.name}: 24 greedy tokens {'==' if got == expected else '!='} transformers' "
              f"generate", flush=True)

    token = prompt.prompt[-1]
    bench.prepared(variants, features, args.position, prompt.prompt)
    read = bench.step_bytes(model, args.position)
    steps = bench.time_steps(variants, args.position, token, read, args.rounds)
    floor = steps[decode.FLOOR]
    print(f"\nload average {os.getloadavg()[0]:.1f}; decoder step at position {args.position} "
          f"(medians of {args.rounds} interleaved rounds); the step reads {read / 1e6:.1f} MB, "
          f"the floor copy moved them at {read / floor / 1e6:.1f} GB/s", flush=True)
    for name, ms in steps.items():
        print(f"  {name:10s} {ms:9.2f} ms  {ms / floor:6.2f}x the floor", flush=True)
    encoders = bench.time_encoders(variants, features, args.encoder_rounds)
    whole = bench.time_transcriptions(variants, features, args.tokens, prompt.prompt,
                                      args.encoder_rounds)
    print(f"load average {os.getloadavg()[0]:.1f}; encoder on {features.shape[-1]} frames and "
          f"a transcription ({args.tokens} tokens after the {len(prompt.prompt)}-token prompt), "
          f"medians of {args.encoder_rounds} interleaved rounds", flush=True)
    for v in variants:
        print(f"  {v.name:10s} encoder {encoders[v.name]:9.1f} ms   transcription "
              f"{whole[v.name] / 1e3:7.2f} s", flush=True)
    if args.optimum:
        print(f"  xnnfold / optimum: step {steps['xnnfold'] / steps['optimum']:.3f}, encoder "
              f"{encoders['xnnfold'] / encoders['optimum']:.3f}, transcription "
              f"{whole['xnnfold'] / whole['optimum']:.3f}", flush=True)
    if not args.no_etdump:
        print(f"xnnfold's step on portable kernels (ETDump): "
              f"{bench.portable_share(variants[0], args.position, token)}", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f}; files in {work}")


if __name__ == "__main__":
    main()
