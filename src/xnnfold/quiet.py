"""Keep the command line's output to its own lines: silence what dependencies print.

Three sources, three means:
- Python warnings (torch, executorch, the Inspector): ``warnings.filterwarnings("ignore")``.
- Python log records at import time (torchao's ``Failed to load .../_C_*.so``, torch's
  ``_pytree`` ``W1203 ...`` deprecation): raise those loggers to ERROR. torch installs its own
  handler and resets the ``torch`` logger's level when ``torch._logging`` initializes, so torch
  is imported first and the levels set after, before torchao and executorch are imported.
- The runtime's C++ log lines (``[cpuinfo_utils.cpp:71] ...``) are written to file descriptor 2
  directly, past ``sys.stderr``: fd 2 is pointed at a pipe, and a thread copies what comes out
  of it to the real stderr, dropping the lines that match :data:`NOISE`.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import warnings

# Lines of dependency noise, as they start.
NOISE = re.compile(rb"^(\[[A-Za-z_]+\.(cpp|h|cc):\d+\]|Failed to load .*torchao|[WIE]\d{4} [\d:.]+ )")
_LOGGERS = ("torch", "torchao", "executorch", "torch.utils._pytree", "torch._export",
            "torch.export", "root")


def silence_python() -> None:
    warnings.filterwarnings("ignore")
    import torch  # noqa: F401 - torch._logging resets the "torch" logger's level on import
    for name in _LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)


class StderrFilter:
    """Route fd 2 through a pipe and drop :data:`NOISE` lines; :meth:`close` restores it.

    Python's ``sys.stderr`` keeps writing to the real stderr (a duplicate of the original fd
    2), so progress bars and error lines pass unbuffered; only what writes to fd 2 itself (C and
    C++ code) goes through the filter.
    """

    def __init__(self):
        sys.stderr.flush()
        self._saved = os.dup(2)
        read_end, write_end = os.pipe()
        os.dup2(write_end, 2)
        os.close(write_end)
        self._read_end = read_end
        self._python_stderr = sys.stderr
        sys.stderr = os.fdopen(os.dup(self._saved), "w", buffering=1,
                               encoding=getattr(sys.stderr, "encoding", None) or "utf-8",
                               errors="replace")
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        pending = b""
        while True:
            chunk = os.read(self._read_end, 65536)
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if not NOISE.match(line):
                    os.write(self._saved, line + b"\n")
        if pending and not NOISE.match(pending):
            os.write(self._saved, pending)
        os.close(self._read_end)

    def close(self) -> None:
        sys.stderr.flush()
        os.dup2(self._saved, 2)        # closes the pipe's last write end: the pump ends
        self._thread.join(timeout=5)
        sys.stderr.close()
        sys.stderr = self._python_stderr
        os.close(self._saved)


def quiet() -> StderrFilter:
    """Silence dependencies for the rest of the command; returns the filter to close."""
    stderr_filter = StderrFilter()
    silence_python()
    return stderr_filter
