"""The sizes of a generation .pte's cache and prefill: defaults and checks (plain integers, so
that a command line checks them from a config.json before torch loads), the same read from a
loaded model, and the constant methods executorch's runner reads beside them (its sizes, its
vocabulary, its special ids). Nothing here imports torch."""

from __future__ import annotations

import warnings
from typing import Optional

# The defaults of executorch's export_llama are 128 and 128; a cache of 1,024 rows is the
# shape `xnnfold bench llm-decode` measured. Both are capped by the model's own positions.
DEFAULT_MAX_CACHE = 1024
DEFAULT_MAX_PREFILL = 128


def cache_sizes(positions: Optional[int], max_cache: Optional[int] = None,
                max_prefill: Optional[int] = None, said: Optional[list] = None) -> tuple:
    """(cache rows, longest prefill) for a model of ``positions`` positions (None: no limit),
    the defaults where None. Each is capped by what holds it, asked or the default, for
    ``xnnfold hf`` and ``xnnfold.export.llm`` alike: the cache by the model's positions, the
    prefill by the cache; a line saying so is appended to ``said`` (but for the default
    prefill, which follows the cache). ``ValueError`` (one line) on sizes that cannot work."""
    said = [] if said is None else said
    if max_cache is not None and max_cache < 2:
        raise ValueError(f"max_cache {max_cache}: a cache needs at least 2 rows")
    if max_prefill is not None and max_prefill < 1:
        raise ValueError(f"max_prefill {max_prefill}: a prefill takes at least 1 token")
    rows = DEFAULT_MAX_CACHE if max_cache is None else max_cache
    if positions is not None and rows > positions:
        said.append(f"max_cache {rows}{' (the default)' if max_cache is None else ''} is "
                    f"beyond the model's {positions} positions: a cache of {positions} rows")
        rows = positions
    if rows < 2:
        raise ValueError(f"the model has {rows} position(s): a cache needs at least 2 rows")
    if max_prefill is None:
        return rows, min(DEFAULT_MAX_PREFILL, rows)
    if max_prefill > rows:
        said.append(f"max_prefill {max_prefill} is beyond the cache's {rows} rows: prefills "
                    f"of up to {rows} tokens")
    return rows, min(max_prefill, rows)


def text_config(model):
    """The config of ``model``'s text part (its own for a text-only model)."""
    return model.config.get_text_config()


def positions_of(model) -> Optional[int]:
    """The model's own limit on positions (``max_position_embeddings``), if it has one."""
    config = text_config(model)
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def sizes(model, max_cache: Optional[int] = None, max_prefill: Optional[int] = None,
          said: Optional[list] = None) -> tuple:
    """(cache rows, longest prefill) of ``model``: :func:`xnnfold.export.llm.sizes.cache_sizes`,
    each size it capped said in a warning (and appended to ``said``)."""
    capped: list = []
    chosen = cache_sizes(positions_of(model), max_cache, max_prefill, capped)
    for line in capped:
        warnings.warn(f"{type(model).__name__}: {line}", stacklevel=3)
    if said is not None:
        said.extend(capped)
    return chosen


def runner_metadata(model, max_cache: int, max_prefill: int) -> dict:
    """The constant methods executorch's LLM runner reads, under the names its LLM export uses."""
    config = text_config(model)
    # enable_dynamic_shape: the runner prefills a chunk in one call (else token by token)
    metadata = {"get_max_seq_len": max_prefill, "get_max_context_len": max_cache,
                "get_vocab_size": int(config.vocab_size), "use_kv_cache": True,
                "use_sdpa_with_kv_cache": False, "enable_dynamic_shape": max_prefill > 1}
    layers = getattr(config, "num_hidden_layers", None)
    if isinstance(layers, int):
        metadata["get_n_layers"] = layers
    generation = getattr(model, "generation_config", None)
    for source in (generation, config):
        bos = getattr(source, "bos_token_id", None)
        if isinstance(bos, int) and "get_bos_id" not in metadata:
            metadata["get_bos_id"] = bos
        eos = getattr(source, "eos_token_id", None)
        eos = [eos] if isinstance(eos, int) else eos
        if eos and all(isinstance(e, int) for e in eos) and "get_eos_ids" not in metadata:
            metadata["get_eos_ids"] = list(eos)
    return metadata
