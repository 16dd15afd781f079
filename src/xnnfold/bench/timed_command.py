"""A command run as its user runs it, in a process of its own under ``/usr/bin/time -v``, and
what that report says: the export benches' one way to time an export and read its peak
resident set (bench llm-runner --folder, bench optimum-multimodal)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path


def run_timed(command: list, log: Path) -> int:
    """``command``'s exit code; its output and ``/usr/bin/time -v``'s report into ``log``."""
    with open(log, "w") as report:
        return subprocess.run(["/usr/bin/time", "-v", *map(str, command)], stdout=report,
                              stderr=subprocess.STDOUT).returncode


def time_report(log: Path) -> tuple:
    """(wall seconds, peak resident KiB) from the last ``/usr/bin/time -v`` report in ``log``,
    None for what it lacks (no log: (None, None))."""
    text = log.read_text(errors="replace") if log.is_file() else ""
    wall = re.findall(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", text)
    peak = re.findall(r"Maximum resident set size \(kbytes\): (\d+)", text)
    seconds = None
    if wall:
        seconds = 0.0
        for part in wall[-1].split(":"):
            seconds = seconds * 60 + float(part)
    return seconds, (int(peak[-1]) if peak else None)
