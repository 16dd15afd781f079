"""What a user gets when their input is wrong: one line naming the problem. The argument parsers
of the command line and of the bench's scripts (one line per error, defaults in the help), and
:class:`UsageError`, which the command line, the exports and the bench raise for bad input.
A leaf of the standard library: parsing and checking come before any heavy import; the pass
never imports it (its own failures are :mod:`xnnfold.errors`')."""

from __future__ import annotations

import argparse
import re
import sys


class UsageError(Exception):
    """A problem with what the user gave us: one line, exit code 2."""


class OptionError(UsageError):
    """A :class:`UsageError` about options of a function (``xnnfold.export``'s): ``template``
    names each option between backquotes, `max_cache` or `cache=False`. ``str()`` writes
    them as the function's keyword arguments (max_cache, cache=False); :meth:`spelled` as the
    caller spells them (the command line: as its flags)."""

    _OPTION = re.compile(r"`([a-z_]+(?:=\w+)?)`")

    def __init__(self, template: str):
        self.template = template
        super().__init__(self.spelled(lambda name: name))

    def spelled(self, spell) -> str:
        """The message with each option written ``spell(name)``."""
        return self._OPTION.sub(lambda match: spell(match.group(1)), self.template)


def first_line(error: BaseException, width: int = 160) -> str:
    """``Type: message`` in one line: the message's first line that says something (torchao's
    start with an empty one), shortened to ``width``."""
    said = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {said[0][:width] if said else '(no message)'}"


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The description as written; each option's default after its help, where it has one."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if "%(default)" not in text and action.option_strings and default not in (
                None, False, True, argparse.SUPPRESS) and default != []:
            text += " (default: %(default)s)"
        return text


class ParserError(Exception):
    """What the parser found wrong, in one line (``xnnfold: error: ...``)."""


# A value that starts with "-" and is not an option: a number, or a comma-separated list of
# numbers (``--tokens -5,2``). argparse's own pattern takes a single number only, so a list
# that starts with a negative one was read as an unknown option ("expected one argument")
# instead of reaching the check that says what is wrong with it.
_NUMBER = r"(?:\d+|\d*\.\d+)"
NEGATIVE_VALUE = re.compile(rf"^-{_NUMBER}(?:,\s*(?:-?{_NUMBER})?)*$")


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line, ``xnnfold: error: [command: ]message
    (see ... --help)``, exit code 2 (argparse prints its usage first); a negative number or a
    comma-separated list of numbers is a value (:data:`NEGATIVE_VALUE`), never an option."""

    raises = False            # CommandParser: raise ParserError, for the caller to print

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        # argparse's attribute, read when an argument starts with "-" (the subcommands'
        # parsers are of this class too)
        self._negative_number_matcher = NEGATIVE_VALUE

    def error(self, message):
        command = self.prog.split(" ", 1)[1] + ": " if " " in self.prog else ""
        line = f"{command}{message} (see {self.prog} --help)"
        if self.raises:
            raise ParserError(line)
        print(f"xnnfold: error: {line}", file=sys.stderr)
        sys.exit(2)


class CommandParser(Parser):
    """The command line's parser (and its subcommands'): errors raised as
    :class:`ParserError`."""

    raises = True
