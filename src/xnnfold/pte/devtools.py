"""executorch's own tools, read for the report and ``explain --all``.

- :func:`delegation` — ops delegated and not, by op type, from
  ``executorch.devtools.backend_debug.get_delegation_info`` (the table users and upstream
  tooling read), not counted by hand.
- :func:`operator_times` — where the time goes on the runtime: the wheel's runtime writes an
  ETDump (``enable_etdump=True``), read back with ``executorch.devtools.Inspector``; per
  portable operator (and custom op: ``llama::custom_sdpa.out``) and for XNNPACK delegate
  calls; :func:`operator_profile` with the calls of each in one run.
- :func:`why_not_delegated` — XNNPACK's own reason for each node its partitioner declines: its
  configs call ``WhyNoPartition(logger)(node, reason)``, which logs at DEBUG through each config
  module's logger; a handler collects those records during one partition.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import statistics
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from typing import Optional

import torch

DELEGATE = "XNNPACK delegate"


def delegation(graph_module: torch.fx.GraphModule) -> dict:
    """``{"delegated": n, "not_delegated": n, "not_delegated_by_op": {op type: n}}``."""
    from executorch.devtools.backend_debug import get_delegation_info

    info = get_delegation_info(graph_module)
    outside = {op: b.non_delegated for op, b in info.delegation_by_operator.items()
               if b.non_delegated}
    return {"delegated": info.num_delegated_nodes, "not_delegated": info.num_non_delegated_nodes,
            "not_delegated_by_op": dict(sorted(outside.items(), key=lambda kv: -kv[1]))}


def operator_times(pte: bytes, inputs: tuple, runs: int = 5, method: str = "forward",
                   data: Optional[bytes] = None) -> dict:
    """Milliseconds per run of ``method``, by portable operator and for XNNPACK delegate calls
    (median over ``runs`` runs after one warm-up), from an ETDump of the wheel's runtime.
    ``data``: the .ptd the .pte reads its external constants from."""
    profile = operator_profile(pte, inputs, runs, method, data)
    return {name: ms for name, (ms, _) in profile.items()}


def operator_profile(pte: bytes, inputs: tuple, runs: int = 5, method: str = "forward",
                     data: Optional[bytes] = None) -> dict:
    """``{part: (ms per run, calls per run)}``: :func:`operator_times` with how many times
    each part is called in one run (the XNNPACK delegate calls counted as one part)."""
    from executorch.devtools import Inspector
    from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

    buffers = pte, data               # the loaded module does not own its buffers
    from .runner import load_llm_kernels, verified_program

    verified_program(pte)
    load_llm_kernels(pte)
    module = _load_for_executorch_from_buffer(*buffers, enable_etdump=True)
    for _ in range(runs + 1):
        module.run_method(method, tuple(inputs))
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "run.etdp")
        module.write_etdump_result_to_file(path)
        inspector = Inspector(etdump_path=path)
    return parts(inspector.event_blocks)


def parts(event_blocks) -> dict:
    """``{part: (ms per run, calls per run)}``, largest first, from an Inspector's event
    blocks: each event of an ``Execute`` block is one call in every run (its ``perf_data.raw``
    one time per run, the first the warm-up's, left out of the median)."""
    totals: dict = defaultdict(float)
    calls: dict = defaultdict(int)
    for block in event_blocks:
        if block.name != "Execute":
            continue
        for event in block.events:
            if event.perf_data is None or event.is_delegated_op:
                continue            # events inside a delegate are within its DELEGATE_CALL
            name = _category(event.name)
            if name is not None:
                totals[name] += statistics.median(event.perf_data.raw[1:] or event.perf_data.raw)
                calls[name] += 1
    return {name: (totals[name], calls[name])
            for name in sorted(totals, key=lambda n: -totals[n])}


def _category(event_name: str):
    # The runtime logs each portable kernel as "native_call_<op>.<overload>" inside an
    # "OPERATOR_CALL" event (the same time, counted once here), each delegate as "DELEGATE_CALL".
    if event_name == "DELEGATE_CALL":
        return DELEGATE
    if event_name.startswith("native_call_"):
        return event_name[len("native_call_"):]
    if _CUSTOM_OP.match(event_name):   # a custom op's kernel (llama::custom_sdpa.out)
        return event_name
    return None


# A custom op's kernel is logged under its name, namespace first; the runtime's own events
# (Method::execute, Program::load_method) are capitalized.
_CUSTOM_OP = re.compile(r"^[a-z_][a-z0-9_]*::")


@dataclass
class Declined:
    """One node XNNPACK's partitioner did not take, with the reason it logged."""

    node: str
    op: str
    reason: str


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.found: dict = {}

    def emit(self, record):
        from executorch.exir.backend.utils import WhyNoPartition

        why = record.msg
        if isinstance(why, WhyNoPartition) and why.node is not None:
            node = why.node
            # the last word wins: the final partition() runs after any earlier check
            self.found[node.name] = Declined(node.name, str(node.target), why.reason)


@contextlib.contextmanager
def _collecting():
    """Collect WhyNoPartition records from XNNPACK's partitioner configs while inside.

    Only the ``executorch.backends.xnnpack.partition`` loggers are lowered to DEBUG, and only
    for the duration; their levels are put back after.
    """
    import executorch.backends.xnnpack.partition.config as configs
    import pkgutil

    names = ["executorch.backends.xnnpack.partition"] + [
        f"{configs.__name__}.{m.name}" for m in pkgutil.iter_modules(configs.__path__)]
    loggers = [logging.getLogger(name) for name in names]
    saved = [(lg, lg.level, lg.propagate) for lg in loggers]
    handler = _Collect()
    for lg in loggers:
        lg.setLevel(logging.DEBUG)
        lg.addHandler(handler)
        lg.propagate = False     # DEBUG records stay here, not on the user's root handler
    try:
        yield handler
    finally:
        for lg, level, propagate in saved:
            lg.removeHandler(handler)
            lg.setLevel(level)
            lg.propagate = propagate


def why_not_delegated(ep, partitioner=None) -> list:
    """Lower ``ep`` with ``partitioner`` (default: xnnfold's) and return, for every op left
    outside delegates that XNNPACK's configs declined, the reason they logged."""
    from executorch.exir import to_edge_transform_and_lower

    from ..analysis.gemms import op_name
    from ..partitioner import XnnpackPartitioner

    partitioner = partitioner if partitioner is not None else XnnpackPartitioner()
    with _collecting() as handler:
        edge = to_edge_transform_and_lower(ep, partitioner=[partitioner])
    targets = _config_targets()
    rows = []
    for node in edge.exported_program().graph.nodes:
        if node.op != "call_function":
            continue
        name = op_name(node.target)
        if "executorch_call_delegate" in name or name == "getitem":
            continue
        found = handler.found.get(node.name)
        if found:
            reason = found.reason
        elif _target_name(node) not in targets:
            reason = f"nothing logged: XNNPACK has no partitioner config for {_target_name(node)}"
        else:
            reason = "nothing logged: its config took it, no partition kept it"
        rows.append(Declined(node.name, name, reason))
    return rows


def _target_name(node) -> str:
    from executorch.exir.backend.canonical_partitioners.config_partitioner import (
        format_target_name,
    )
    return format_target_name(node.target.__name__)


def _config_targets() -> set:
    """The op names XNNPACK's partitioner has a config for (``target_name`` of each)."""
    from executorch.backends.xnnpack.partition.config import ALL_PARTITIONER_CONFIGS
    return {config.target_name for config in ALL_PARTITIONER_CONFIGS}
