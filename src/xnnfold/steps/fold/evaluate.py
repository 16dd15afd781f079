"""Evaluate the static cones of fold targets on the program's real tensors.

Each node is run once, with the same ATen op and arguments the program would run, so a folded
value is the value eager computes, bit for bit. Values are cached by node so that the parts of
one ``split`` share one evaluation.
"""

from __future__ import annotations

import torch
import torch.fx

from ...analysis import ProgramFacts, data_inputs
from ...analysis.identity import is_identity
from ...errors import at_node


class ConeEvaluator:
    def __init__(self, facts: ProgramFacts):
        self._facts = facts
        self._values = {node: value.detach() for node, value in facts.placeholder_values.items()}

    def value(self, node: torch.fx.Node):
        """The real value of a static node (evaluating its inputs first)."""
        if node in self._values:
            return self._values[node]
        pending = [node]
        while pending:  # iterative post-order: cones can be deep chains
            current = pending[-1]
            missing = [i for i in data_inputs(current) if i not in self._values]
            if missing:
                pending.extend(missing)
                continue
            pending.pop()
            if current not in self._values:
                self._values[current] = self._run(current)
        return self._values[node]

    def _run(self, node: torch.fx.Node):
        if len(node.all_input_nodes) > 1 and is_identity(node):
            return self._values[node.args[0]]   # its value is its first input's
        with at_node(node, "evaluating"), torch.no_grad():
            args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs),
                                                 lambda n: self._values[n])
            return node.target(*args, **kwargs)


def own_storage(value: torch.Tensor) -> torch.Tensor:
    """``value`` as a contiguous tensor whose storage holds exactly its bytes, from offset 0.

    A part of a ``split`` is a view into the packed param; XNNPACK serializes a constant's
    storage from its start, not from the view's offset, so a view would hand the delegate the
    wrong rows (the ``constant_prop_pass`` bug). A contiguous view is not copied: it gets a
    storage of its own that is a slice of its base's memory (``UntypedStorage`` slicing shares
    memory). So MHA's q/k/v parts cost no memory beside the packed param the caller's program
    still holds: a 16-layer E=1024 decoder stack folds 384 MiB of parts without a copy.
    """
    value = value.detach()
    if value.numel() == 0 or not value.is_contiguous():
        return value.clone(memory_format=torch.contiguous_format)
    storage = value.untyped_storage()
    start = value.storage_offset() * value.element_size()
    if start == 0 and storage.nbytes() == value.nbytes:
        return value
    part = storage[start:start + value.nbytes]
    return torch.empty(0, dtype=value.dtype).set_(part, 0, value.shape, value.stride())
