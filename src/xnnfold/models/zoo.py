"""Real architectures from third-party packages, random weights, no downloads.

Installed with the optional extra ``zoo`` (``pip install -e '.[zoo]'``). Each builder imports
its package when called; a package that does not import on this torch raises
:class:`~xnnfold.export.transformers.TransformersUnavailable` with one line saying why, and the report skips the model.

At their published architectures (slow to lower: out of the test suite and ``make demo``):
- ``whisper-tiny-encoder``: transformers' Whisper at whisper-tiny's dims (d_model 384, 4+4
  layers, 6 heads, ffn 1536, vocabulary 51,865, 80 mel bins, 1500 positions), the encoder on
  3000 frames (30 s); ``whisper-tiny-decoder``: one decoder step, 8 tokens over 1500 encoder
  states, with the output head tied to the token table.
- ``deit-tiny``: transformers' ViT at DeiT-tiny's dims (hidden 192, 12 layers, 3 heads, ffn
  768, 224x224 image, patch 16): separate q/k/v linears, nothing to fold.
- ``wav2vec2-base``: transformers' Wav2Vec2 at the base dims (hidden 768, 12 layers, 12 heads,
  ffn 3072, 7 conv layers of 512), on 1 s of 16 kHz audio; its positional convolution is a
  grouped ``Conv1d`` (16 groups, kernel 128) under ``weight_norm``, a computed weight.
Every transformers model also has the report's variant ``eager-export``: the same weights
exported with ``attn_implementation="eager"`` (matmul, softmax, matmul) instead of the default
``"sdpa"``, lowered with stock: what a user can do by hand.

Toy configs (seconds to lower; the test suite's): ``vit-toy``, ``wav2vec2-toy``,
``whisper-toy``, and ``nn-transformer`` (``torch.nn.Transformer``: MHA's packed projections in
self- and cross-attention).
"""

from __future__ import annotations


import torch
from torch import nn

from ..export.hf.parts import WhisperDecoderStep
from ..export.transformers import import_transformers
from .case import Case


class _FirstOutput(nn.Module):
    """A Hugging Face model returning its first output tensor (export wants tensors out)."""

    def __init__(self, model: nn.Module, output: str):
        super().__init__()
        self.model, self.output = model, output

    def forward(self, *args):
        return getattr(self.model(*args, return_dict=True), self.output)


def _hf_case(name: str, make, inputs: tuple) -> Case:
    """A transformers model built by ``make(attn_implementation)`` with the default SDPA
    attention, and its eager-attention twin (same weights) as the ``eager-export`` variant."""
    torch.manual_seed(0)
    model = make("sdpa").eval()

    def eager_twin() -> nn.Module:
        twin = make("eager").eval()
        twin.load_state_dict(model.state_dict())
        return twin

    return Case(name, model, inputs, eager_export=eager_twin)


def _vit(name: str, image: int, **dims) -> Case:
    tf = import_transformers()
    torch.manual_seed(1)                  # the inputs; _hf_case seeds the weights

    def make(attention: str) -> nn.Module:
        config = tf.ViTConfig(image_size=image, attn_implementation=attention, **dims)
        return _FirstOutput(tf.ViTModel(config, add_pooling_layer=False), "last_hidden_state")

    return _hf_case(name, make, (torch.randn(1, 3, image, image),))


def vit_toy() -> Case:
    return _vit("vit-toy", 32, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                intermediate_size=128, patch_size=8)


def deit_tiny() -> Case:
    return _vit("deit-tiny", 224, hidden_size=192, num_hidden_layers=12, num_attention_heads=3,
                intermediate_size=768, patch_size=16)


def _wav2vec2(name: str, samples: int, **dims) -> Case:
    tf = import_transformers()
    torch.manual_seed(1)

    def make(attention: str) -> nn.Module:
        config = tf.Wav2Vec2Config(attn_implementation=attention, **dims)
        return _FirstOutput(tf.Wav2Vec2Model(config), "last_hidden_state")

    return _hf_case(name, make, (torch.randn(1, samples),))


def wav2vec2_toy() -> Case:
    return _wav2vec2("wav2vec2-toy", 1600, hidden_size=64, num_hidden_layers=2,
                     num_attention_heads=2, intermediate_size=128, conv_dim=(32, 32),
                     conv_kernel=(10, 3), conv_stride=(5, 2), num_conv_pos_embeddings=16,
                     num_conv_pos_embedding_groups=4)


def wav2vec2_base() -> Case:
    # Wav2Vec2Config's defaults are wav2vec2-base's architecture; 1 s of 16 kHz audio
    return _wav2vec2("wav2vec2-base", 16000)


class _Whisper(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, features, tokens):
        return self.model(input_features=features, decoder_input_ids=tokens,
                          use_cache=False, return_dict=True).logits


# whisper-tiny's published architecture (openai/whisper-tiny's config.json)
WHISPER_TINY = dict(vocab_size=51865, num_mel_bins=80, d_model=384, encoder_layers=4,
                    decoder_layers=4, encoder_attention_heads=6, decoder_attention_heads=6,
                    encoder_ffn_dim=1536, decoder_ffn_dim=1536, max_source_positions=1500,
                    max_target_positions=448)
_WHISPER_TOKENS = dict(pad_token_id=50257, bos_token_id=50257, eos_token_id=50257,
                       decoder_start_token_id=50258)


def _whisper(attention: str, **dims) -> nn.Module:
    tf = import_transformers()
    return tf.WhisperForConditionalGeneration(tf.WhisperConfig(
        attn_implementation=attention, **dims))


def whisper_toy() -> Case:
    dims = dict(vocab_size=512, num_mel_bins=16, d_model=64, encoder_layers=2,
                decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
                encoder_ffn_dim=128, decoder_ffn_dim=128, max_source_positions=50,
                max_target_positions=16, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                decoder_start_token_id=1)
    torch.manual_seed(1)
    inputs = (torch.randn(1, 16, 100), torch.randint(3, 512, (1, 8)))
    return _hf_case("whisper-toy", lambda attention: _Whisper(_whisper(attention, **dims)),
                    inputs)


def whisper_tiny_encoder() -> Case:
    torch.manual_seed(1)
    features = torch.randn(1, 80, 3000)                  # 30 s of log-mel frames
    return _hf_case("whisper-tiny-encoder", lambda attention: _FirstOutput(
        _whisper(attention, **WHISPER_TINY, **_WHISPER_TOKENS).model.encoder,
        "last_hidden_state"), (features,))


def whisper_tiny_decoder() -> Case:
    torch.manual_seed(1)
    inputs = (torch.randint(0, 50257, (1, 8)), torch.randn(1, 1500, 384))
    return _hf_case("whisper-tiny-decoder", lambda attention: WhisperDecoderStep(
        _whisper(attention, **WHISPER_TINY, **_WHISPER_TOKENS)), inputs)


class _Transformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.transformer = nn.Transformer(64, 4, num_encoder_layers=2, num_decoder_layers=2,
                                          dim_feedforward=128, dropout=0.0, batch_first=True)
        for name, param in self.transformer.named_parameters():
            if name.endswith("in_proj_bias"):   # zero by default, which hides bias bugs
                nn.init.normal_(param)

    def forward(self, src, tgt):
        return self.transformer(src, tgt)


def nn_transformer() -> Case:
    torch.manual_seed(0)
    return Case("nn-transformer", _Transformer().eval(),
                (torch.randn(1, 20, 64), torch.randn(1, 8, 64)))


ZOO: dict = {
    "whisper-tiny-encoder": whisper_tiny_encoder,
    "whisper-tiny-decoder": whisper_tiny_decoder,
    "deit-tiny": deit_tiny,
    "wav2vec2-base": wav2vec2_base,
    "vit-toy": vit_toy,
    "wav2vec2-toy": wav2vec2_toy,
    "whisper-toy": whisper_toy,
    "nn-transformer": nn_transformer,
}
PUBLISHED = ("whisper-tiny-encoder", "whisper-tiny-decoder", "deit-tiny", "wav2vec2-base")


def whisper_encoder(frames: int = 600, layers: int = 2, d_model: int = 384, heads: int = 6,
                    ffn: int = 1536, mel_bins: int = 80, attention: str = "sdpa"):
    """transformers' Whisper encoder alone, sized by the arguments (the quantized-attention
    bench's: d_model 384, 6 heads, ffn 1536; the tests build a small one), and its features;
    ``attention``: transformers' ``attn_implementation``."""
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    torch.manual_seed(0)
    config = WhisperConfig(d_model=d_model, encoder_layers=layers, encoder_attention_heads=heads,
                           encoder_ffn_dim=ffn, num_mel_bins=mel_bins, vocab_size=1000,
                           max_source_positions=frames // 2, pad_token_id=0, bos_token_id=1,
                           eos_token_id=2, decoder_start_token_id=1,
                           attn_implementation=attention)
    encoder = WhisperEncoder(config).eval()

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = encoder

        def forward(self, features):
            return self.encoder(input_features=features).last_hidden_state

    torch.manual_seed(1)
    return Encoder().eval(), (torch.randn(1, mel_bins, frames),)
