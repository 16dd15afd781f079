"""Command line: ``xnnfold report``, ``lower``, ``explain``, ``hf``, ``generate``, ``bench``.

Each subcommand is one :class:`Command` of :data:`COMMANDS`: its arguments, a check of them
that imports nothing heavy (:mod:`xnnfold.cli.checks`), and the work. Bad input gets one line
on stderr naming the problem and exit code 2, before any heavy import or lowering; work done
whose result is wrong (a .pte that does not run or does not match eager, every variant of a
model failed) one line and exit code 1; Ctrl-C exit code 130. ``--debug`` shows the traceback
instead. Dependency noise (torchao, torch's ``_pytree``, the runtime's C++ log lines) is
filtered out unless ``--verbose`` (:mod:`xnnfold.pte.quiet`).
"""

from .main import main  # noqa: F401 - the ``xnnfold`` command's entry point (pyproject.toml)
