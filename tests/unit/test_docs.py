"""The README and docs/ cannot drift from the code: every ``xnnfold`` command they show (in sh
blocks) parses with the command line's own parser (a renamed or removed option fails here),
and every Python block compiles and imports names that exist. What each command does is the
business of that command's own tests."""

from __future__ import annotations

import ast
import importlib
import pathlib
import re
import shlex

import pytest

from xnnfold.cli.main import build_parser
from xnnfold.usage import ParserError

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```(\w*)\s*$")


def blocks(page: pathlib.Path) -> list:
    """(language, first line number, text) of each fenced block of ``page``."""
    found, language, start, lines = [], None, 0, []
    for number, line in enumerate(page.read_text().splitlines(), 1):
        fence = _FENCE.match(line.strip())
        if fence and language is None:
            language, start, lines = fence.group(1) or "text", number + 1, []
        elif line.strip() == "```" and language is not None:
            found.append((language, start, "\n".join(lines)))
            language = None
        elif language is not None:
            lines.append(line)
    return found


def commands(text: str) -> list:
    """The ``xnnfold ...`` command lines of a shell block (continuations joined, comments and
    a leading ``$ `` dropped), with their offset in the block."""
    found, joined, first = [], "", 0
    for offset, line in enumerate(text.splitlines()):
        line = line.strip()
        if line.startswith("$ "):
            line = line[2:]
        if not joined:
            first = offset
        joined += line.rstrip("\\").strip() + " "
        if line.endswith("\\"):
            continue
        words = shlex.split(joined, comments=True)
        joined = ""
        if words and words[0] == "xnnfold":
            found.append((first, words[1:]))
    return found


SHELL = [(page, start + offset, argv) for page in PAGES
         for language, start, text in blocks(page) if language in ("sh", "shell", "bash", "console")
         for offset, argv in commands(text)]
PYTHON = [(page, start, text) for page in PAGES
          for language, start, text in blocks(page) if language == "python"]


def test_the_pages_show_commands_and_code():
    assert len(SHELL) >= 10 and len(PYTHON) >= 3, (len(SHELL), len(PYTHON))


@pytest.mark.parametrize("page, line, argv", SHELL,
                         ids=[f"{p.name}:{line}" for p, line, _ in SHELL])
def test_every_command_shown_parses(page, line, argv):
    if argv in (["--help"], ["--version"]) or argv[-1:] in (["--help"], ["--version"]):
        return                    # answered by the parser itself (tests/unit/test_command_line.py)
    try:
        build_parser().parse_args(argv)
    except ParserError as error:
        pytest.fail(f"{page.name}:{line}: xnnfold {' '.join(argv)}: {error}")


def _imported_names(tree: ast.AST) -> list:
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("xnnfold"):
            names += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            names += [(alias.name, None) for alias in node.names
                      if alias.name.startswith("xnnfold")]
    return names


@pytest.mark.parametrize("page, line, text", PYTHON,
                         ids=[f"{p.name}:{line}" for p, line, _ in PYTHON])
def test_every_python_block_compiles_and_imports_what_exists(page, line, text):
    tree = ast.parse(text, f"{page.name}:{line}")
    for module, name in _imported_names(tree):
        imported = importlib.import_module(module)
        assert name is None or hasattr(imported, name) or \
            importlib.util.find_spec(f"{module}.{name}") is not None, \
            f"{page.name}:{line}: {module} has no {name}"
    for node in ast.walk(tree):          # xnnfold.NAME used in the block exists
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                node.value.id == "xnnfold":
            assert hasattr(importlib.import_module("xnnfold"), node.attr), \
                f"{page.name}:{line}: xnnfold has no {node.attr}"
