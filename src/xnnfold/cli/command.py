"""What every subcommand is made of (:class:`Command`), how it fails (:class:`CommandFailed`,
:class:`~xnnfold.usage.UsageError`), what it needs installed, and the model sources the
program-taking commands share."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from typing import Callable

from . import checks
from ..usage import UsageError

# What each command imports beyond the pass, and the extra that installs it.
BENCH_EXTRA = "pip install 'xnnfold[bench]'"
CHARTS = "matplotlib"
QUANTIZE = ("dynamic", "static")



def runtime_arguments(parser, first_calls: str) -> None:
    """``--threads`` and ``--no-warmup``, as the commands that run a .pte on the runtime take
    them; ``first_calls``: what runs untimed first by default (the help's words)."""
    parser.add_argument("--threads", type=int, help="the runtime's threads (default: its own, "
                        "one per core)")
    parser.add_argument("--no-warmup", dest="warmup", action="store_false",
                        help=f"time the first calls too (by default {first_calls} run first, "
                             "untimed)")

class CommandFailed(Exception):
    """The work was done and its result is wrong (a .pte that does not run or does not match
    eager; every variant of a model failed): one line, exit code 1."""


@dataclass(frozen=True)
class Command:
    """A subcommand: ``arguments(parser)`` adds its arguments, ``check(args)`` checks them
    before any heavy import (raising :class:`UsageError`), ``run(args)`` does the work and
    returns the exit code. ``description``: the help's text, or a function making it (default:
    ``help``). ``in_process=False``: the work runs in another process (no torch imported here:
    the dependency noise is filtered on the file descriptor only)."""

    name: str
    help: str
    arguments: Callable
    run: Callable
    check: Callable = lambda args: None
    description: object = ""
    in_process: bool = True


def not_installed(*modules: str) -> list:
    """The modules of ``modules`` that do not import here (without importing them)."""
    missing = []
    for name in modules:
        if name in sys.modules:
            if sys.modules[name] is None:         # an import blocked on purpose
                missing.append(name)
            continue
        try:
            if importlib.util.find_spec(name) is None:
                missing.append(name)
        except (ImportError, ValueError):
            missing.append(name)
    return missing


def require(command: str, *modules: str, install: str = BENCH_EXTRA) -> None:
    """One line naming what ``command`` needs and how to install it, before any work."""
    absent = not_installed(*modules)
    if absent:
        raise UsageError(f"xnnfold {command} needs {', '.join(sorted(absent))}: {install}")


def model_case(source: str, quantize=None):
    """The model of a factory, a .pt2 (with its saved example inputs) or a built-in name,
    PT2E-quantized with ``quantize`` (:mod:`xnnfold.models.sources`)."""
    from ..models.sources import ModelSource
    return ModelSource.of(source, quantize).build()


def program_of(source: str, quantize=None):
    """A .pt2 file as saved, or the model of a factory or a built-in name exported (quantized
    first with ``quantize``)."""
    from ..models.sources import export, load_program

    if not quantize and checks.is_pt2(source):
        return load_program(source)
    return export(model_case(source, quantize))


LLM_KERNELS_HELP = ("a KV cache's update and attention on executorch's llama::update_cache / "
                     "llama::custom_sdpa where proven exact: the .pte then needs a runtime with "
                     "executorch's LLM custom ops")
