"""``xnnfold bench NAME``: one of the bench's one-off measurements (:mod:`xnnfold.bench.scripts`),
in a process of its own."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .command import Command


def _bench_description() -> str:
    import textwrap

    from ..bench.scripts import SCRIPTS, summary

    lines = "\n".join(textwrap.fill(summary(name), 96, initial_indent=f"  {name:22s} ",
                                    subsequent_indent=" " * 25) for name in SCRIPTS)
    return textwrap.fill(
        "Run one of the bench's one-off measurements, each in a process of its own (the "
        "bench's main measurement is `xnnfold report`). `xnnfold bench NAME --help` shows a "
        "script's own arguments.", 96) + f"\n\nscripts:\n{lines}"


def _bench_arguments(parser) -> None:
    from ..bench.scripts import SCRIPTS

    parser.add_argument("name", choices=list(SCRIPTS), metavar="NAME",
                        help="the script: " + ", ".join(SCRIPTS))
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")


def _cmd_bench(args) -> int:
    """One of the bench's scripts (:mod:`xnnfold.bench.scripts`), in a process of its own with
    this interpreter and this xnnfold importable."""
    import os
    import subprocess

    from ..bench.scripts import SCRIPTS

    package_root = str(Path(__file__).resolve().parents[2])     # the folder holding xnnfold
    path = os.pathsep.join([package_root, *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, "PYTHONPATH": path}
    if not args.verbose:
        env.setdefault("PYTHONWARNINGS", "ignore")
    done = subprocess.run([sys.executable, "-m", "xnnfold.bench.scripts.run",
                           SCRIPTS[args.name], *args.args], env=env)
    if done.returncode == 130:
        raise KeyboardInterrupt      # the script was interrupted: say so, exit 130
    return done.returncode


BENCH = Command("bench", "one-off measurements (xnnfold bench --help lists them)",
                _bench_arguments, _cmd_bench, description=_bench_description, in_process=False)
