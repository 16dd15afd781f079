"""The ``xnnfold`` command: its parser (one :class:`~xnnfold.cli.command.Command` per subcommand,
:data:`COMMANDS`), and :func:`main`, which checks the arguments before any heavy import, runs the
command with dependency noise filtered, and turns failures into one line and an exit code."""

from __future__ import annotations

import argparse
import os
import sys

from ..usage import CommandParser, OptionError, ParserError, UsageError
from . import bench, generate, hf, lower, report, transcribe
from .command import CommandFailed


COMMANDS = (report.REPORT, lower.LOWER, lower.EXPLAIN, hf.HF, generate.GENERATE,
            transcribe.TRANSCRIBE, bench.BENCH)


class _Version(argparse.Action):
    """``--version``: xnnfold's and the versions it runs with (read from the installed
    packages' metadata, nothing imported)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        import platform
        from importlib.metadata import PackageNotFoundError, version

        from .. import __version__

        def of(name: str) -> str:
            try:
                return version(name)
            except PackageNotFoundError:
                return "not installed"

        print(f"xnnfold {__version__} (torch {of('torch')}, executorch {of('executorch')}, "
              f"python {platform.python_version()})")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="xnnfold", description="Fold computed GEMM weights so XNNPACK delegates them.")
    parser.add_argument("--version", action=_Version, help="show the versions and exit")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    parser.add_argument("--verbose", action="store_true",
                        help="show what dependencies print (warnings, the runtime's C++ logs)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        description = command.description() if callable(command.description) else \
            command.description or command.help
        sub = commands.add_parser(command.name, help=command.help, description=description)
        # where a user types it: after the subcommand as well as before
        sub.add_argument("--version", action=_Version, help="show the versions and exit")
        command.arguments(sub)
        sub.set_defaults(command_=command)
    return parser


def main(argv=None) -> int:
    try:
        return _run(argv)
    except KeyboardInterrupt:
        pass             # anywhere, parsing included; the work's own handlers stopped its processes
    print("xnnfold: interrupted", file=sys.stderr)
    if argv is None:         # this process's own command line (the script, python -m xnnfold)
        sys.stdout.flush()
        sys.stderr.flush()
        # at once: the interpreter's teardown of torch and executorch takes 1-2 s more on a
        # loaded machine, and nothing is left to save
        os._exit(130)
    return 130


def as_flag(option: str) -> str:
    """A keyword argument of xnnfold's functions (:class:`~xnnfold.usage.OptionError`) as the
    command line's flag: max_cache as --max-cache, attention=eager as --attention eager,
    cache=False as --no-cache, llm_kernels=True as --llm-kernels."""
    name, _, value = option.partition("=")
    flag = "--" + name.replace("_", "-")
    if value in ("True", "False"):
        return flag if value == "True" else "--no-" + flag[2:]
    return f"{flag} {value}" if value else flag


def _said(error: Exception) -> str:
    """An error's line, the options it names written as flags."""
    return error.spelled(as_flag) if isinstance(error, OptionError) else str(error)


def _run(argv) -> int:
    args = None
    try:
        args = build_parser().parse_args(argv)
        command = args.command_
        command.check(args)              # before any heavy import
    except (ParserError, UsageError) as error:
        if args is not None and args.debug:
            raise
        print(f"xnnfold: error: {_said(error)}", file=sys.stderr)
        return 2
    # torch, torchao and executorch warn on every import and lowering, and the runtime's C++
    # logs to fd 2; none of it is the user's concern unless they ask (--verbose).
    stderr_filter = None
    try:
        if not args.verbose:
            from ..pte.quiet import quiet
            stderr_filter = quiet(python=command.in_process)
        return command.run(args)
    except (UsageError, CommandFailed) as error:
        if args.debug:
            raise
        print(f"xnnfold: error: {_said(error)}", file=sys.stderr)
        return 2 if isinstance(error, UsageError) else 1
    finally:
        if stderr_filter is not None:
            stderr_filter.close()
