"""What the KV-cache step decides for one attention (:func:`.decide.decide`) before it rewrites
anything: a :class:`Plan` the rewrite (:mod:`.rewrite`) carries out, or :class:`Declined`."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional

import torch.fx

from .pattern import CacheAttention, Declined

__all__ = ["ATTENDS", "CAUSAL", "Declined", "MaskKind", "Path", "Plan", "Proof"]


class Path(enum.Enum):
    """How an attention is rewritten."""

    SHARED = "the grouped attention; the caches, read elsewhere too, keep their shape"
    FLAT = "the grouped attention over the caches re-shaped [B * Hkv, S, D]"
    LLM_UPDATE = "llama::update_cache in place, then the grouped attention"
    LLM_SDPA = "llama::update_cache in place, then llama::custom_sdpa"


class MaskKind(enum.Enum):
    """What an attention's mask is proven to be, for every start and length (:mod:`.mask_proof`)."""

    CAUSAL = "causal"
    WINDOW = "causal within a sliding window"
    # a mask that is neither may still block no row entirely (the plain softmax is then SDPA's
    # safe one), e.g. an additive ALiBi bias with the dtype's lowest value, not -inf, where it
    # blocks
    ATTENDS = "without a fully blocked row"


@dataclass(frozen=True)
class Proof:
    """A mask proven ``kind`` (``window``: its ``W`` rows, for :attr:`MaskKind.WINDOW`)."""

    kind: MaskKind
    window: Optional[int] = None

    @property
    def text(self) -> str:
        if self.kind is MaskKind.CAUSAL:
            return "causal from the cache position"
        if self.kind is MaskKind.WINDOW:
            return f"causal within a sliding window of {self.window} cache rows"
        return "without a fully blocked row (no row all -inf or all False)"

    @property
    def blocks_past_position(self) -> bool:
        """Whether the mask blocks every cache row past the step's last position."""
        return self.kind in (MaskKind.CAUSAL, MaskKind.WINDOW)


CAUSAL = Proof(MaskKind.CAUSAL)
ATTENDS = Proof(MaskKind.ATTENDS)


@dataclass(frozen=True)
class Plan:
    """An attention the step rewrites: ``path``; ``proof`` (None: the mask, if any, is not
    proven); ``start``, the node holding the step's first position ``P`` (None: the positions
    written are not proven ``arange(L) + P``); ``visible_rows``: only the cache rows up to the
    position are read (:mod:`.visible`); ``llm_declined``: why the LLM kernels asked for are
    not used (or not for the attention), None where they are or were not asked for."""

    attention: CacheAttention
    path: Path
    proof: Optional[Proof]
    start: Optional[torch.fx.Node]
    visible_rows: bool
    llm_declined: Optional[str] = None

    @property
    def llm_kernels(self) -> bool:
        """Whether the cache update is executorch's ``llama::update_cache``."""
        return self.path in (Path.LLM_UPDATE, Path.LLM_SDPA)

    @property
    def relaid(self) -> bool:
        """Whether the rewrite re-shapes the caches' buffers (they are this attention's alone)."""
        return self.path is not Path.SHARED
