"""Files written whole or not at all (:func:`write_atomically`): a .pte or .ptd goes to a
temporary beside its name (``.NAME.partial-PID``, in the same folder, so that the rename is
atomic) and takes the name once complete. An export interrupted (Ctrl-C) or failing while it
writes leaves no half-written file under the output name, and an older file there as it was.

A process killed outright (the kernel's out-of-memory killer, ``kill -9``) cannot remove its
temporary: the next write of the same name removes those whose process is gone.
"""

from __future__ import annotations

import contextlib
import glob
import os
import stat
from pathlib import Path
from typing import Callable, Mapping, Union

# bytes, executorch's program manager (its write_to_file(file) streams the .pte), or a
# function writing the file's contents into the binary file it is given
Data = Union[bytes, bytearray, memoryview, Callable, object]

_PARTIAL = ".partial-"


def partial_path(path, pid: int = None) -> Path:
    """Where ``path`` is written before it is complete (by process ``pid``, default this one)."""
    path = Path(path)
    return path.with_name(f".{path.name}{_PARTIAL}{os.getpid() if pid is None else pid}")


def write_atomically(path, data: Data) -> None:
    """``data`` written to ``path`` whole, or ``path`` left as it was (absent or its old
    contents) and no temporary left, whatever interrupts the write (an exception,
    KeyboardInterrupt), which is raised on."""
    write_all_atomically({path: data})


def write_all_atomically(files: Mapping) -> None:
    """Each of ``files`` (path: data, as :func:`write_atomically`) written to its temporary
    first; the names are replaced only once all of them are complete (a .pte and its .ptd:
    neither name holds a new file while the other is half-written)."""
    staged = []
    try:
        for path, data in files.items():
            path = _target(path)
            _remove_abandoned(path)
            partial = partial_path(path)
            staged.append((partial, path))
            with _created(partial, path) as file:
                _write(file, data)
        for partial, path in staged:
            os.replace(partial, path)
    except BaseException:
        for partial, _ in staged:
            with contextlib.suppress(OSError):
                partial.unlink(missing_ok=True)
        raise


def _target(path) -> Path:
    """The file a write of ``path`` lands in: a symbolic link's target (the link stays, as
    ``Path.write_bytes`` leaves it), else ``path``."""
    path = Path(path)
    return path.resolve() if path.is_symlink() else path


def _created(partial: Path, path: Path):
    """``partial`` created anew (never a file someone else put there: O_EXCL), with the mode
    of the file it replaces, if any."""
    with contextlib.suppress(FileNotFoundError):
        partial.unlink()                      # this process's own, from an earlier attempt
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL |
                         getattr(os, "O_BINARY", 0), 0o666)
    try:
        if path.exists():
            os.chmod(descriptor if os.chmod in os.supports_fd else partial,
                     stat.S_IMODE(path.stat().st_mode))
    except OSError:                           # a mode it may not set: the default one
        pass
    return os.fdopen(descriptor, "wb")


def _write(file, data: Data) -> None:
    if isinstance(data, (bytes, bytearray, memoryview)):
        file.write(data)
    elif hasattr(data, "write_to_file"):
        data.write_to_file(file)
    elif callable(data):
        data(file)
    else:
        raise TypeError(f"write_atomically: bytes, an object with write_to_file(file) or a "
                        f"function of a file, not {type(data).__name__}")


def _remove_abandoned(path: Path) -> None:
    """The temporaries of ``path`` whose process is gone (killed before it could remove
    them). Only where a process can be asked whether it runs without signalling it."""
    if os.name != "posix":
        return
    prefix = str(partial_path(path, 0))[:-1]
    for found in glob.glob(glob.escape(prefix) + "*"):
        pid = found.rsplit(_PARTIAL, 1)[1]
        if pid.isdigit() and int(pid) != os.getpid() and not _running(int(pid)):
            with contextlib.suppress(OSError):
                os.unlink(found)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)                       # signal 0: whether it exists, nothing sent
    except ProcessLookupError:
        return False
    except OSError:                           # exists, another user's
        return True
    return True
