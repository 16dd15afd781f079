"""Runtime-weight delegation, per GEMM: a linear whose weight cannot be a constant.

Some fp32 linears cannot get a plain constant weight: the fold was declined (folding would
store more than it frees, as for a tied embedding used transposed as the output head), or the
weight is computed from an input. Stock leaves them on portable. executorch 1.5.1 has a config
path for exactly this: with ``force_non_static_weights_for_f32_linear`` the GEMM configs take a
linear with its weight (and bias) as run-time inputs of the delegate, which XNNPACK packs on
every call. The flag does it for *every* fp32 linear, repacking weights that could have been
packed once; here the same path is opened for the marked GEMMs only.

A GEMM is marked through ``node.meta["custom"]``, which ``run_decompositions`` and ``to_edge``
carry to the nodes the GEMM becomes, so the partitioner's configs recognise it in the Edge
program. The step opens the path for xnnfold's partitioner (``open``): configs built per
partitioner instance from its own; executorch itself is not patched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.fx

from ...analysis import is_dequantize, is_metadata_assertion
from ...analysis.identity import removed_by_decomposition
from ...decision import Rule, Status
from ...graph.node_meta import tensor_val
from ..protocol import Context, Opening, Outcome
from .config import MARK, is_marked, runtime_weight_configs  # noqa: F401 - the step's API
from .swap import static_shape, swap_if_smaller

aten = torch.ops.aten

# Declines after which the weight is still computed on every call: as a delegate input it
# costs a repack instead of a portable GEMM. ("delegated": XNNPACK declines the GEMM itself.)
_RUNTIME_RULES = (Rule.STATIC, Rule.SIZE, Rule.WHOLE_GROUP, Rule.EXACT)


def _needs_runtime_weight(gemm: torch.fx.Node, rows: list,
                          user_inputs: frozenset = frozenset()) -> Optional[str]:
    """Why ``gemm`` should take its weight at run time, or None. ``user_inputs``: the names of
    the program's user-input placeholders."""
    if gemm.target is not torch.ops.aten.linear.default or len(gemm.args) < 2:
        return None
    x, weight = gemm.args[0], gemm.args[1]
    if _declined_quantized(gemm, rows, user_inputs):
        return ("XNNPACK declines it as a quantized GEMM with constant operands; stock's "
                "flag path takes it as fp32 with the dequantized weight at run time")
    if not (_fp32(weight) and _fp32(x)) or len(static_shape(weight) or ()) != 2:
        return None
    declined = [r for r in rows if r.status == Status.DECLINED and r.rule in _RUNTIME_RULES]
    if declined:
        return f"its {declined[0].role} is declined by rule '{declined[0].rule}'"
    tied = tied_param(weight)
    if tied is not None:
        # A param also read by a non-GEMM op (a tied embedding's lookup): as a delegate
        # constant it is stored twice, once in the delegate and once for that op. Stock does
        # that for a plain ``nn.Linear`` head tied to its embedding (GPT-2, T5, BART: a
        # quarter of the .pte); stock's flag does not, but repacks every weight.
        return f"{tied[0].name} is also read by {tied[1].name}"
    return None


def _declined_quantized(gemm: torch.fx.Node, rows: list, user_inputs: frozenset) -> bool:
    """A dequantized-weight GEMM that XNNPACK declines as quantized: the probe found it
    declines the GEMM with its folded constants, or its activation is itself a constant (a
    learned query under dynamic int8: XNNPACK takes no quantized GEMM with a static
    activation). Decomposed, it is an fp32 ``addmm`` of the dequantized weight, which the
    run-time weight path takes. (Marking one XNNPACK does take as quantized changes nothing:
    the path opens only for GEMMs the partitioner sees as fp32.)"""
    weight, out = gemm.args[1], tensor_val(gemm)
    if not (is_dequantize(weight) and out is not None and out.dtype == torch.float32):
        return False
    return any(r.delegated is False for r in rows) or \
        not _reads_user_input(gemm.args[0], user_inputs)


def _reads_user_input(node: torch.fx.Node, user_inputs: frozenset) -> bool:
    seen, todo = set(), [node]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        if current.op == "placeholder" and current.name in user_inputs:
            return True
        todo += current.all_input_nodes
    return False


def tied_param(weight: torch.fx.Node) -> Optional[tuple]:
    """(the param, a non-GEMM op that also reads it) when ``weight`` is a param, behind no-op
    casts at most, that something other than a linear's weight reads; else None."""
    # The param behind no-op casts (``W.to(x.dtype)``), which decomposition removes: a reader
    # of any of them reads the param.
    chain = removed_by_decomposition(weight) or []
    param = chain[0].args[0] if chain else weight
    values = [param, *chain]
    others = [u for v in values for u in v.users if u not in chain and
              not is_metadata_assertion(u) and (u.target is not aten.linear.default or
                                                len(u.args) < 2 or u.args[1] not in values)]
    return (param, others[0]) if param.op == "placeholder" and others else None


def _fp32(node) -> bool:
    """An fp32 tensor that is not a dequantize's output (quantized GEMMs keep their path)."""
    val = tensor_val(node)
    return val is not None and val.dtype == torch.float32 and not is_dequantize(node)


@dataclass(frozen=True)
class RuntimeWeight:
    """One linear marked to be delegated with its weight as a run-time input, and why."""

    gemm: str
    why: str
    rewritten = True

    def describe(self) -> str:
        return f"runtime_weight step: {self.gemm} delegated with a run-time weight: {self.why}"


def mark_runtime_weights(program, operands: list, transposed: set, prefer: str = "speed"
                         ) -> list:
    """Mark, in place, the GEMMs of ``program`` (the pass's own copy) to delegate with a
    run-time weight; their rows of ``operands`` say so. ``transposed``: the GEMMs the canonical
    step rewrote from a transposed form (stock leaves those on portable). Returns a
    :class:`RuntimeWeight` for each GEMM marked.

    A tied head that stock delegates with a constant copy of its table (a linear that reads the
    param itself, not one rewritten from a transposed form that stock leaves on portable) is a
    trade: the run-time weight stores the table once but is repacked on every call. It is
    marked only with ``prefer="size"``; either way its rows give the bytes at stake.
    """
    by_gemm: dict = {}
    for row in operands:
        by_gemm.setdefault(row.gemm, []).append(row)
    nodes = {n.name: n for n in program.graph.nodes}
    marked = {}
    user_inputs = frozenset(program.graph_signature.user_inputs)
    for name, rows in by_gemm.items():
        if name not in nodes or \
                (why := _needs_runtime_weight(nodes[name], rows, user_inputs)) is None:
            continue
        table = _stock_copies(nodes[name], rows, transposed)
        if table is not None:
            _note_trade(rows, table, marked=prefer == "size")
            if prefer != "size":
                continue
        marked[name] = why
    if not marked:
        return []
    graph = program.graph
    for name, why in marked.items():
        node = nodes[name]
        # a new dict: a copied program shares its nodes' meta values with the caller's
        node.meta["custom"] = {**node.meta.get("custom", {}), MARK: True}
        quantized = any(is_dequantize(a) for a in node.args[:2])   # the flag's form, as is
        if not quantized and swap_if_smaller(graph, node):
            why += "; operands swapped, so that the activation is packed and the weight read"
            marked[name] = why
        for row in by_gemm[name]:
            row.runtime_weight = True
            if row.delegated is False:   # the probe's answer was about a constant operand
                row.reason = (f"XNNPACK does not take {name} with constant operands; its part "
                              "is folded with the rest of its group, which frees the packed "
                              "param")
            row.reason = f"{row.reason + '; ' if row.reason else ''}delegated with a runtime " \
                         f"weight: {why}"
    return [RuntimeWeight(name, why) for name, why in marked.items()]


class RuntimeWeightStep:
    name = "runtime_weight"

    def open(self, partitioner) -> Opening:
        """The partitioner's GEMM configs that take the marked GEMMs; where they cannot be
        built (said in a warning), the step is left out: a GEMM marked for a path not open
        would stay where stock leaves it."""
        configs = runtime_weight_configs(partitioner)
        return Opening(self, configs) if configs is not None else Opening(None)

    def run(self, program, context: Context) -> Outcome:
        transposed = {r.gemm for r in context.records.get("canonical", [])}
        return Outcome(mark_runtime_weights(program, context.operands, transposed,
                                            context.rules.prefer))


STEP = RuntimeWeightStep()


def _stock_copies(gemm: torch.fx.Node, rows: list, transposed: set) -> Optional[int]:
    """The bytes of the table stock stores a second time for ``gemm``, a tied head it
    delegates with a constant copy; None if stock does not (a transposed form it leaves on
    portable, or a weight declined by a rule)."""
    if gemm.name in transposed or any(r.status == Status.DECLINED for r in rows):
        return None
    tied = tied_param(gemm.args[1])
    val = tensor_val(tied[0]) if tied is not None else None
    return val.numel() * val.element_size() if val is not None else None


def _note_trade(rows: list, table_bytes: int, marked: bool) -> None:
    for row in rows:
        if row.role != "weight":
            continue
        row.size_option_bytes = table_bytes
        option = ("prefer='size': run-time weight, stored once (-{:,} bytes against stock's "
                  "constant copy), repacked on every call").format(table_bytes)
        kept = ("prefer='speed' (default): as stock, a constant copy of the tied table "
                "(+{:,} bytes, packed once)").format(table_bytes)
        trade = f"{option}; chosen" if marked else f"{kept}; chosen. Option {option}"
        row.reason = f"{row.reason + '; ' if row.reason else ''}{trade}"
