"""The pass returns valid ExportedPrograms: the signature names what the graph returns.

An ExportedProgram's signature names each of its outputs (``output_specs``: user outputs,
mutated buffers) by the name of the node its graph's output node returns, position by
position. A step that replaces such a node (``replace_all_uses_with``, ``replace_input_with``)
changes the graph, not the signature. Lowering through the partitioner happens to tolerate the
stale name; ``program.validate()``, ``torch.export.save`` and every later ExportedProgram pass
(``to_edge`` + ``to_backend``, another backend) raise ``SpecViolationError``. So after each
step that rewrote, the pipeline tidies its program (:func:`tidy`: the dead nodes it left
removed, the module recompiled, :func:`sync_output_specs`, as executorch's
``constant_prop_pass`` does by hand: ``output_specs[i].arg = TensorArgument(name=...)``), and
checks it with :func:`check_valid`.
"""

from __future__ import annotations

import dataclasses

import torch.fx
from torch.export import ExportedProgram
from torch.export.graph_signature import (
    CustomObjArgument, SymBoolArgument, SymFloatArgument, SymIntArgument, TensorArgument,
    TokenArgument)

from ..errors import FoldError

# The arguments that name a node (a ConstantArgument holds its value instead)
_NAMED = (TensorArgument, SymIntArgument, SymFloatArgument, SymBoolArgument, CustomObjArgument,
          TokenArgument)


def sync_output_specs(program: ExportedProgram) -> None:
    """Make each output spec of ``program`` name the node its graph returns at that position
    (in place: ``program`` is the pass's own copy)."""
    returned = program.graph.output_node().args[0]
    specs = program.graph_signature.output_specs
    if len(returned) != len(specs):
        raise FoldError("<output>", f"the graph returns {len(returned)} values, the signature "
                                    f"names {len(specs)}")
    for spec, node in zip(specs, returned):
        if not isinstance(node, torch.fx.Node) or not isinstance(spec.arg, _NAMED) or \
                spec.arg.name == node.name:
            continue    # a constant output, or a spec that already names its node
        # a new argument: a copied program may still share its spec objects with the caller's
        spec.arg = dataclasses.replace(spec.arg, name=node.name)


def tidy(program: ExportedProgram, dead_before: frozenset = frozenset()) -> None:
    """What every step needs after rewriting ``program`` (the pass's own copy), done once by
    the pipeline: the nodes the step left dead removed, the graph linted, the module
    recompiled, the output specs synced.

    Dead code goes only if the step made it dead: a node nothing read before the step
    (``dead_before``: names) stays, as stock keeps it, and so does every impure node (fx's
    ``is_impure``: placeholders, asserts such as ``_assert_tensor_metadata``, ops that write
    in place, random draws)."""
    graph = program.graph
    # eliminate_dead_code lints the graph first (it needs a topological order)
    graph.eliminate_dead_code(is_impure_node=lambda n: n.name in dead_before or n.is_impure())
    program.graph_module.recompile()
    sync_output_specs(program)


def check_valid(program: ExportedProgram, step: str) -> None:
    """Raise a :class:`~xnnfold.errors.FoldError` naming ``step`` if ``program`` (what ``step``
    returned) fails torch's own checker (``ExportedProgram.validate``: the signature against
    the graph, the ops, the metadata), which ``torch.export.save`` and any later pass run."""
    try:
        program.validate()
    except Exception as error:  # noqa: BLE001 - the caller falls back to stock, naming the step
        raise FoldError("<program>", f"the {step} step returned an invalid program: "
                                     f"{type(error).__name__}: {error}") from error


class StepChecks:
    """:func:`check_valid` after each step of one run of the pass, if the input program passes
    the checker itself (a program torch's checker already rejects is not a step's doing: it
    is lowered without the checks, as it would be without xnnfold)."""

    def __init__(self, ep: ExportedProgram):
        try:
            ep.validate()
            self.enabled = True
        except Exception:  # noqa: BLE001 - the caller's program, not the pass's output
            self.enabled = False

    def __call__(self, program: ExportedProgram, step: str) -> None:
        if self.enabled:
            check_valid(program, step)
