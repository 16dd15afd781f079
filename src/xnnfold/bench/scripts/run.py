"""``python -m xnnfold.bench.scripts.run MODULE [ARGS]``: how ``xnnfold bench`` runs a script.

The script's ``main(argv)`` runs as ``python -m xnnfold.bench.scripts.MODULE`` would run it, but
Ctrl-C ends it with exit code 130 and one line, not a traceback: the terminal sends SIGINT to
the whole process group, so the script sees it as the command line does, and the command line
already says "interrupted".
"""

from __future__ import annotations

import importlib
import os
import sys


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print("usage: python -m xnnfold.bench.scripts.run MODULE [ARGS]", file=sys.stderr)
        return 2
    module, args = argv[0], argv[1:]
    try:
        script = importlib.import_module(f"{__package__}.{module}")
        return script.main(args)
    except KeyboardInterrupt:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)     # at once: nothing to save, and torch's teardown takes seconds


if __name__ == "__main__":
    sys.exit(main())
