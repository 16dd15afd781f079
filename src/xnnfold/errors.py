"""Errors that name the node they happened at, so that a fallback warning can say where."""

from __future__ import annotations

import contextlib

import torch.fx

from . import config


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


class StrictFallback(RuntimeError):
    """Raised, in strict mode only (``Config.strict``: the tests' setting), where xnnfold would
    have warned and fallen back to stock: a fallback hides a bug, the .pte being still right."""


def warn_or_raise(logger, message: str, *args) -> None:
    """Where xnnfold gives a step up and does what stock does: a warning for users, a
    :class:`StrictFallback` in strict mode (the tests), so that no such path hides a bug."""
    if config.current().strict:
        raise StrictFallback(message % args)
    logger.warning(message, *args)
