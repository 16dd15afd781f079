"""What a step of the pass is, and what it is given and gives back.

A step is one module exposing one object (``STEP``) with a ``name`` and ``run(program,
context) -> Outcome``. It rewrites ``program`` — the pass's own copy, never the caller's — in
place, or returns a new program in its :class:`Outcome`; either way it returns one record per
site it looked at, each saying whether it rewrote (``rewritten``) and what it did or why not
(``describe()``). The pipeline (:mod:`xnnfold.pipeline`) runs the steps of a list in order,
checks the program after each (:mod:`xnnfold.graph.validity`), and keeps the records by step name
(:attr:`xnnfold.result.FoldResult.records`); ``explain`` prints them under the step's name. The
program returned is the caller's own when no record of any step rewrote: a step that changes
the program and says so is never thrown away, one that changes it silently is.

A step may also summarize its records in one line (``summary(records)``, optional: what the
.pte then needs, say).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Protocol, runtime_checkable

from torch.export import ExportedProgram

# (folded program, [FoldedConstant]) -> the state keys of the constants XNNPACK takes
Probe = Callable[[ExportedProgram, list], set]


@runtime_checkable
class Record(Protocol):
    """One site a step looked at."""

    @property
    def rewritten(self) -> bool: ...

    def describe(self) -> str: ...


@dataclass
class Context:
    """What the steps of one run share: the settings, and what earlier steps found.

    ``rules`` (:class:`~xnnfold.steps.fold.rules.RuleSet`) and ``probe`` (XNNPACK's verdict,
    None: every fold taken) drive the fold; ``llm_kernels`` lets the KV-cache step use
    executorch's LLM kernels. ``records``: each earlier step's records, by name. The fold step sets
    ``operands`` (the :class:`~xnnfold.result.GemmOperand` rows), ``constants``,
    ``freed_params`` and ``probe_rounds``; the run-time weight step reads and completes the
    rows. ``check(program, stage)``: torch's checker on an intermediate program of a step
    (the pipeline checks each step's result itself)."""

    rules: object
    probe: Optional[Probe] = None
    llm_kernels: bool = False
    records: dict = field(default_factory=dict)
    operands: list = field(default_factory=list)
    constants: list = field(default_factory=list)
    freed_params: list = field(default_factory=list)
    probe_rounds: int = 0
    check: Callable[[ExportedProgram, str], None] = lambda program, stage: None


@dataclass
class Outcome:
    """A step's records, and the program it made when it did not rewrite in place."""

    records: list
    program: Optional[ExportedProgram] = None


class Step(Protocol):
    name: str

    def run(self, program: ExportedProgram, context: Context) -> Outcome: ...
