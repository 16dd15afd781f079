"""T5 generation: xnnfold's generation .pte of T5 (encoder once per input returning the cross
keys/values, a cached decoder with T5's relative position bias, a tied table once in a .ptd)
at t5-small's dims, random weights: tokens vs `generate`, a decoder step against the memory
floor, the encoder, the step's GEMMs outside XNNPACK and its share on portable kernels.

    xnnfold bench t5 [--flan] [--init-factor 1] [--source 128] [--position 32]
                     [--rounds 30] [--keep DIR]

T5 (ReLU, tied head) or, with --flan, Flan-T5's layout (gated GELU, untied head) at
d_model 512, 6 + 6 layers, 8 heads, d_ff 2048, vocab 32,128 (xnnfold.models.t5). One thread;
interleaved rounds, medians. The lowering runs with xnnfold's default settings.
"""

from __future__ import annotations

from xnnfold.bench.scripts import parser


def build_parser():
    args = parser(__file__, __doc__)
    args.add_argument("--flan", action="store_true", help="Flan-T5's layout: gated GELU, an "
                      "untied head, no scaling of its input")
    args.add_argument("--init-factor", type=float, default=1.0, help="T5's initializer_factor "
                      "(transformers' 1.0: a random T5 repeats one token; at 3.0 its attention "
                      "scores reach 400 at these dims and eager fp32 differs from fp64 by 2 in "
                      "the encoder's output)")
    args.add_argument("--source", type=int, default=128, help="source tokens (seeded ids)")
    args.add_argument("--position", type=int, default=32, help="the decoder step timed")
    args.add_argument("--rounds", type=int, default=30, help="interleaved rounds of the step")
    args.add_argument("--keep", help="write the folder and the .pte here")
    return args


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)       # --help answers before torch is imported
    if not 1 <= args.source <= 512 or not 1 <= args.position < 500 or args.rounds < 1:
        build_parser().error("--source 1..512, --position 1..499, --rounds at least 1")
    from xnnfold.pte.quiet import quiet
    stderr_filter = quiet()
    try:
        _run(args)
    finally:
        stderr_filter.close()


def step_bytes(model, source: int, position: int) -> int:
    """Bytes one decoder step at ``position`` must read: the decoder's weights but the cross
    key/value projections (the encoder ran them) and the token table (one row), the output
    head's table once, every layer's cross keys and values of ``source`` tokens, and the
    self-attention cache rows up to the position."""
    config, decoder = model.config, model.get_decoder()
    inner = config.num_heads * config.d_kv
    skipped = ("EncDecAttention.k.", "EncDecAttention.v.", "embed_tokens")
    weights = sum(p.numel() for n, p in decoder.named_parameters()
                  if not any(s in n for s in skipped))
    layers = config.num_decoder_layers
    cross = 2 * layers * source * inner
    cached = 2 * layers * (position + 1) * inner
    return 4 * (weights + model.lm_head.weight.numel() + config.d_model + cross + cached)


def _run(args) -> None:
    import os
    import tempfile
    import time
    from pathlib import Path

    import torch

    from xnnfold.analysis.gemms import EDGE_GEMM_NAMES
    from xnnfold.bench import decode, speech as bench
    from xnnfold.export.seq2seq import Seq2SeqProgram, export_seq2seq, lower_seq2seq
    from xnnfold.export.transformers import import_transformers
    from xnnfold.models.t5 import save_t5_folder, t5
    from xnnfold.pte import inspect_lowered
    from xnnfold.pte.compare import compare_outputs

    decode.one_thread()
    print(f"machine: {decode.machine_line()}", flush=True)
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="xnnfold-t5-"))
    work.mkdir(parents=True, exist_ok=True)
    name = "flan-t5" if args.flan else "t5"
    folder = save_t5_folder(work / f"{name}-small-random", t5(
        "small", flan=args.flan, init_factor=args.init_factor, bias_std=1.0, table_std=1.0))
    model = import_transformers().T5ForConditionalGeneration.from_pretrained(
        str(folder)).eval()
    config = model.config
    print(f"model: {folder} ({config.feed_forward_proj}, head "
          f"{'tied, scaled' if config.scale_decoder_outputs else 'untied'}, d_model "
          f"{config.d_model}, {config.num_layers}+{config.num_decoder_layers} layers, vocab "
          f"{config.vocab_size:,}); weights {bench.weight_bytes(model):,} bytes", flush=True)
    start = time.perf_counter()
    lowered = lower_seq2seq(export_seq2seq(model), before_emit=lambda edge: {
        method: inspect_lowered(edge.exported_program(method))[:2]
        for method in ("encoder", "text_decoder")})
    pte = work / f"{name}.pte"
    pte.write_bytes(lowered.pte)
    if lowered.ptd is not None:
        pte.with_suffix(".ptd").write_bytes(lowered.ptd)
    print(f"xnnfold: exported and lowered in {time.perf_counter() - start:.1f} s; .pte "
          f"{len(lowered.pte):,} + .ptd {len(lowered.ptd or b''):,} bytes", flush=True)
    for method, (ops, calls) in lowered.inspected.items():
        gemms = [op for op in ops if op in EDGE_GEMM_NAMES]
        print(f"  {method}: {calls} delegate calls, {len(ops)} ops outside delegates, "
              f"GEMMs outside: {len(gemms)}{' ' + ', '.join(gemms) if gemms else ''}",
              flush=True)
    variant = bench.Variant("xnnfold", pte, Seq2SeqProgram(pte))

    source = torch.randint(2, config.vocab_size, (1, args.source),
                           generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model.generate(source, do_sample=False, num_beams=1, max_new_tokens=24,
                                  min_length=0, eos_token_id=None)[0].tolist()
        logits = model(input_ids=source, decoder_input_ids=torch.tensor([expected[:-1]]),
                       use_cache=False).logits[0]
    got = variant.program.generate(source, 24, stop_at_eos=False).tokens
    encoded = variant.program.encode(source)
    steps = torch.stack([variant.program.step(token, encoded, position)
                         for position, token in enumerate(expected[:-1])])
    print(f"24 greedy tokens {'==' if got == expected[1:] else '!='} transformers' generate "
          f"({len(set(expected[1:]))} distinct); the steps' logits against eager's: "
          f"{compare_outputs(steps, logits, per_row=True)}", flush=True)

    start_token = config.decoder_start_token_id
    bench.prepared([variant], source, args.position, [start_token])
    read = step_bytes(model, args.source, args.position)
    steps = bench.time_steps([variant], args.position, start_token, read, args.rounds)
    floor = steps[decode.FLOOR]
    print(f"\nload average {os.getloadavg()[0]:.1f}; decoder step at position {args.position} "
          f"over {args.source} source tokens (medians of {args.rounds} interleaved rounds); "
          f"the step reads {read / 1e6:.1f} MB, the floor copy moved them at "
          f"{read / floor / 1e6:.1f} GB/s", flush=True)
    for label, ms in steps.items():
        print(f"  {label:10s} {ms:9.2f} ms  {ms / floor:6.2f}x the floor", flush=True)
    encoders = bench.time_encoders([variant], source, 5)
    print(f"  encoder on {args.source} tokens: {encoders['xnnfold']:.2f} ms", flush=True)
    print(f"step on portable kernels (ETDump): "
          f"{bench.portable_share(variant, args.position, start_token)}", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f}; files in {work}")


if __name__ == "__main__":
    main()
