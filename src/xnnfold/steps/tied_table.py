"""A tied head's table read from a placeholder of its own, so that the lowering does not copy it.

A linear head tied to its embedding (Llama-3.2, Qwen2.5, SmolLM2, Gemma, GPT-2, T5) reads the
table's parameter, which the embedding's lookup reads too. With ``prefer="speed"`` (the
default) the head is delegated as stock delegates it, with the table as a constant of the
delegate; the lookup stays outside. executorch's ``to_backend`` then duplicates the shared
placeholder for the delegate with ``copy.deepcopy`` of the tensor
(``_maybe_duplicate_constant_nodes``): one more copy of the table in memory while the program
lowers, 1.05 GB at Llama-3.2-1B's dims, held by the program until it is emitted.

This step gives the head (the linears that read the table as their weight and that the
run-time weight step left as constants) a placeholder of its own, bound to the same tensor
under the name the head's module knows it by (``lm_head.weight``, which the program's state
dict already holds for a tied model). Nothing is copied; the lowering finds no shared
placeholder. The .pte is the same: the delegate serializes the table as before, and the
program's constant for the lookup is the same bytes (executorch's emitter and XNNPACK's
serialization both store a tensor's bytes once, by their hash, so a head left outside
delegates stores nothing more either). Where the lookup feeds the head's own partition (a
small model), stock cuts the delegate around the shared placeholder; read from its own, the
head joins the delegate before it: one delegate call fewer, the .pte no larger.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.fx
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, InputSpec, TensorArgument

from ..analysis import is_metadata_assertion
from ..analysis.identity import removed_by_decomposition
from ..graph.node_meta import tensor_val
from . import runtime_weight
from .protocol import Context, Outcome


# ``node.meta["custom"]`` of both placeholders (the table's and the heads'): the table's
# placeholder name. It lasts through decomposition and to_edge, so that what looks for a tied
# table (a placeholder read by a lookup and by a GEMM) after this step still finds it in two.
MARK = "xnnfold_tied_table"


def tied_table_of(node: torch.fx.Node) -> Optional[str]:
    """The tied table's placeholder name if ``node`` is one of the placeholders this step made
    of it, else None."""
    return (node.meta.get("custom") or {}).get(MARK)


@dataclass(frozen=True)
class SharedTable:
    """The table ``param`` (``nbytes``), read by ``gemms`` from ``placeholder`` (the same
    tensor, state key ``target``) or left shared (``reason``)."""

    param: str
    gemms: tuple
    placeholder: str
    target: str
    nbytes: int
    rewritten: bool
    reason: str = ""

    def describe(self) -> str:
        gemms = ", ".join(self.gemms)
        if not self.rewritten:
            return f"tied_table step: {self.param} left shared with {gemms}: {self.reason}"
        return (f"tied_table step: {gemms} read the tied table {self.param} ({self.nbytes:,} "
                f"bytes) from {self.placeholder} ({self.target}), the same tensor, so that the "
                "lowering does not copy it for the delegate; the .pte stores it as before")


def _param_spec(program: ExportedProgram, node: torch.fx.Node):
    for index, spec in enumerate(program.graph_signature.input_specs):
        if spec.arg.name == node.name:
            return index, spec
    return None, None


def _head_target(program: ExportedProgram, spec: InputSpec, gemms: list) -> str:
    """The state key the heads' module knows the table by, if the state dict holds one for the
    same tensor that no input of the program names (a tied model's ``lm_head.weight``); else a
    new key beside the table's."""
    tensor = program.state_dict[spec.target]
    named = {s.target for s in program.graph_signature.input_specs}
    aliases = [key for key, value in program.state_dict.items()
               if value is tensor and key not in named]
    for gemm in gemms:
        stack = gemm.meta.get("nn_module_stack") or {}
        module = next(reversed(stack.values()))[0] if stack else None
        if module and f"{module}.weight" in aliases:
            return f"{module}.weight"
    if aliases:
        return aliases[0]
    key = f"{spec.target}_head"     # an attribute beside the table's, for unlifting
    while key in program.state_dict:
        key += "_"
    return key


def split_tied_tables(program: ExportedProgram, operands: list) -> list:
    """In place on the pass's copy: each tied table that stock delegates a head with as a
    constant gets a placeholder of its own for those heads. A :class:`SharedTable` each.
    Those heads are the rows the run-time weight step priced (``size_option_bytes``: stock
    stores the table again for them) and left as constants (``prefer="speed"``)."""
    nodes = {node.name: node for node in program.graph.nodes}
    heads: dict = {}                      # the table's placeholder -> its heads
    for row in operands:
        gemm = nodes.get(row.gemm)
        if row.role != "weight" or row.size_option_bytes is None or row.runtime_weight or \
                gemm is None:
            continue
        tied = runtime_weight.tied_param(gemm.args[1])
        if tied is not None:
            heads.setdefault(tied[0], []).append(gemm)
    return [_split(program, param, gemms) for param, gemms in heads.items()]


def _split(program: ExportedProgram, param: torch.fx.Node, gemms: list) -> SharedTable:
    names = tuple(gemm.name for gemm in gemms)
    val = tensor_val(param)
    nbytes = val.numel() * val.element_size() if val is not None else 0
    index, spec = _param_spec(program, param)
    if spec is None or spec.kind is not InputKind.PARAMETER or \
            spec.target not in program.state_dict:
        return SharedTable(param.name, names, "", "", nbytes, False,
                           "not a parameter of the program's state dict")
    # what reads the table for each head: the head itself, or the first of the no-op casts
    # (``W.to(x.dtype)``) between them, which decomposition removes
    readers = []
    for gemm in gemms:
        weight = gemm.args[1]
        chain = [] if weight is param else (removed_by_decomposition(weight) or [])
        if any(user not in chain and user not in gemms and not is_metadata_assertion(user)
               for link in chain for user in link.users):
            # a cast some other op reads too: not the heads' alone; executorch copies the
            # table for the delegate, as it does for stock
            return SharedTable(param.name, names, "", "", nbytes, False,
                               "a cast of it is read by more than the heads")
        readers.append(chain[0] if chain else gemm)
    target = _head_target(program, spec, gemms)
    with program.graph.inserting_after(param):
        placeholder = program.graph.placeholder("p_" + target.replace(".", "_"))
    placeholder.target = placeholder.name     # the name fx made unique is the argument's
    placeholder.meta.update(param.meta)
    for node in (param, placeholder):      # new dicts: a copied program shares its meta values
        node.meta["custom"] = {**(node.meta.get("custom") or {}), MARK: param.name}
    for reader in readers:
        reader.replace_input_with(param, placeholder)
    specs = list(program.graph_signature.input_specs)
    specs.insert(index + 1, InputSpec(InputKind.PARAMETER, TensorArgument(placeholder.name),
                                      target, spec.persistent))
    program.graph_signature.input_specs = specs
    program.state_dict[target] = program.state_dict[spec.target]
    return SharedTable(param.name, names, placeholder.name, target, nbytes, True)


class TiedTableStep:
    name = "tied_table"

    def run(self, program: ExportedProgram, context: Context) -> Outcome:
        return Outcome(split_tied_tables(program, context.operands))


STEP = TiedTableStep()
