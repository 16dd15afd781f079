"""Keep the command line's output to its own lines: silence what dependencies print.

Three sources, three means:
- Python warnings (torch, executorch, the Inspector): ``warnings.filterwarnings("ignore")``.
- Python log records at import time (torchao's ``Failed to load .../_C_*.so``, torch's
  ``_pytree`` ``W1203 ...`` deprecation): raise those loggers to ERROR. torch installs its own
  handler and resets the ``torch`` logger's level when ``torch._logging`` initializes, so torch
  is imported first and the levels set after, before torchao and executorch are imported.
- The runtime's C++ log lines (``[cpuinfo_utils.cpp:71] ...``) are written to file descriptor 2
  (through ``sys.stderr`` or past it): fd 2 is pointed at a pipe, and a thread copies what
  comes out of it to the real stderr, dropping the lines that match :data:`NOISE`.
"""

from __future__ import annotations

import logging
import os
import re
import select
import sys
import threading
import warnings

# Lines of dependency noise, as they start.
NOISE = re.compile(
    rb"^(\[[A-Za-z_]+\.(cpp|h|cc):\d+\]|Failed to load .*torchao|[WIE]\d{4} [\d:.]+ )")
_SEGMENT_END = re.compile(rb"([\r\n])")
# What may be the start of a noise line, held until its end is known.
_MAYBE_NOISE = re.compile(rb"^(\[|[WIE]\d|F)")
_LOGGERS = ("torch", "torchao", "executorch", "torch.utils._pytree", "torch._export",
            "torch.export", "root")


def silence_python() -> None:
    warnings.filterwarnings("ignore")
    import torch  # noqa: F401 - torch._logging resets the "torch" logger's level on import
    for name in _LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)


class StderrFilter:
    """Route fd 2 through a pipe and drop :data:`NOISE` lines; :meth:`close` restores it.

    Everything written to stderr goes through it, Python's ``sys.stderr`` included: the
    runtime's pybindings route their C++ log lines to ``sys.stderr`` (a Python object), while
    other C/C++ code writes to fd 2 itself. A piece of text that cannot start a noise line (a
    progress bar's update, say) is passed on at once, not held until its newline.
    """

    def __init__(self):
        sys.stderr.flush()
        self._saved = os.dup(2)
        read_end, write_end = os.pipe()
        os.dup2(write_end, 2)
        os.close(write_end)
        self._read_end = read_end
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _pass(self, text: bytes) -> None:
        if text and not NOISE.match(text):
            os.write(self._saved, text)

    def _pump(self) -> None:
        pending = b""
        while True:
            # A process that outlives the command (multiprocessing's forkserver) may hold the
            # pipe's write end: stop on close() once nothing more is ready, not only on EOF.
            ready, _, _ = select.select([self._read_end], [], [], 0.1)
            if not ready:
                if self._stop.is_set():
                    break
                continue
            chunk = os.read(self._read_end, 65536)
            if not chunk:
                break
            pending += chunk
            *segments, pending = _SEGMENT_END.split(pending)
            for index in range(0, len(segments), 2):     # (text, terminator) pairs
                self._pass(segments[index] + segments[index + 1])
            if pending and not _MAYBE_NOISE.match(pending):
                self._pass(pending)
                pending = b""
        self._pass(pending)
        os.close(self._read_end)

    def close(self) -> None:
        sys.stderr.flush()
        os.dup2(self._saved, 2)
        self._stop.set()
        self._thread.join(timeout=5)
        os.close(self._saved)


def quiet() -> StderrFilter:
    """Silence dependencies for the rest of the command; returns the filter to close."""
    stderr_filter = StderrFilter()
    silence_python()
    return stderr_filter
