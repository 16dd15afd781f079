"""The fast probe: XNNPACK's verdict on each folded constant, from one small program.

The whole-program probe (:func:`probe.whole.delegated_placeholders`) decomposes the whole
candidate program a second time. Here each GEMM that reads a folded constant is cut out with
what the decision depends on (:mod:`probe.cut`), equal cuts are asked once, and the
distinct ones, side by side in one program exported afresh (its own ShapeEnv: nothing is left
in the caller's), go through the same ``to_edge_transform_and_lower`` with the same stock
partitioner up to ``partition()``. The verdicts are cached by signature for the rest of the
fold (the probe rounds and the projection-split retries ask about the same GEMMs again).

Most GEMMs need not even be lowered: ``to_edge_transform_and_lower`` keeps an ``aten.linear``
whole only where the partitioner's ``ops_to_not_decompose`` filter (its LinearConfig's own
``check_constraints``) accepts it, on the undecomposed program, and partitions it with that
config's ``get_partition`` (node and deps); ``addmm``, ``mm`` and ``convolution`` are left as
they are by decomposition (the probe program writes ``conv1d`` / ``conv2d`` as the
``convolution`` they decompose into). For those, the probe asks the same config methods on the
exported probe program and reads the deps. Only the other GEMMs (a linear the filter declines,
which may still be taken as an ``addmm`` after decomposition; ``matmul``) make the probe program
go through the lowering, and then the lowering's tags answer for every context. The
verification mode checks both paths against the whole-program probe.
"""

from __future__ import annotations

import logging

import torch
import torch.fx
from executorch.exir.backend.partitioner import Partitioner
from torch.export import ExportedProgram

from ....analysis.gemms import gemm_spec
from .whole import delegated_placeholders
from .cut import PROBE_GEMM, cut_context, param_keys, signature
from .program import build_module

logger = logging.getLogger("xnnfold")


def consumer_gemms(program: ExportedProgram, constants: list) -> list:
    """The GEMM nodes reading the folded ``constants`` (directly or through their dequantize)."""
    nodes = {n.name: n for n in program.graph.nodes}
    gemms: dict = {}
    for constant in constants:
        for name in constant.consumers:
            node = nodes[name]
            if gemm_spec(node) is not None:
                gemms[node] = None
                continue
            for user in node.users:   # the dequantize kept in front of a quantized GEMM
                if gemm_spec(user) is not None:
                    gemms[user] = None
    return list(gemms)


class FastProbe:
    """A probe with a verdict cache; one per fold (signatures name program symbols)."""

    def __init__(self, partitioner: Partitioner):
        self._partitioner = partitioner
        self._verdicts: dict = {}          # signature -> indices of the externals tagged
        self.lowerings = 0                 # probe programs lowered (for tests and benches)
        self.exports = 0                   # probe programs built and exported

    def __call__(self, program: ExportedProgram, constants: list) -> set:
        keys = param_keys(program)
        folded = {keys[c.name] for c in constants if c.name in keys}
        ranges = dict(program.range_constraints)
        contexts = [(cut_context(g, keys), g) for g in consumer_gemms(program, constants)]
        signed = [(context, signature(context, ranges)) for context, _ in contexts]
        pending: dict = {}
        for context, sig in signed:
            if sig not in self._verdicts and sig not in pending:
                pending[sig] = context
        if pending:
            self._ask(list(pending.items()), ranges)
        taken = set()
        for context, sig in signed:
            for index in self._verdicts[sig]:
                key = context.externals[index].key
                if key in folded:
                    taken.add(key)
        return taken

    def _ask(self, pending: list, ranges: dict) -> None:
        probe = build_module([context for _, context in pending], ranges)
        exported = torch.export.export(probe.module, probe.inputs,
                                       dynamic_shapes=probe.dynamic_shapes, strict=False)
        self.exports += 1
        kept = self._decided_by_configs(exported, probe, [c for _, c in pending])
        if len(kept) < len(pending):
            self.lowerings += 1
            tagged = delegated_placeholders(exported, self._partitioner)
            kept = {index: set() for index in range(len(pending))}
            for buffer, (c_index, e_index) in probe.slots.items():
                if buffer in tagged:
                    kept[c_index].add(e_index)
        for index, (sig, _) in enumerate(pending):
            self._verdicts[sig] = kept[index]

    def _decided_by_configs(self, exported: ExportedProgram, probe, contexts: list) -> dict:
        """Context index -> externals in the deps, for each probe GEMM the partitioner's own
        config decides on the undecomposed probe: a linear its ``ops_to_not_decompose`` filter
        keeps whole, and the ops decomposition leaves as they are (``addmm``, ``mm``,
        ``convolution``, which the probe program writes conv1d/conv2d as)."""
        _, keeps_whole = self._partitioner.ops_to_not_decompose(exported)
        configs = getattr(self._partitioner, "target_partitioner_configs", {})
        buffers = {s.arg.name: s.target for s in exported.graph_signature.input_specs}
        decided = {}
        for node in exported.graph.nodes:
            index = node.meta.get("custom", {}).get(PROBE_GEMM)
            if index is None:
                continue
            name = _CONFIG_DECIDES.get(node.target)
            config = configs.get(name)
            if config is None:
                continue
            if node.target is torch.ops.aten.linear.default:
                # Declined here, it is decomposed and may still be taken as an addmm.
                if keeps_whole is None or not keeps_whole(node):
                    continue
            elif not config.check_constraints(node, exported):
                decided[index] = set()
                continue
            deps = {buffers.get(n.name) for n in config.get_partition(node, exported)
                    if n.op == "placeholder"}
            decided[index] = {probe.slots[b][1] for b in deps if b in probe.slots}
        return decided


# The GEMM ops whose config can be asked before decomposition, and that config's target.
_CONFIG_DECIDES = {
    torch.ops.aten.linear.default: "linear.default",
    torch.ops.aten.addmm.default: "addmm.default",
    torch.ops.aten.mm.default: "mm.default",
    torch.ops.aten.convolution.default: "convolution.default",
}
