"""Text inputs of `xnnfold hf` exports, fixed length against a dynamic one: what lowers, and what
it costs.

    xnnfold bench hf-text-length [--models bert,t5-encoder,clip-text,gpt2] [--tokens 8]
                                 [--rounds 30]

Each model (transformers classes from tiny configs, random weights, what ``xnnfold hf``
exports: the same wrappers) is exported twice, its token ids (and mask) of ``--tokens`` tokens
fixed, and with the length a ``torch.export.Dim`` from 2 to the model's positions; each program
lowered with stock and with xnnfold. Per lowering: ops left outside delegates (GEMMs among
them), delegate calls, .pte bytes, outputs against eager at ``--tokens`` tokens and, for the
dynamic one, at 3 tokens and at the longest; then the four .pte files timed at ``--tokens``
tokens in interleaved rounds, one thread, medians.
"""

import sys

from xnnfold.bench.scripts import parser

MODELS = ("bert", "t5-encoder", "clip-text", "gpt2")


def build_parser():
    args = parser(__file__, __doc__)
    args.add_argument("--models", default=",".join(MODELS),
                      help=f"comma-separated, of {', '.join(MODELS)}")
    args.add_argument("--tokens", type=int, default=8, help="tokens of the fixed input")
    args.add_argument("--rounds", type=int, default=30, help="interleaved timed rounds")
    return args


def _model(name: str):
    """(module with tensors in and one tensor out, positions, takes a mask)."""
    import torch

    from xnnfold.export.hf.parts import _Call
    from xnnfold.export.transformers import import_transformers

    tf = import_transformers()
    torch.manual_seed(0)
    text = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=2, vocab_size=300, max_position_embeddings=64)
    if name == "bert":
        model = tf.BertForSequenceClassification(tf.BertConfig(num_labels=3, **text))
        return _Call(model.eval(), ("input_ids", "attention_mask"), "logits"), 64, True
    if name == "t5-encoder":
        model = tf.T5EncoderModel(tf.T5Config(d_model=64, d_ff=128, num_layers=2, num_heads=2,
                                              d_kv=32, vocab_size=300))
        return _Call(model.eval(), ("input_ids", "attention_mask"), "last_hidden_state"), \
            64, True
    if name == "clip-text":
        model = tf.CLIPTextModelWithProjection(tf.CLIPTextConfig(
            projection_dim=32, bos_token_id=0, eos_token_id=2, pad_token_id=1, **text))
        return _Call(model.eval(), ("input_ids", "attention_mask"), "text_embeds"), 64, True
    if name == "gpt2":
        model = tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=300,
                                                 n_positions=64))
        return _Call(model.eval(), ("input_ids",), "logits"), 64, False
    raise SystemExit(f"unknown model {name!r}; known: {', '.join(MODELS)}")


def _inputs(tokens: int, mask: bool) -> tuple:
    import torch

    ids = torch.randint(0, 300, (1, tokens))
    if not mask:
        return (ids,)
    attention = torch.ones(1, tokens, dtype=torch.long)
    attention[0, -1] = 0                       # as xnnfold hf's example: the last one padded
    return ids, attention


def _export(module, inputs: tuple, positions=None):
    """The program of ``module`` on ``inputs``; ``positions``: the length dynamic, 2 to it."""
    import torch

    shapes = None
    if positions is not None:
        length = torch.export.Dim("tokens", min=2, max=positions)
        shapes = (tuple({1: length} for _ in inputs),)     # forward(*tensors)
    with torch.no_grad():
        return torch.export.export(module, inputs, dynamic_shapes=shapes)


def _row(label: str, lowered, checks: list) -> str:
    gemms = len(lowered.gemms_outside)
    return (f"{label:22s} ops outside {len(lowered.ops_outside):3d} (GEMMs {gemms}), delegate "
            f"calls {lowered.delegate_calls:3d}, .pte {lowered.pte_bytes:9,d} B, "
            + "; ".join(checks))


def measure(name: str, tokens: int, rounds: int) -> None:
    import statistics

    import torch

    from xnnfold.pte import STOCK, XNNFOLD, PteRunner, compare_outputs, lower
    from xnnfold.pte.timing import time_interleaved

    module, positions, mask = _model(name)
    torch.manual_seed(1)
    example = _inputs(tokens, mask)
    checks_at = {"fixed": [tokens], "dynamic": [tokens, 3, positions]}
    runners = {}
    for shape in ("fixed", "dynamic"):
        try:
            program = _export(module, example, positions if shape == "dynamic" else None)
        except Exception as error:  # noqa: BLE001 - a finding: say it and go on
            print(f"{name} {shape:7s}: torch.export failed: {type(error).__name__}: "
                  f"{str(error).splitlines()[0][:160]}", flush=True)
            continue
        for variant in (STOCK, XNNFOLD):
            label = f"{name} {shape} {variant}"
            try:
                lowered = lower(program, variant)
            except Exception as error:  # noqa: BLE001
                print(f"{label}: lowering failed: {type(error).__name__}: "
                      f"{str(error).splitlines()[0][:160]}", flush=True)
                continue
            runner = PteRunner(lowered.pte)
            checks = []
            for length in checks_at[shape]:
                inputs = _inputs(length, mask)
                with torch.no_grad():
                    expected = module(*inputs)
                try:
                    verdict = str(compare_outputs(runner.run(inputs), expected))
                except Exception as error:  # noqa: BLE001
                    verdict = f"does not run: {type(error).__name__}"
                checks.append(f"{length} tokens: {verdict}")
            print(_row(label, lowered, checks), flush=True)
            runners[f"{shape} {variant}"] = runner
    times = time_interleaved(runners, example, rounds)
    medians = {label: statistics.median(ms) for label, ms in times.items()}
    base = medians.get(f"fixed {XNNFOLD}")
    for label, median in medians.items():
        ratio = f" ({median / base:.3f}x fixed xnnfold)" if base else ""
        print(f"{name} {label:22s} {median:8.4f} ms median of {rounds} at {tokens} "
              f"tokens{ratio}", flush=True)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    names = [n for n in args.models.split(",") if n]
    from xnnfold.pte.quiet import quiet
    stderr_filter = quiet()          # before executorch's import: it prints on import
    try:
        import torch

        torch.set_num_threads(1)
        from executorch.extension.pybindings.portable_lib import _unsafe_reset_threadpool

        _unsafe_reset_threadpool(1)
        for name in names:
            measure(name, args.tokens, args.rounds)
    finally:
        stderr_filter.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
