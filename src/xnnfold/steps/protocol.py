"""What a step of the pass is, and what it is given and gives back.

A step is one module exposing one object (``STEP``) with a ``name`` and ``run(program,
context) -> Outcome``. It rewrites ``program`` — the pass's own copy, never the caller's — in
place, or returns a new program in its :class:`Outcome`; either way it returns one record per
site it looked at, each saying whether it rewrote (``rewritten``) and what it did or why not
(``describe()``). The pipeline (:mod:`xnnfold.pipeline`) runs the steps of a list in order
and keeps the records by step name (:attr:`xnnfold.result.FoldResult.records`); ``explain``
prints them under the step's name.

The pipeline holds each step to its records by the graph: it compares a fingerprint of the
program before and after the step (:mod:`xnnfold.graph.fingerprint`: nodes, signature, state).
A change that no record reports (``rewritten``) is a failure of the pass naming the step: the
caller's program is lowered as stock lowers it, with one warning (in strict mode, it raises); a
record that says it rewrote where nothing changed is warned of (raised in strict mode). After a
step that rewrote, the pipeline does what every rewrite needs, once
(:func:`xnnfold.graph.validity.tidy`: the nodes the step left dead removed, the module
recompiled, the output specs naming the nodes returned), then checks the program with torch's
verifier. A step does none of that itself. The program returned is the caller's own when no
record of any step rewrote.

Optional, a step may:

- summarize its records in one line (``summary(records)``: what the .pte then needs, say);
- need its partitioner to take what it emits (``open(partitioner) -> Opening``): xnnfold's
  partitioner asks each step of its list once, when built, and uses the step and the configs
  the :class:`Opening` gives (a step that cannot open its path says so and gives the step to
  run without it, or none). The configs are new instances the step builds from the
  partitioner's own (:func:`xnnfold.steps.configs.extended`); the partitioner puts them in
  place of its own, and nothing else changes them.
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


@dataclass(frozen=True)
class Opening:
    """What a step needs of the partitioner it runs with: the step to run (itself, a variant
    that emits what the configs take, or None: leave it out) and the configs, by target name
    (``"linear.default"``), that the partitioner uses in place of its own."""

    step: Optional["Step"]
    configs: dict = field(default_factory=dict)


class Step(Protocol):
    name: str

    def run(self, program: ExportedProgram, context: Context) -> Outcome: ...
