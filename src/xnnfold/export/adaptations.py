"""What a few transformers families need to be exported with a static KV cache, and why.

transformers' static-cache adapter calls the model with ``input_ids``, the cache and no mask.
Most families then read the cache's length as a tensor (its ``cumulative_length``, which the
adapter sets to ``cache_position[0]``). A few read it as a Python int, which ``torch.export``
can only trace as a data-dependent value, or size something by it that a static cache does
not have (measured with transformers 5.25, torch 2.13):

- **OPT** cuts its positions out of ``cumsum(ones(past + T)) - 1`` at ``past``: the slice's
  start is data-dependent (a one-token export fails on ``q_length > 1``; a longer one exports
  but its lowering fails on the slice), with eager attention as with SDPA. Given
  ``position_ids`` it computes none of that: they are ``arange(T) + P``, what that cut is for
  one unpadded sequence.
- **Falcon with ``alibi=True``** builds its ALiBi bias over ``ones(past + T)`` and adds it to a
  mask over the cache's S rows: the export asserts ``past + T == S`` (runtime asserts that
  executorch's verifier rejects; eager would fail the same broadcast). Given an all-ones
  ``attention_mask`` of S rows (no padding), the bias covers the cache's rows, and the keys
  beyond the position are masked as before.
- **MPT** slices its ALiBi bias at ``max(0, 1 - (T + past))``, ``past`` the cache's length as
  an int: the export fails (``PendingUnbackedSymbolNotFound``). Given that length as an integer
  known to lie in ``0 .. S - T`` (``torch._check``), the slice is proven to start at 0. Its
  config also says ``use_cache=False``, which transformers' adapter refuses.

:func:`adaptations` lists what a model needs; :class:`Adapted` calls it so.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

POSITION_IDS, FULL_MASK, BOUNDED_LENGTH = "position_ids", "attention_mask", "cache length"


@dataclass(frozen=True)
class Adaptation:
    what: str           # one of POSITION_IDS, FULL_MASK, BOUNDED_LENGTH
    reason: str

    def describe(self, name: str) -> str:
        return f"{name}: exported with {self.what} given to the model ({self.reason})"


def adaptations(model: nn.Module) -> list:
    """What ``model`` (a transformers causal LM) needs to be exported with a static cache."""
    config = model.config.get_text_config()
    kind = getattr(config, "model_type", "")
    if kind == "opt":
        return [Adaptation(POSITION_IDS, "OPT cuts its positions at the cache's length read as "
                           "a Python int: a data-dependent slice torch.export cannot lower")]
    if kind == "falcon" and getattr(config, "alibi", False):
        return [Adaptation(FULL_MASK, "Falcon builds its ALiBi bias over the attention mask's "
                           "length, else over the cache's length read as an int, which a static "
                           "cache's S rows do not match")]
    if kind == "mpt":
        return [Adaptation(BOUNDED_LENGTH, "MPT slices its ALiBi bias at the cache's length "
                           "read as an int: given as an integer in 0 .. S - T, the slice is "
                           "proven to start at 0")]
    return []


def needs_cache_enabled(model: nn.Module) -> bool:
    """Whether the model's config says ``use_cache=False`` (MPT's default), which transformers'
    adapter refuses although the export passes the cache itself."""
    return getattr(model.config.get_text_config(), "use_cache", True) is False


class Adapted(nn.Module):
    """``model`` called by transformers' static-cache adapter, with what :func:`adaptations`
    says it needs (the cache's start read from the first layer's ``cumulative_length``, which
    the adapter has just set to ``cache_position[0]``)."""

    def __init__(self, model: nn.Module, needs: list, max_cache: int):
        super().__init__()
        self.model, self.max_cache = model, max_cache
        self.needs = frozenset(a.what for a in needs)

    def forward(self, **kwargs):
        cache = kwargs["cache"]
        start = cache.layers[0].cumulative_length
        length = kwargs["input_ids"].shape[1]
        if POSITION_IDS in self.needs:
            kwargs["position_ids"] = (torch.arange(length) + start).unsqueeze(0)
        if FULL_MASK in self.needs:
            kwargs["attention_mask"] = torch.ones(1, self.max_cache, dtype=torch.long)
        if BOUNDED_LENGTH not in self.needs:
            return self.model(**kwargs)
        past = start.item()
        torch._check(past >= 0)
        torch._check(past + length <= self.max_cache)
        cache.get_seq_length = lambda layer_idx=0: past     # this call's only
        try:
            return self.model(**kwargs)
        finally:
            cache.__dict__.pop("get_seq_length", None)
