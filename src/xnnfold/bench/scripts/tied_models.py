"""Tied output heads in transformers models (tiny configs, random weights): the strategies.

    xnnfold bench tied-models MODEL [ROUNDS]      # MODEL: whisper-decoder, gpt2, llama

Variants, each lowered once in this process, then timed in interleaved rounds (shuffled order,
medians): stock (the head delegated with a constant copy of the table), xnnfold's default
(prefer="speed"), xnnfold with prefer="size" (a run-time weight, operands swapped where the
activation is smaller), the same without the swap, and stock's flag.
"""

import sys
from contextlib import contextmanager, nullcontext

from xnnfold.bench.scripts import parser

MODELS = ("whisper-decoder", "gpt2", "llama")


def build_parser():
    args = parser(__file__, __doc__)
    args.add_argument("model", choices=MODELS, help="the transformers model (tiny config)")
    args.add_argument("rounds", type=int, nargs="?", default=30, metavar="ROUNDS",
                      help="interleaved timed rounds (default: 30)")
    return args


def build(name):
    """(model, example inputs) of ``name``, one of :data:`MODELS` (seeded)."""
    import torch
    import transformers as tf
    from torch import nn

    class WhisperDecoderStep(nn.Module):
        """Whisper's decoder and its ``proj_out`` (tied to the token embedding), one step
        over ``tokens`` given the encoder's states."""

        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, tokens, states):
            hidden = self.model.model.decoder(input_ids=tokens, encoder_hidden_states=states,
                                              use_cache=False, return_dict=True
                                              ).last_hidden_state
            return self.model.proj_out(hidden)

    class Logits(nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, tokens):
            return self.model(input_ids=tokens, use_cache=False, return_dict=True).logits

    torch.manual_seed(0)
    tokens = torch.randint(3, 1000, (1, 8))
    if name == "whisper-decoder":   # whisper-tiny's dims: d_model 384, 4 layers, 51,865 tokens
        config = tf.WhisperConfig(vocab_size=51865, d_model=384, decoder_layers=4,
                                  encoder_layers=1, decoder_attention_heads=6,
                                  encoder_attention_heads=6, decoder_ffn_dim=1536,
                                  encoder_ffn_dim=1536, num_mel_bins=16,
                                  max_source_positions=150, attn_implementation="sdpa")
        model = WhisperDecoderStep(tf.WhisperForConditionalGeneration(config))
        return model.eval(), (tokens, torch.randn(1, 150, 384))
    if name == "gpt2":
        config = tf.GPT2Config(vocab_size=50257, n_embd=256, n_layer=2, n_head=4,
                               n_positions=64, attn_implementation="sdpa")
        return Logits(tf.GPT2LMHeadModel(config)).eval(), (tokens,)
    if name == "llama":
        config = tf.LlamaConfig(vocab_size=32000, hidden_size=256, intermediate_size=512,
                                num_hidden_layers=2, num_attention_heads=4,
                                num_key_value_heads=2, tie_word_embeddings=True,
                                max_position_embeddings=64, attn_implementation="sdpa")
        return Logits(tf.LlamaForCausalLM(config)).eval(), (tokens,)
    raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}")


@contextmanager
def no_swap():
    from unittest import mock

    from xnnfold.steps import runtime_weight
    with mock.patch.object(runtime_weight, "swap_if_smaller", lambda graph, gemm: False):
        yield


def run(name="whisper-decoder", rounds=30):
    import torch

    from xnnfold.pte import STOCK, STOCK_FLAG, XNNFOLD, XNNFOLD_SIZE, lower
    from xnnfold.pte.timing import lower_and_time
    torch.set_num_threads(1)
    model, inputs = build(name)
    with torch.no_grad():
        expected = model(*inputs)
    ep = torch.export.export(model, inputs)
    variants = {"stock": (STOCK, None), "xnnfold": (XNNFOLD, None),
                "xnnfold-size": (XNNFOLD_SIZE, None),
                "xnnfold-size-unswapped": (XNNFOLD_SIZE, no_swap), "stock-flag": (STOCK_FLAG, None)}

    def lowering(variant, context):
        with context() if context is not None else nullcontext():
            return lower(ep, variant)

    lower_and_time({label: (lambda v=variant, c=context: lowering(v, c))
                    for label, (variant, context) in variants.items()},
                   inputs, expected, rounds, prefix=f"{name} ")


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from xnnfold.pte.quiet import quiet
    stderr_filter = quiet()
    try:
        run(args.model, args.rounds)
    finally:
        stderr_filter.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
