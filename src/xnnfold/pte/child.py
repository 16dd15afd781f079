"""A function run in a process of its own, forked from a forkserver: what the report's
lowerings (:mod:`xnnfold.pte.isolated`) and ``xnnfold lower --check`` use.

Why not ``multiprocessing.Pool``: a pool worker that dies (a .pte that aborts the runtime, the
OOM killer) or that Ctrl-C interrupts (the terminal sends SIGINT to the whole process group,
and a worker's ``KeyboardInterrupt`` is not an ``Exception``, so it kills the worker) loses its
task; the pool starts a new worker and the parent waits for the lost result forever. Here the
parent waits on a pipe and on the process itself: a child that ends without answering raises
:class:`ChildDied` naming its exit code or signal, and Ctrl-C in the parent stops the child
and goes on as ``KeyboardInterrupt``.

Ctrl-C is the parent's alone: the forkserver is started with SIGINT ignored (Python then keeps
it ignored, and its children inherit that), so no child prints a ``KeyboardInterrupt`` of its
own; the parent terminates the child it waits for.

The processes are forked from a *forkserver* that has imported :data:`PRELOAD` once (torch,
executorch and the pass: 5-10 s saved per process) and has run no torch op, so it has no OpenMP
pool to inherit (a process forked from one that started it can hang).
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import threading
import time
from multiprocessing import forkserver
from typing import Optional

PRELOAD = ["xnnfold.pte.lowering"]     # torch, executorch.exir and xnnfold's pass
_POLL_SECONDS = 0.1


class ChildDied(RuntimeError):
    """The child process ended without answering: killed by a signal or exited."""

    def __init__(self, exitcode: int):
        self.exitcode = exitcode
        if exitcode is not None and exitcode < 0:
            try:
                how = f"was killed by {signal.Signals(-exitcode).name}"
            except ValueError:
                how = f"was killed by signal {-exitcode}"
        else:
            how = f"exited with code {exitcode}"
        super().__init__(f"its process {how}")


def _context(preload: list):
    """The forkserver context; ``preload``: the modules the server imports when it starts (a
    server already running keeps its own)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(preload)
    if threading.current_thread() is threading.main_thread():
        # started (once) with SIGINT ignored: inherited by the server and every child
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            forkserver.ensure_running()
        finally:
            signal.signal(signal.SIGINT, previous)
    return context


class _ParentStderr:
    """The parent's file descriptor 2 as it is when the child starts, for the child to write
    to. A forkserver child inherits the server's, which is the one of the command that
    started the server: in a process that runs several commands (the tests, a library user),
    an earlier command's closed filter pipe (:mod:`xnnfold.pte.quiet`); the runtime's log
    lines then fail to write through ``sys.stderr`` inside C++ and abort the child."""

    def __init__(self, duplicate=None):
        self._duplicate = duplicate

    def __reduce__(self):        # pickled while the child starts: the fd goes with it
        from multiprocessing import reduction
        return (_ParentStderr, (reduction.DupFd(2),))

    def attach(self) -> None:
        fd = self._duplicate.detach()
        os.dup2(fd, 2)
        os.close(fd)


def _send(connection, kind: str, payload) -> None:
    # Plain pickle, by value: multiprocessing's own pickler would pass a tensor's storage as
    # shared memory, which is gone once this process exits, before the parent reads it.
    connection.send_bytes(pickle.dumps((kind, payload)))


def _serve(connection, stderr, function, args) -> None:
    """The child: run ``function(send, *args)``; ``send`` posts a message to the parent. An
    exception goes to the parent as it is (or as a RuntimeError naming it, if it does not
    pickle)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)       # Ctrl-C is the parent's to handle
    stderr.attach()
    try:
        function(lambda message: _send(connection, "message", message), *args)
    except BaseException as error:  # noqa: BLE001 - whatever it is, the parent says it
        try:
            pickle.dumps(error)
        except Exception:  # noqa: BLE001
            error = RuntimeError(f"{type(error).__name__}: {error}")
        _send(connection, "error", error)
    finally:
        connection.close()


class Child:
    """``function(send, *args)`` running in a process of its own; :meth:`receive` each message
    it sends (pickled by value). Use as a context manager: leaving it stops the process if it
    still runs."""

    def __init__(self, function, *args, preload=PRELOAD):
        context = _context(preload)
        self._receive, send = context.Pipe(duplex=False)
        self._process = context.Process(target=_serve, daemon=True,
                                        args=(send, _ParentStderr(), function, args))
        self._process.start()
        send.close()              # the child holds the other end: EOF once it ends

    def receive(self, timeout: Optional[float] = None):
        """The child's next message; its exception re-raised here; :class:`ChildDied` if it
        ended first; ``TimeoutError`` after ``timeout`` seconds without one (the process left
        running: leaving the context stops it)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._receive.poll(_POLL_SECONDS):
            if not self._process.is_alive() and not self._receive.poll(0):
                self._process.join()
                raise ChildDied(self._process.exitcode)
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"no answer in {timeout:.0f} s")
        try:
            kind, payload = pickle.loads(self._receive.recv_bytes())
        except EOFError:          # ended while the parent looked: nothing more to read
            self._process.join()
            raise ChildDied(self._process.exitcode) from None
        if kind == "error":
            raise payload
        return payload

    def stop(self, grace: float = 0.0) -> None:
        """End the process: wait ``grace`` seconds for it to exit, then terminate it (SIGTERM;
        SIGKILL 2 s later)."""
        self._process.join(grace)
        if self._process.is_alive():
            self._process.terminate()
            self._process.join(2)
            if self._process.is_alive():
                self._process.kill()
        self._process.join()
        self._receive.close()

    def __enter__(self) -> "Child":
        return self

    def __exit__(self, kind, error, traceback) -> None:
        self.stop(grace=5.0 if kind is None else 0.0)   # done: let it exit by itself
