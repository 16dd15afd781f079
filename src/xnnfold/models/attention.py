"""nn.MultiheadAttention cases (self, cross, different key and value, kdim/vdim) and the
decoder layer, each with its ideal rewrite: plain q/k/v linears holding the folded values."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .case import Case


def _mha(embed: int, heads: int, **kwargs) -> nn.MultiheadAttention:
    mha = nn.MultiheadAttention(embed, heads, batch_first=True, **kwargs)
    nn.init.normal_(mha.in_proj_bias)
    return mha


class Attention(nn.Module):
    """``nn.MultiheadAttention`` called as ``mha(query, key, value)``; key/value default."""

    def __init__(self, mha: nn.MultiheadAttention, mode: str):
        super().__init__()
        self.mha, self.mode = mha, mode

    def forward(self, query, memory=None, value=None):
        if self.mode == "self":
            key = val = query
        elif self.mode == "cross":
            key = val = memory
        else:
            key, val = memory, value
        return self.mha(query, key, val, need_weights=False)[0]


class IdealAttention(nn.Module):
    """The same attention with plain q/k/v linears: MHA's own body, only the projections differ.

    The body (batch_first transposes, per-head views, SDPA, out projection) is the one
    ``F.multi_head_attention_forward`` runs, op for op, so that comparing with the ideal
    measures the projections and nothing else. (A leaner hand-written body, e.g. one
    ``view`` + ``transpose`` per head, saves a further ~1 KB of .pte at E=16 for any attention,
    packed or not; that is a property of MHA's body, not of its params.)
    """

    def __init__(self, mha: nn.MultiheadAttention, mode: str = "kv"):
        super().__init__()
        embed, kdim, vdim = mha.embed_dim, mha.kdim, mha.vdim
        self.heads, self.mode = mha.num_heads, mode
        self.q, self.k, self.v = nn.Linear(embed, embed), nn.Linear(kdim, embed), \
            nn.Linear(vdim, embed)
        self.out = nn.Linear(embed, embed)
        with torch.no_grad():
            if mha._qkv_same_embed_dim:
                weights = mha.in_proj_weight.chunk(3)
            else:
                weights = (mha.q_proj_weight, mha.k_proj_weight, mha.v_proj_weight)
            for layer, weight, bias in zip((self.q, self.k, self.v), weights,
                                           mha.in_proj_bias.chunk(3)):
                layer.weight.copy_(weight)
                layer.bias.copy_(bias)
            self.out.weight.copy_(mha.out_proj.weight)
            self.out.bias.copy_(mha.out_proj.bias)

    def _heads(self, x, batch):
        # (length, batch, E) -> (batch, heads, length, head_dim), as MHA reshapes
        length, embed = x.shape[0], x.shape[-1]
        head_dim = embed // self.heads
        x = x.view(length, batch * self.heads, head_dim).transpose(0, 1)
        return x.view(batch, self.heads, length, head_dim)

    def forward(self, query, memory=None, value=None):
        # batch_first: MHA works in (length, batch, E) and transposes each distinct input once
        if self.mode == "self":
            query = memory = value = query.transpose(1, 0)
        elif self.mode == "cross":
            query, memory = query.transpose(1, 0), memory.transpose(1, 0)
            value = memory
        else:
            query, memory, value = (t.transpose(1, 0) for t in (query, memory, value))
        length, batch, embed = query.shape
        out = F.scaled_dot_product_attention(self._heads(self.q(query), batch),
                                             self._heads(self.k(memory), batch),
                                             self._heads(self.v(value), batch))
        out = out.permute(2, 0, 1, 3).contiguous().view(batch * length, embed)
        return self.out(out).view(length, batch, embed).transpose(1, 0)


class IdealDecoderLayer(nn.Module):
    """``nn.TransformerDecoderLayer`` (relu, eval) with IdealAttention in both blocks."""

    def __init__(self, layer: nn.TransformerDecoderLayer):
        super().__init__()
        self.self_attn = IdealAttention(layer.self_attn, "self")
        self.cross_attn = IdealAttention(layer.multihead_attn, "cross")
        self.linear1, self.linear2 = layer.linear1, layer.linear2
        self.norm1, self.norm2, self.norm3 = layer.norm1, layer.norm2, layer.norm3
        self.norm_first = layer.norm_first

    def _ff(self, x):
        return self.linear2(F.relu(self.linear1(x)))

    def forward(self, tgt, memory):
        x = tgt
        if self.norm_first:
            x = x + self.self_attn(self.norm1(x))
            x = x + self.cross_attn(self.norm2(x), memory)
            return x + self._ff(self.norm3(x))
        x = self.norm1(x + self.self_attn(x))
        x = self.norm2(x + self.cross_attn(x, memory))
        return self.norm3(x + self._ff(x))


class DecoderLayer(nn.Module):
    def __init__(self, embed, heads, ff, norm_first=False):
        super().__init__()
        self.layer = nn.TransformerDecoderLayer(embed, heads, dim_feedforward=ff, dropout=0.0,
                                                batch_first=True, norm_first=norm_first)
        for attn in (self.layer.self_attn, self.layer.multihead_attn):
            nn.init.normal_(attn.in_proj_bias)

    def forward(self, tgt, memory):
        return self.layer(tgt, memory)


def attention_case(mode: str, embed=16, heads=2, tgt=5, src=7, kdim=None, vdim=None,
                   dynamic=False, seed=0) -> Case:
    torch.manual_seed(seed)
    mha = _mha(embed, heads, kdim=kdim, vdim=vdim)
    model = Attention(mha, mode).eval()
    ideal = IdealAttention(mha, mode).eval()
    query = torch.randn(1, tgt, embed)
    if mode == "self":
        inputs = (query,)
    elif mode == "cross":
        inputs = (query, torch.randn(1, src, embed))
    else:
        inputs = (query, torch.randn(1, src, kdim or embed), torch.randn(1, src, vdim or embed))
    dynamic_shapes = None
    if dynamic:
        t_len = torch.export.Dim("tgt", min=2, max=64)
        s_len = torch.export.Dim("src", min=2, max=64)
        dynamic_shapes = ({1: t_len}, {1: s_len})
    name = {"self": "self-attention", "cross": "cross-attention",
            "kv": "kdim/vdim" if kdim else "different k/v"}[mode]
    return Case(name, model, inputs, ideal, dynamic_shapes)


def decoder_case(embed=16, heads=2, ff=32, tgt=5, src=7, norm_first=False, seed=0) -> Case:
    torch.manual_seed(seed)
    model = DecoderLayer(embed, heads, ff, norm_first).eval()
    ideal = IdealDecoderLayer(model.layer).eval()
    name = "decoder layer" + (" (norm_first)" if norm_first else "")
    return Case(name, model, (torch.randn(1, tgt, embed), torch.randn(1, src, embed)), ideal)
