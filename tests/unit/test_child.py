"""xnnfold.pte.child: a function in a process of its own, as the report's lowerings and
``lower --check`` run; what a pool got wrong (a dead worker's lost task, a tensor sent as
shared memory that is gone, an earlier command's stderr)."""

import os
import sys
import time

import pytest
import torch

from xnnfold.pte.child import Child, ChildDied
from xnnfold.pte.quiet import StderrFilter


def _abort(send):
    os.abort()


def _raise(send):
    raise ValueError("the child's own error")


def _tensors(send):
    send([torch.arange(6.0).reshape(2, 3)])


def _sleep(send):
    time.sleep(60)


def _write(send, text):
    print(text, file=sys.stderr, flush=True)
    send(None)


def test_a_child_that_dies_is_named_not_waited_for():
    with Child(_abort, preload=["torch"]) as child:
        with pytest.raises(ChildDied, match="its process was killed by SIGABRT"):
            child.receive()


def test_a_child_that_does_not_answer_in_time_is_stopped():
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="no answer in 1 s"):
        with Child(_sleep, preload=["torch"]) as child:
            child.receive(timeout=1)
    assert not child._process.is_alive() and time.monotonic() - start < 30


def test_a_childs_exception_comes_back_as_it_is():
    with Child(_raise, preload=["torch"]) as child:
        with pytest.raises(ValueError, match="the child's own error"):
            child.receive()


def test_tensors_come_back_by_value():
    with Child(_tensors, preload=["torch"]) as child:
        (tensor,) = child.receive()
    assert torch.equal(tensor, torch.arange(6.0).reshape(2, 3))


def test_a_child_writes_to_the_stderr_of_its_parent_now(capfd):
    """A child forked from a server started under an earlier filter writes to the parent's
    fd 2 of now, not to that filter's closed pipe."""
    first = StderrFilter()
    try:
        with Child(_write, "under the first filter", preload=["torch"]) as child:
            child.receive()
    finally:
        first.close()
    with Child(_write, "after it", preload=["torch"]) as child:
        child.receive()
    assert "after it" in capfd.readouterr().err
