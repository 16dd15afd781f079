"""T5 (and Flan-T5, mT5: T5's modelling code with another config) in the encoder /
text_decoder layout of :mod:`.export`: what differs from BART is found here, the rest is
shared.

- The decoder's cross-attention is ``block[i].layer[1].EncDecAttention`` with projections
  ``k`` / ``v``, ``n_heads`` heads of ``key_value_proj_dim``: :func:`cross_attentions` names
  them so that the encoder returns their keys and values as it returns BART's.
- Positions are relative: each attention adds a bias looked up from the bucket of
  ``key position - query position`` (no scaling of the query). The decoder step runs T5's own
  forward, whose first layer computes that bias for the query at the cache's length
  (``cache.get_seq_length``), which :class:`~.export.DecoderStep` sets to the step's
  ``cache_position`` before the call: the bias of the step at ``p`` is eager's row ``p``,
  against every cache row (the rows after ``p`` are masked).
- T5 has no limit of positions of its own: the .pte takes what T5's tokenizers cut a text at
  (``model_max_length`` 512), as source tokens and as decoder positions, unless the config
  names one.

The standard library only: ``xnnfold hf``'s plan reads :func:`relative_positions` from
config.json before torch loads.
"""

from __future__ import annotations

from typing import Optional

# what T5's published tokenizers cut a text at (model_max_length), and the lengths its
# pretraining used
RELATIVE_POSITIONS = 512


def relative_positions(config) -> bool:
    """Whether a config (a dict of config.json, or a transformers config) is of T5's relative
    position buckets."""
    get = config.get if isinstance(config, dict) else lambda name: getattr(config, name, None)
    return isinstance(get("relative_attention_num_buckets"), int)


def positions(config) -> Optional[int]:
    """:data:`RELATIVE_POSITIONS` for a config of relative positions, else None."""
    return RELATIVE_POSITIONS if relative_positions(config) else None


def cross_attentions(model) -> Optional[list]:
    """``(keys, values, heads, head_dim)`` of each decoder layer's cross-attention in T5's
    layout, or None when the decoder is not laid out as T5's."""
    found = []
    for block in getattr(model.get_decoder(), "block", None) or []:
        layers = getattr(block, "layer", None) or []
        attention = getattr(layers[1], "EncDecAttention", None) if len(layers) > 2 else None
        if attention is None or not all(hasattr(attention, n) for n in (
                "k", "v", "n_heads", "key_value_proj_dim")):
            return None
        found.append((attention.k, attention.v, attention.n_heads,
                      attention.key_value_proj_dim))
    return found or None
