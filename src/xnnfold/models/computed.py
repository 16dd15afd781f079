"""Other computed weights: a weight_norm convolution, a LoRA-merged linear, a tied head used
transposed; each with its ideal rewrite where one exists."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .case import Case


class WeightNormConv(nn.Module):
    def __init__(self, channels=8, kernel=3):
        super().__init__()
        conv = nn.Conv1d(channels, channels, kernel, padding=kernel // 2)
        self.conv = torch.nn.utils.parametrizations.weight_norm(conv)

    def forward(self, x):
        return self.conv(x)


def _plain_conv(module: WeightNormConv) -> nn.Conv1d:
    source = module.conv
    conv = nn.Conv1d(source.in_channels, source.out_channels, source.kernel_size,
                     padding=source.padding)
    with torch.no_grad():
        conv.weight.copy_(source.weight)
        conv.bias.copy_(source.bias)
    return conv


class LoraLinear(nn.Module):
    """``F.linear(x, W + (B @ A) * scale, b)``: a LoRA adapter merged at every call."""

    def __init__(self, features=16, rank=4, scale=0.5):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(features, features))
        self.bias = nn.Parameter(torch.randn(features))
        self.lora_a = nn.Parameter(torch.randn(rank, features))
        self.lora_b = nn.Parameter(torch.randn(features, rank))
        self.scale = scale

    def forward(self, x):
        return F.linear(x, self.weight + (self.lora_b @ self.lora_a) * self.scale, self.bias)


def _plain_linear(weight: torch.Tensor, bias: torch.Tensor) -> nn.Linear:
    linear = nn.Linear(weight.shape[1], weight.shape[0])
    with torch.no_grad():
        linear.weight.copy_(weight)
        linear.bias.copy_(bias)
    return linear


def weight_norm_case(channels=8, length=20, seed=0) -> Case:
    torch.manual_seed(seed)
    model = WeightNormConv(channels).eval()
    return Case("weight_norm conv1d", model, (torch.randn(1, channels, length),),
                _plain_conv(model).eval())


def lora_case(features=16, rows=5, seed=0) -> Case:
    torch.manual_seed(seed)
    model = LoraLinear(features).eval()
    with torch.no_grad():
        merged = model.weight + (model.lora_b @ model.lora_a) * model.scale
    return Case("LoRA linear", model, (torch.randn(rows, features),),
                _plain_linear(merged, model.bias).eval())


class TiedHeadDecoder(nn.Module):
    """A speech-style text decoder whose output head is the token table, transposed:
    ``logits = x @ embedding.weight.t()``, the table also read by the token lookup."""

    def __init__(self, vocab=51865, embed=384, heads=6, layers=4):
        super().__init__()
        self.embedding = nn.Embedding(vocab, embed)
        layer = nn.TransformerDecoderLayer(embed, heads, dim_feedforward=4 * embed,
                                           dropout=0.0, batch_first=True)
        self.decoder = nn.TransformerDecoder(layer, layers)
        for name, param in self.decoder.named_parameters():
            if name.endswith("in_proj_bias"):
                nn.init.normal_(param)

    def forward(self, tokens, memory):
        x = self.decoder(self.embedding(tokens), memory)
        return x @ self.embedding.weight.t()


def tied_head_case(vocab=51865, embed=384, heads=6, layers=4, tokens=8, memory=375,
                   seed=0) -> Case:
    torch.manual_seed(seed)
    model = TiedHeadDecoder(vocab, embed, heads, layers).eval()
    return Case("tied-head decoder", model,
                (torch.randint(0, vocab, (1, tokens)), torch.randn(1, memory, embed)))
