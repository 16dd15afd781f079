"""The verification handshake (:class:`xnnfold.probe.verified.Verification`) on fabricated
answers: which answer is checked when, against the whole program or a partition's tags. The
real probes and lowerings are in tests/test_probe.py."""

from types import SimpleNamespace

import pytest

from xnnfold.steps.fold.probe.verified import Verification, VerifiedProbe


class Answer:
    """A fast answer about ``program`` that records how it was checked."""

    def __init__(self, program, log: list):
        self.program, self.log = program, log

    def now(self):
        self.log.append(("whole program", self.program))

    def against(self, tagged, skip):
        self.log.append(("partition", self.program, tagged, skip))


def fold(verification, log, programs, result=None, fails=False):
    """A fold that asks the probe once per program and returns ``result`` (default: the last
    program asked about)."""
    verification.fold_starts()
    for program in programs:
        verification.check_now()           # what the probe does before each answer
        verification.answered(Answer(program, log))
    if fails:
        verification.fold_failed()
    else:
        verification.fold_done(programs[-1] if result is None else result)


def rows(*runtime_weight_gemms):
    return SimpleNamespace(operands=[SimpleNamespace(gemm=g, runtime_weight=True)
                                     for g in runtime_weight_gemms] +
                           [SimpleNamespace(gemm="other", runtime_weight=False)])


def test_a_fold_alone_checks_every_answer_against_the_whole_program():
    log, verification = [], Verification()
    fold(verification, log, ["round 1", "round 2"])
    assert log == [("whole program", "round 1"), ("whole program", "round 2")]
    verification.partitioned("tagged", rows())      # nothing was left for it
    assert len(log) == 2


def test_the_last_answer_is_left_for_the_partition_that_follows():
    log, verification = [], Verification(partition_follows=True)
    fold(verification, log, ["round 1", "round 2"])
    assert log == [("whole program", "round 1")]
    verification.partitioned("tagged", rows("linear_3"))
    assert log[1:] == [("partition", "round 2", "tagged", {"linear_3"})]


def test_an_answer_about_another_program_than_the_result_is_checked_at_once():
    """The last round declined everything: the fold returns the program it started from."""
    log, verification = [], Verification(partition_follows=True)
    fold(verification, log, ["round 1"], result="the input")
    assert log == [("whole program", "round 1")]


def test_of_several_folds_before_a_partition_only_the_first_hands_over():
    log, verification = [], Verification(partition_follows=True)
    fold(verification, log, ["method a"])
    assert log == []
    fold(verification, log, ["method b"])       # a's answer: no partition came, checked now
    assert log == [("whole program", "method a"), ("whole program", "method b")]
    verification.partitioned("tagged", rows())
    fold(verification, log, ["method c"])       # a partition came between: c hands over
    assert len(log) == 2
    verification.partitioned("tagged c", rows())
    assert log[2:] == [("partition", "method c", "tagged c", set())]


def test_a_failed_fold_leaves_nothing_to_check():
    log, verification = [], Verification(partition_follows=True)
    fold(verification, log, ["round 1", "round 2"], fails=True)
    assert log == [("whole program", "round 1")]
    verification.partitioned("tagged", rows())
    fold(verification, log, ["next"], result="other")
    assert log == [("whole program", "round 1"), ("whole program", "next")]


def test_the_probe_checks_the_answer_before_and_reports_its_own():
    log, verification = [], Verification()
    probe = VerifiedProbe(partitioner=None, verify=True, verification=verification)
    probe.fast = lambda program, constants: {"taken"}
    verification.answered(Answer("earlier", log))
    assert probe("program", []) == {"taken"}
    assert log == [("whole program", "earlier")]
    assert verification._pending.program == "program" and verification._pending.answer == {"taken"}


@pytest.mark.parametrize("verify", [False, True])
def test_the_probe_reports_only_when_verifying(verify):
    verification = Verification()
    probe = VerifiedProbe(partitioner=None, verify=verify, verification=verification)
    probe.fast = lambda program, constants: set()
    probe("program", [])
    assert (verification._pending is not None) == verify


def test_a_copy_of_the_partitioner_does_not_settle_its_verification():
    """The whole-program probe partitions with a shallow copy of the partitioner, in the middle
    of a fold: its partition() must leave the original's handed-over answer alone."""
    import copy

    from xnnfold import XnnpackPartitioner

    partitioner = XnnpackPartitioner()
    log = []
    fold(partitioner.verification, log, ["program"])
    copied = copy.copy(partitioner)
    assert copied.verification is not partitioner.verification
    assert copied.fold is partitioner.fold and copied.__class__ is XnnpackPartitioner
    copied.verification.partitioned("the probe's program", rows())
    partitioner.verification.partitioned("tagged", rows())
    assert log == [("partition", "program", "tagged", set())]
