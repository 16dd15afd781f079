"""The pass's settings: one :class:`Config`, read from the environment once (when this module is
imported) as the default, passed explicitly or set for a block with :func:`using`.

- ``strict``: an internal failure of the pass raises :class:`~xnnfold.errors.StrictFallback`
  instead of warning and lowering as stock would (the test suite's setting: a fallback that
  hides a bug must not pass a test);
- ``verify_probe``: every answer of the fast probe is checked against the whole-program probe
  (:mod:`xnnfold.steps.fold.probe.verified`; a test setting: it costs a second decomposition).

Environment (read once): ``XNNFOLD_STRICT=1``, ``XNNFOLD_VERIFY_PROBE=1``. Nothing in xnnfold
writes the environment: a setting changed for a block is changed for that block only (a
``contextvars`` variable: per thread and per task, restored on exit, raise or not).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
from typing import Mapping, Optional

STRICT_ENV = "XNNFOLD_STRICT"
VERIFY_ENV = "XNNFOLD_VERIFY_PROBE"


def _flag(environ: Mapping[str, str], name: str) -> bool:
    return environ.get(name, "") not in ("", "0")


@dataclasses.dataclass(frozen=True)
class Config:
    """What changes the pass's behaviour beyond its arguments (see the module's docstring)."""

    strict: bool = False
    verify_probe: bool = False

    @classmethod
    def from_environment(cls, environ: Optional[Mapping[str, str]] = None) -> "Config":
        environ = os.environ if environ is None else environ
        return cls(strict=_flag(environ, STRICT_ENV), verify_probe=_flag(environ, VERIFY_ENV))


# The settings outside any ``using`` block: the environment's, read once.
DEFAULT = Config.from_environment()
_current: contextvars.ContextVar = contextvars.ContextVar("xnnfold_config")


def current() -> Config:
    """The settings in force here: the innermost :func:`using` block's, else :data:`DEFAULT`."""
    return _current.get(DEFAULT)


@contextlib.contextmanager
def using(config: Optional[Config] = None, **changes):
    """Run the block with ``config`` (default: the settings in force), changed by ``changes``
    (``using(strict=True)``); the settings before are back on exit."""
    unknown = set(changes) - {f.name for f in dataclasses.fields(Config)}
    if unknown:
        raise TypeError(f"xnnfold.config.using: no setting {', '.join(sorted(unknown))}; "
                        f"settings: {', '.join(f.name for f in dataclasses.fields(Config))}")
    token = _current.set(dataclasses.replace(config or current(), **changes))
    try:
        yield current()
    finally:
        _current.reset(token)
