"""Errors that name the node they happened at, so that a fallback warning can say where."""

from __future__ import annotations

import contextlib
import os

import torch.fx


class FoldError(RuntimeError):
    """An internal failure of xnnfold, at a node; the caller falls back to stock."""

    def __init__(self, node: str, reason: str):
        super().__init__(f"at node {node!r}: {reason}")
        self.node = node
        self.reason = reason


@contextlib.contextmanager
def at_node(node: torch.fx.Node, doing: str):
    """Re-raise any failure inside the block as a FoldError naming ``node``."""
    try:
        yield
    except FoldError:
        raise
    except Exception as error:  # noqa: BLE001 - every failure must name its node
        raise FoldError(node.name, f"{doing} {node.format_node()}: "
                        f"{type(error).__name__}: {error}") from error


# Tests set XNNFOLD_STRICT=1: an internal failure that users' runs turn into a warning and a
# fallback to stock (which hides it: the .pte is still right) raises StrictFallback instead.
STRICT_ENV = "XNNFOLD_STRICT"


def strict_requested() -> bool:
    return os.environ.get(STRICT_ENV, "") not in ("", "0")


class StrictFallback(RuntimeError):
    """Raised, in strict mode only, where xnnfold would have warned and fallen back to stock."""


def warn_or_raise(logger, message: str, *args) -> None:
    """Where xnnfold gives a step up and does what stock does: a warning for users, a
    :class:`StrictFallback` in strict mode (the tests), so that no such path hides a bug."""
    if strict_requested():
        raise StrictFallback(message % args)
    logger.warning(message, *args)
