"""What the KV-cache step says of each attention (``explain`` lists it): rewritten, for which
kernels and why exact, what it leaves outside XNNPACK; or kept, and why."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch.fx

from . import llm_kernels
from .pattern import CacheAttention
from .plan import Path, Plan

PORTABLE_KERNELS = "XNNPACK + portable"
# What the default rewrite leaves outside XNNPACK, and why (explain lists it per attention).
UPDATE_LEFT = ("the cache update stays on portable (XNNPACK has no scatter): index_put copies "
               "the whole cache and the runtime writes it back with copy_, unless to_executorch "
               "runs with ExecutorchBackendConfig(run_reinplace_pass=True) (as xnnfold.export.llm's "
               ".pte does), which updates it in place; llm_kernels=True makes it "
               "llama::update_cache, in place")
# a cache the program takes as an input: executorch 1.5.1's reinplace_pass alone is not right
INPUT_UPDATE_LEFT = ("the cache, a program input, is written on portable: index_put into a copy "
                     "of it, written back with copy_ (xnnfold's transformers exporter writes "
                     "it in place, xnnfold.export.written_inputs; run_reinplace_pass=True alone "
                     "returns a wrong cache in executorch 1.5.1)")
MASK_LEFT = "the mask is made additive on portable, once per program, on its own [L, S]"
VISIBLE_LEFT = ("the cache's visible rows are copied by slice on portable (XNNPACK's slice takes "
                "static sizes only), and the mask over them is built there, once per program, "
                "on [L, P + L]")
OPERANDS_LEFT = ("the tensors added to the scores (mask, bias) are viewed grouped on portable, "
                 "once per program, on their own size")


@dataclass(frozen=True)
class KVCacheRewrite:
    """One attention over a KV cache: rewritten (``kernels`` it then needs, ``proven`` what
    makes it exact) or kept as it was (``kept_because``)."""

    node: str
    caches: tuple = ()
    kernels: Optional[str] = None
    proven: Optional[str] = None
    kept_because: Optional[str] = None
    left: tuple = ()          # what stays outside XNNPACK, and why
    llm_declined: Optional[str] = None   # why llm_kernels=True could not be used here

    @property
    def rewritten(self) -> bool:
        return self.kept_because is None

    def describe(self) -> str:
        caches = f" over {' / '.join(self.caches)}" if self.caches else ""
        if not self.rewritten:
            return f"kv_cache step: attention {self.node}{caches} kept as it was: " \
                   f"{self.kept_because}"
        text = (f"kv_cache step: attention {self.node}{caches} rewritten for {self.kernels} "
                f"({self.proven})")
        if self.llm_declined:
            text += f"; llm_kernels not used: {self.llm_declined}"
        for note in self.left:
            text += f"; {note}"
        return text


def attention_left(attention: CacheAttention) -> tuple:
    """What the grouped attention leaves on portable (the mask's or the bias's bookkeeping)."""
    if attention.mask is not None:
        return (MASK_LEFT,)
    if any(isinstance(op.other, torch.fx.Node) for op in attention.scores or ()):
        return (OPERANDS_LEFT,)
    return ()


def grouped_kernels(attention: CacheAttention) -> str:
    """The kernels the grouped rewrite runs on."""
    return PORTABLE_KERNELS + (f", {attention.groups} query heads per KV head, not repeated"
                               if attention.groups > 1 else "")


def rewritten(plan: Plan, how: str) -> KVCacheRewrite:
    """The record of ``plan`` carried out, the attention taken ``how``."""
    attention = plan.attention
    caches = (attention.key.target, attention.value.target)
    read = (VISIBLE_LEFT,) if plan.visible_rows else attention_left(attention)
    if plan.path is Path.LLM_SDPA:
        kernels, left = f"{llm_kernels.UPDATE}, {llm_kernels.SDPA}", ()
    elif plan.path is Path.LLM_UPDATE:
        kernels, left = f"{llm_kernels.UPDATE}, {grouped_kernels(attention)}", read
    else:
        update = INPUT_UPDATE_LEFT if attention.key.is_input else UPDATE_LEFT
        kernels, left = grouped_kernels(attention), (update,) + read
    if plan.llm_kernels:
        how = (f"rows P .. P + L - 1 written in place; {how}; the cache kept as "
               "[B * Hkv, S, 1, D], the same bytes")
    elif plan.path is Path.FLAT:
        how += "; the cache kept as [B * Hkv, S, D], the same bytes"
    return KVCacheRewrite(attention.sdpa.name, caches, kernels, how, left=left,
                          llm_declined=plan.llm_declined)
