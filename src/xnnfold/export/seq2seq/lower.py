""":mod:`.export`'s two programs lowered into one .pte, and the tied output head's table stored
once, in a .ptd beside it.

A tied head (Whisper's ``proj_out``, BART's ``lm_head``) reads the token embedding table that
the decoder's lookup reads too. Stock stores it twice (the lookup's constant on portable, the
head's in the delegate: whisper-tiny's .pte 230.6 MB for 151 MB of weights); as a run-time
weight of the head (``prefer="size"``) it is stored once but read three times per token (the
table, then XNNPACK packs it anew, then the product reads the packed copy; or, swapped, a
product that computes 16 columns for one). Here both readers take it from one buffer of a
.ptd, and so does a text encoder's token lookup (BART's, T5's), which reads the same table:
the table is marked for it before partitioning (XNNPACK's serializer puts a constant whose
node carries ``meta["custom"]["delegate_constant_tag"]`` in that external file, under the hash
of its bytes; emission puts the lookup's constant there under ``external_constants``), and
executorch's named data store keeps one buffer for identical bytes. At load, XNNPACK packs
the head from it once, as it packs any constant; the lookup reads its row from it. The runner
passes the .ptd with the .pte (``whisper_runner --data_path``, ``Module(pte, ptd)``); a runner
that does not fails to load the method, loudly.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Optional

TABLE_TAG = "tied_table"
# executorch names its output heads and lookups variously; what marks the tied table is that
# an embedding lookup and a GEMM both read it
_GEMM_READERS = ("linear", "mm", "addmm", "permute", "t_copy", "executorch_call_delegate")


def tied_tables(graph_module) -> list:
    """Placeholders read by an embedding lookup and by a GEMM (a tied output head), and those
    the pass's ``tied_table`` step made of such a table (the lookup's and the head's)."""
    from ...steps.tied_table import tied_table_of

    found = []
    for node in graph_module.graph.nodes:
        if node.op != "placeholder":
            continue
        if tied_table_of(node) is not None:
            found.append(node)
            continue
        readers = [str(getattr(user.target, "__name__", user.target)) for user in node.users]
        if any("embedding" in r for r in readers) and \
                any(g in r for r in readers for g in _GEMM_READERS if "embedding" not in r):
            found.append(node)
    return found


def mark_tied_tables(graph_module, lookups: frozenset = frozenset()):
    """An edge transform pass: the tied tables marked for the .ptd, and the placeholders named
    in ``lookups`` that an embedding lookup reads (:func:`lookups_of_tied_tables`)."""
    from executorch.exir.pass_base import PassResult

    found = tied_tables(graph_module) + [
        node for node in graph_module.graph.nodes if node.op == "placeholder" and
        node.name in lookups and any("embedding" in _name(user) for user in node.users)]
    for node in found:
        node.meta.setdefault("custom", {})["delegate_constant_tag"] = TABLE_TAG
    return PassResult(graph_module, bool(found))


def _name(node) -> str:
    return str(getattr(node.target, "__name__", node.target))


def _tensor_of(program, name: str):
    """The parameter or constant a placeholder of ``program`` (an ExportedProgram) holds."""
    signature = program.graph_signature
    if name in signature.inputs_to_parameters:
        return program.state_dict.get(signature.inputs_to_parameters[name])
    if name in signature.inputs_to_lifted_tensor_constants:
        return program.constants.get(signature.inputs_to_lifted_tensor_constants[name])
    return None


def lookups_of_tied_tables(programs: dict) -> frozenset:
    """Placeholders of any method that hold a tied table's tensor and that an embedding lookup
    alone reads: a text encoder's token lookup (BART's, T5's), whose table is the decoder's tied
    head. Marked too, they read the same buffer of the .ptd (the named data store keeps one
    per content) instead of a copy of the table in the .pte."""
    tables = set()
    for program in programs.values():
        for node in tied_tables(program.graph_module):
            tensor = _tensor_of(program, node.name)
            if tensor is not None:
                tables.add(tensor.untyped_storage().data_ptr())
    found = set()
    for program in programs.values():
        for node in program.graph_module.graph.nodes:
            if node.op != "placeholder" or not any("embedding" in _name(u) for u in node.users):
                continue
            tensor = _tensor_of(program, node.name)
            if tensor is not None and tensor.untyped_storage().data_ptr() in tables:
                found.add(node.name)
    return frozenset(found)


def _to_ptd(node) -> Optional[str]:
    """Emission's ``external_constants``: the marked tables to the .ptd, the rest in the .pte."""
    return TABLE_TAG if node.meta.get("custom", {}).get("delegate_constant_tag") == TABLE_TAG \
        else None


def emit_config(table_to_ptd: bool = True):
    """The encoder's output is the decoder's input at every step: the decoder takes it where
    it is (``alloc_graph_input=False``: not copied into the decoder's planned memory, 18 MB
    per token at whisper-tiny's dims); the self-attention cache updated in place
    (``run_reinplace_pass``: the rows of the step, not a copy of the cache)."""
    from executorch.exir import ExecutorchBackendConfig
    from executorch.exir.passes import MemoryPlanningPass

    from ..written_inputs import backend_config

    # backend_config: the reinplace pass, then what reads an index_put_'s result reads the
    # tensor it wrote (executorch 1.5.1's planner does not count the result as a reader)
    return backend_config(ExecutorchBackendConfig(
        memory_planning_pass=MemoryPlanningPass(alloc_graph_input=False),
        emit_mutable_buffer_names=True,
        external_constants=_to_ptd if table_to_ptd else False))


@dataclass
class LoweredSeq2Seq:
    """The .pte, its .ptd (None when nothing went there), each method's partitioner (xnnfold's
    holds its ``last_result``) and what ``before_emit`` returned."""

    pte: bytes
    ptd: Optional[bytes]
    seconds: float
    partitioners: dict = field(default_factory=dict)
    inspected: object = None


def lower_seq2seq(programs, partitioner_class=None, partitioner_kwargs: Optional[dict] = None,
                  table_to_ptd: bool = True, before_emit=None) -> LoweredSeq2Seq:
    """Both methods lowered in one ``to_edge_transform_and_lower`` (a partitioner each; by
    default xnnfold's), the tied table in the .ptd unless ``table_to_ptd`` is False.
    ``before_emit(edge)`` may read the lowered programs before emission."""
    from executorch.exir import to_edge_transform_and_lower

    if partitioner_class is None:
        from ...partitioner import XnnpackPartitioner as partitioner_class
    partitioners = {name: partitioner_class(**(partitioner_kwargs or {}))
                    for name in programs.programs}
    start = time.perf_counter()
    edge = to_edge_transform_and_lower(
        dict(programs.programs), partitioner={n: [p] for n, p in partitioners.items()},
        transform_passes=[functools.partial(mark_tied_tables, lookups=lookups_of_tied_tables(
            programs.programs))] if table_to_ptd else [],
        constant_methods=dict(programs.metadata))
    inspected = before_emit(edge) if before_emit is not None else None
    program = edge.to_executorch(emit_config(table_to_ptd))
    pte = program.buffer
    return LoweredSeq2Seq(pte, _data_file(program, TABLE_TAG), time.perf_counter() - start,
                          partitioners, inspected)


def _data_file(program, tag: str) -> Optional[bytes]:
    """The bytes of the .ptd emission wrote for ``tag``, or None (through the manager's public
    writer: its in-memory form is private)."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as folder:
        try:
            program.write_tensor_data_to_file(folder)
        except AssertionError:            # no data file at all
            return None
        path = Path(folder) / f"{tag}.ptd"
        return path.read_bytes() if path.is_file() else None
