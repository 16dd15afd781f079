"""Real architectures from third-party packages, tiny configs, random weights, no downloads.

Installed with the optional extra ``zoo`` (``pip install -e '.[zoo]'``). Each builder imports
its package when called; a package that does not import on this torch raises
:class:`ZooUnavailable` with one line saying why, and the report skips the model.

What each one exercises:
- ``vit-tiny``: transformers' ViT, a vision transformer (self-attention with separate q/k/v
  linears: nothing to fold, xnnfold must change nothing).
- ``wav2vec2-tiny``: transformers' Wav2Vec2, a speech encoder whose positional convolution is
  a grouped ``Conv1d`` under ``weight_norm`` (a computed weight).
- ``whisper-tiny``: transformers' Whisper, a speech encoder-decoder with cross-attention and a
  tied output head.
- ``nn-transformer``: ``torch.nn.Transformer`` (encoder-decoder, MHA's packed projections in
  self- and cross-attention).
"""

from __future__ import annotations

import contextlib
import sys

import torch
from torch import nn

from .models import Case


class ZooUnavailable(RuntimeError):
    """The package a zoo model needs does not import here (one line: which and why)."""


@contextlib.contextmanager
def _without_broken_torchvision():
    """transformers imports torchvision whenever it is installed; a wheel that does not load on
    this torch (a CUDA build: ``operator torchvision::nms does not exist``) would take every
    transformers model down with it. None of the zoo needs it: while transformers and its model
    modules import, a broken torchvision reads as not installed; afterwards ``sys.modules`` is
    as it was (no process-wide change: another caller's ``import torchvision`` still fails
    with its own error)."""
    try:
        import torchvision  # noqa: F401
        broken = False
    except Exception:  # noqa: BLE001 - whatever breaks it, the zoo does without it
        broken = True
    if not broken:                            # it loads: nothing to hide
        yield
        return
    saved = {n: m for n, m in sys.modules.items()
             if n == "torchvision" or n.startswith("torchvision.")}
    for name in saved:
        del sys.modules[name]
    sys.modules["torchvision"] = None         # find_spec and import now say: not installed
    try:
        yield
    finally:
        for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
            del sys.modules[name]
        sys.modules.update(saved)


class _Guarded:
    """transformers, whose lazily imported names (``tf.ViTModel`` imports its modeling module)
    are looked up with a broken torchvision hidden."""

    def __init__(self, module):
        self._module = module

    def __getattr__(self, name):
        with _without_broken_torchvision():
            return getattr(self._module, name)


def _transformers():
    with _without_broken_torchvision():
        try:
            import transformers
        except Exception as error:  # noqa: BLE001 - any import failure means: skip, say why
            raise ZooUnavailable(f"transformers does not import ({type(error).__name__}: "
                                 f"{str(error).splitlines()[0][:120]}); pip install -e '.[zoo]'")
    return _Guarded(transformers)


class _FirstOutput(nn.Module):
    """A Hugging Face model returning its first output tensor (export wants tensors out)."""

    def __init__(self, model: nn.Module, output: str):
        super().__init__()
        self.model, self.output = model, output

    def forward(self, *args):
        return getattr(self.model(*args, return_dict=True), self.output)


def vit_tiny() -> Case:
    tf = _transformers()
    torch.manual_seed(0)
    config = tf.ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                          intermediate_size=128, image_size=32, patch_size=8,
                          attn_implementation="sdpa")
    model = _FirstOutput(tf.ViTModel(config, add_pooling_layer=False), "last_hidden_state")
    return Case("vit-tiny", model.eval(), (torch.randn(1, 3, 32, 32),))


def wav2vec2_tiny() -> Case:
    tf = _transformers()
    torch.manual_seed(0)
    config = tf.Wav2Vec2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                               intermediate_size=128, conv_dim=(32, 32), conv_kernel=(10, 3),
                               conv_stride=(5, 2), num_conv_pos_embeddings=16,
                               num_conv_pos_embedding_groups=4, attn_implementation="sdpa")
    model = _FirstOutput(tf.Wav2Vec2Model(config), "last_hidden_state")
    return Case("wav2vec2-tiny", model.eval(), (torch.randn(1, 1600),))


class _Whisper(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, features, tokens):
        return self.model(input_features=features, decoder_input_ids=tokens,
                          use_cache=False, return_dict=True).logits


def whisper_tiny() -> Case:
    tf = _transformers()
    torch.manual_seed(0)
    config = tf.WhisperConfig(vocab_size=512, num_mel_bins=16, d_model=64,
                              encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
                              decoder_attention_heads=2, encoder_ffn_dim=128,
                              decoder_ffn_dim=128, max_source_positions=50,
                              max_target_positions=16, pad_token_id=0, bos_token_id=1,
                              eos_token_id=2, decoder_start_token_id=1,
                              attn_implementation="sdpa")
    model = _Whisper(tf.WhisperForConditionalGeneration(config))
    tokens = torch.randint(3, 512, (1, 8))
    return Case("whisper-tiny", model.eval(), (torch.randn(1, 16, 100), tokens))


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
    "vit-tiny": vit_tiny,
    "wav2vec2-tiny": wav2vec2_tiny,
    "whisper-tiny": whisper_tiny,
    "nn-transformer": nn_transformer,
}
