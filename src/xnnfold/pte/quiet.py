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

import collections
import contextlib
import itertools
import logging
import os
import re
import select
import sys
import threading
import warnings
from typing import Optional

# Lines of dependency noise, as they start.
NOISE = re.compile(
    rb"^(\[[A-Za-z_]+\.(cpp|h|cc):\d+\]|Failed to load .*torchao|[WIE]\d{4} [\d:.]+ )")
_SEGMENT_END = re.compile(rb"([\r\n])")
# What may be the start of a noise line, held until its end is known.
_MAYBE_NOISE = re.compile(rb"^(\[|[WIE]\d|F|\x00)")      # \x00: a mark (StderrFilter.mark)
# What the runtime logs when a .pte fails: the check or assertion that failed, the kernel call.
_FAILURE = re.compile(r"^\[(?!cpuinfo)[A-Za-z_]+\.(cpp|h|cc):\d+\].*(failed|Failed)")
_MARK = b"\x00xnnfold-mark "
# Where a runtime's log line or a mark starts after other text, in one piece read from the
# pipe: the writers share it, and a progress bar's update ends with no line end ("\rlowering:
# 4/10 ..."), so a line another writer (this process's runtime, a child's) writes right after
# it is read glued to it; matched at the start only, the pair passed to the terminal whole
# (a NUL and "xnnfold-mark 3", a cpuinfo line, after the bar).
_LINE_INSIDE = re.compile(rb"(?=\x00xnnfold-mark |\[[A-Za-z_]+\.(?:cpp|h|cc):\d+\] )")
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
        # the noise lines dropped last, numbered; and the last mark the pump has read
        self._dropped: collections.deque = collections.deque(maxlen=200)
        self._count = 0
        self._marks = itertools.count(1)
        self._seen = threading.Condition()
        self._seen_mark = 0
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _pass(self, text: bytes) -> None:
        if text.startswith(_MARK):
            with self._seen:
                self._seen_mark = int(text[len(_MARK):])
                self._seen.notify_all()
        elif text and NOISE.match(text):
            self._count += 1
            self._dropped.append((self._count, text))
        elif text:
            os.write(self._saved, text)

    def mark(self, timeout: float = 1.0) -> int:
        """Wait until the pump has read everything written to fd 2 before this call (a mark
        line written now comes back through the pipe after it); the number of noise lines
        dropped so far."""
        number = next(self._marks)
        os.write(2, _MARK + str(number).encode() + b"\n")
        with self._seen:
            self._seen.wait_for(lambda: self._seen_mark >= number, timeout)
        return self._count

    def dropped_since(self, mark: int) -> list:
        """The noise lines dropped after :meth:`mark` returned ``mark``, up to now."""
        self.mark()
        return [text.decode(errors="replace").rstrip()
                for number, text in list(self._dropped) if number > mark]

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
                for line in _LINE_INSIDE.split(segments[index] + segments[index + 1]):
                    self._pass(line)
            if pending and not _MAYBE_NOISE.match(pending):
                self._pass(pending)
                pending = b""
        self._pass(pending)
        os.close(self._read_end)

    def close(self) -> None:
        global _active
        if _active is self:
            _active = None
        sys.stderr.flush()
        os.dup2(self._saved, 2)
        self._stop.set()
        self._thread.join(timeout=5)
        os.close(self._saved)


_active: Optional[StderrFilter] = None


def quiet(python: bool = True) -> StderrFilter:
    """Silence dependencies for the rest of the command; returns the filter to close.
    ``python=False``: the file descriptor's filter only (no torch import: for a command that
    runs its work in another process)."""
    global _active
    stderr_filter = _active = StderrFilter()
    if python:
        try:
            silence_python()
        except BaseException:
            stderr_filter.close()        # what follows (the traceback) reaches the terminal
            raise
    return stderr_filter


@contextlib.contextmanager
def runtime_log():
    """Collects, into the list it yields, the runtime's failure lines that :func:`quiet` hid
    while inside (the failing check, the kernel call); empty when nothing is filtered (the
    lines were shown)."""
    lines: list = []
    active = _active if _active is not None and not _active._stop.is_set() else None
    start = active.mark() if active else 0
    try:
        yield lines
    finally:
        if active is not None:
            lines.extend(line for line in active.dropped_since(start) if _FAILURE.search(line))


def failure_summary(lines: list, width: int = 240) -> str:
    """The runtime's failure lines in one: each without its ``[file.cpp:N]`` prefix, the
    kernel call last, e.g. ``Check failed (tensors_have_same_dim_order(in, out)); KernelCall
    failed at instruction 0:7 in operator aten::slice_copy.Tensor_out: 0x12``."""
    said = [re.sub(r"^\[[^\]]*\]\s*", "", line).rstrip(": ") for line in lines]
    said = list(dict.fromkeys(s for s in said if s))
    return "; ".join(said)[:width]
