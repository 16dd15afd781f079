"""The sizes of a generation .pte's cache and prefill: defaults and checks (plain integers, so
that a command line checks them from a config.json before torch loads)."""

from __future__ import annotations

from typing import Optional

# The defaults of executorch's export_llama are 128 and 128; a cache of 1,024 rows is the
# shape issue 29 measured. Both are capped by the model's own positions.
DEFAULT_MAX_CACHE = 1024
DEFAULT_MAX_PREFILL = 128


def cache_sizes(positions: Optional[int], max_cache: Optional[int] = None,
                max_prefill: Optional[int] = None) -> tuple:
    """(cache rows, longest prefill) for a model of ``positions`` positions (None: no limit),
    defaults applied; ``ValueError`` (one line) on sizes that cannot work."""
    if max_cache is None:
        max_cache = min(DEFAULT_MAX_CACHE, positions or DEFAULT_MAX_CACHE)
    if max_cache < 2:
        raise ValueError(f"max_cache {max_cache}: a cache needs at least 2 rows")
    if positions is not None and max_cache > positions:
        raise ValueError(f"max_cache {max_cache} is beyond the model's {positions} positions")
    if max_prefill is None:
        max_prefill = min(DEFAULT_MAX_PREFILL, max_cache)
    if not 1 <= max_prefill <= max_cache:
        raise ValueError(f"max_prefill {max_prefill}: expected 1 to max_cache ({max_cache})")
    return max_cache, max_prefill
