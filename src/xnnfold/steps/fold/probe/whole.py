"""Probe: which constants would the XNNPACK partitioner take, in the real lowering pipeline?

Whether XNNPACK takes a GEMM depends on much more than its weight: dtype, precision mode,
dynamic shapes, rank, conv kind, quantization pattern, and whether ``linear`` survives
decomposition. Rather than re-implement those checks, :func:`delegated_placeholders` runs a
program through ``to_edge_transform_and_lower`` with a *stock* partitioner built with the
user's own arguments, reads the ``delegation_tag`` of every placeholder once partitioning is
done, and aborts there: no backend preprocess, no serialization.

The fold asks it about the small probe program of :mod:`probe.fast`; asked about the
whole folded program, it is the verification mode of :mod:`probe.verified`.
"""

from __future__ import annotations

import copy

from executorch.exir.backend.partitioner import Partitioner
from executorch.exir import to_edge_transform_and_lower
from torch.export import ExportedProgram


class _ProbeFinished(Exception):
    """Carries the tagged placeholder names out of the pipeline, and stops it."""

    def __init__(self, tagged: set):
        super().__init__("xnnfold probe finished")
        self.tagged = tagged


def tagged_keys(program: ExportedProgram) -> set:
    """State keys of the placeholders of a partitioned ``program`` that carry a delegation tag.

    Placeholders get renamed on the way (a lifted constant gains a "c_" prefix); the
    state_dict / constants key they stand for does not change.
    """
    keys = {s.arg.name: s.target for s in program.graph_signature.input_specs
            if s.target is not None}
    return {keys[n.name] for n in program.graph.nodes
            if n.op == "placeholder" and "delegation_tag" in n.meta and n.name in keys}


def _probe_class(base: type) -> type:
    class _Probe(base):
        checks_dim_orders = False   # xnnfold's partition(): the real lowering's checks them

        def partition(self, exported_program):
            result = super().partition(exported_program)
            raise _ProbeFinished(tagged_keys(result.tagged_exported_program))

        def transform_for_pre_decomposition(self, exported_program):
            return exported_program   # the probe must not fold again

    _Probe.__name__ = f"Probe{base.__name__}"
    return _Probe


def delegated_placeholders(program: ExportedProgram, partitioner: Partitioner) -> set:
    """State keys of the params and constants of ``program`` that ``partitioner`` delegates.

    ``partitioner`` is not changed: the probe is a shallow copy of it (same configs, same
    precision settings) whose class stops the pipeline after partitioning.
    """
    probe = copy.copy(partitioner)
    probe.__class__ = _probe_class(type(partitioner))
    try:
        to_edge_transform_and_lower(program, partitioner=[probe])
    except _ProbeFinished as finished:
        return finished.tagged
    return set()   # the partitioner was never asked: nothing is delegated
