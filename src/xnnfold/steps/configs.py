"""The partitioner configs a step needs: executorch's own config instances, extended.

A step whose output only a config that knows its marks takes (run-time weights, the visible
rows) builds, from each of the partitioner's own configs of the ops it emits, an instance of a
subclass that overrides one check and defers to the stock one otherwise; the partitioner puts
those in place of its own (:class:`~xnnfold.steps.protocol.Opening`). A subclass, not a wrapper
object: the stock config calls the overridden check on itself (``check_constraints`` calls
``self._check_node_has_valid_dtype``). The partitioner's own instances are left as they are
(executorch's classes are not patched, nor is another partitioner's config).
"""

from __future__ import annotations

from typing import Callable, Iterable


def extended(config, subclass: type):
    """An instance of ``subclass`` (a subclass of ``config``'s class) with ``config``'s state."""
    if not issubclass(subclass, type(config)):
        raise TypeError(f"{subclass.__name__} does not extend {type(config).__name__}")
    new = subclass.__new__(subclass)
    new.__dict__.update(vars(config))
    return new


def extend_configs(partitioner, targets: Iterable[str], subclass_of: Callable[[type], type]
                   ) -> dict:
    """Target name -> ``partitioner``'s config of that target, extended by
    ``subclass_of(its class)``."""
    configs = partitioner.target_partitioner_configs
    return {t: extended(configs[t], subclass_of(type(configs[t]))) for t in targets}
