"""The sizes of a generation .pte's cache and prefill: defaults and checks (plain integers, so
that a command line checks them from a config.json before torch loads)."""

from __future__ import annotations

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
