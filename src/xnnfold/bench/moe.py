"""Mixture-of-experts decode measured (``xnnfold bench moe-decode``): the weights one decode step
reads against the active parameters (router + the top-k experts + everything else), for each way
of exporting transformers' experts:

- ``routed`` — xnnfold's export (:mod:`xnnfold.export.experts`): one cond per expert, each
  expert's delegate run only when a token is routed to it;
- ``all-experts`` — the same delegates, every expert run on every token (weight 0 where not
  routed): what a graph without control flow reads;
- ``batched-mm`` — transformers' ``batched_mm`` (what its own ExecuTorch exporter chooses): the
  selected experts' weights gathered per token on portable into a batched matmul with run-time
  weights, which XNNPACK packs again on every call;
- ``floor`` — the same model with as many experts as it routes to (E = k): every expert it
  holds is active, so its step reads exactly the active parameters.

A decode step of one token at ``position`` (transformers' static cache, one method), each variant
checked against eager on an empty cache, then timed interleaved (one thread, medians). Decode is
memory-bound: a variant's time over the floor's is the bytes it reads over the active ones.
"""

from __future__ import annotations

import contextlib
import statistics
import time
import types
from dataclasses import dataclass

import torch

from ..models import families

VARIANTS = ("routed", "all-experts", "batched-mm", "floor")


def _all_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """Every expert's delegate on every token, weighted by its routing weight (0: not routed)."""
    out = torch.zeros_like(hidden_states)
    for e, expert in enumerate(self._xnnfold_lowered):
        weight = (top_k_weights * (top_k_index == e)).sum(dim=-1, keepdim=True)
        result = expert(hidden_states)
        out = out + (result[0] if isinstance(result, (tuple, list)) else result) * weight
    return out


@contextlib.contextmanager
def _experts_as(model, variant: str):
    """The experts of ``model`` as ``variant`` exports them, while inside."""
    from ..export.experts import experts_modules, routed_experts

    if variant == "batched-mm":
        saved = model.get_experts_implementation()
        model.set_experts_implementation("batched_mm")
        try:
            yield
        finally:
            model.set_experts_implementation(saved)
        return
    with routed_experts(model, max_tokens=1):
        if variant == "all-experts":
            for module in experts_modules(model):
                module.forward = types.MethodType(_all_experts_forward, module)
        yield


@dataclass
class Lowered:
    variant: str
    pte: bytes
    seconds: float
    check: str
    ops_outside: list


def lower_decode(model, variant: str, cache: int) -> Lowered:
    """One decode step of ``model`` (transformers' static cache), its experts as ``variant``,
    lowered with xnnfold and emitted as the generation .pte is (cond outputs planned in place),
    checked at position 0 against eager."""
    from executorch.exir import to_edge_transform_and_lower

    from ..export.llm.export import emit_config
    from ..export.static_cache import with_static_cache
    from ..partitioner import XnnpackPartitioner
    from ..pte import PteRunner, inspect_lowered
    from ..pte.compare import compare_outputs

    inputs = (torch.tensor([[3]]), torch.tensor([0]))
    start = time.perf_counter()
    module = with_static_cache(model, cache)
    with torch.no_grad(), _experts_as(model, variant):
        program = torch.export.export(module, (), {"input_ids": inputs[0],
                                                   "cache_position": inputs[1]}, strict=True)
    edge = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()])
    ops = inspect_lowered(edge.exported_program())[0]
    pte = edge.to_executorch(emit_config()).buffer
    seconds = time.perf_counter() - start
    with torch.no_grad():
        expected = model(input_ids=inputs[0]).logits
    verdict = compare_outputs(PteRunner(pte).run(inputs), expected, per_row=True)
    return Lowered(variant, pte, seconds, str(verdict), ops)


def weight_bytes(model, variant: str, top_k: int) -> dict:
    """Bytes of weights one decode step reads, by part, and the total: ``experts`` (per the
    variant), everything else (attention, norms, router, head; one embedding row)."""
    from ..export.experts import experts_modules

    experts = experts_modules(model)
    expert_bytes = sum(p.numel() * p.element_size() for m in experts for p in m.parameters())
    per_expert = expert_bytes / max(1, sum(m.num_experts for m in experts))
    layers = len(experts)
    rest = sum(p.numel() * p.element_size() for p in model.parameters()) - expert_bytes
    embedding = model.get_input_embeddings().weight
    tied = embedding is model.get_output_embeddings().weight
    if not tied:     # the lookup reads one row of the table
        rest -= embedding.numel() * embedding.element_size() - embedding[0].numel() * 4
    active = per_expert * top_k * layers
    reads = {"routed": active, "floor": active, "all-experts": expert_bytes,
             "batched-mm": 3 * active}[variant]      # gather, pack, GEMM: each reads them
    return {"experts": reads, "rest": rest, "total": reads + rest, "active": active + rest}


def time_interleaved(ptes: dict, position: int, rounds: int) -> dict:
    """{variant: median ms of a decode step at ``position``}, variants shuffled per round."""
    import random

    from ..pte import PteRunner

    runners = {name: PteRunner(pte) for name, pte in ptes.items()}
    inputs = (torch.tensor([[3]]), torch.tensor([position]))
    times = {name: [] for name in runners}
    order, rng = list(runners), random.Random(0)
    for index in range(rounds + 2):
        rng.shuffle(order)
        for name in order:
            start = time.perf_counter()
            runners[name].run(inputs)
            if index >= 2:
                times[name].append((time.perf_counter() - start) * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


def build(sizes: families.Sizes, experts=None, intermediate=None):
    """Mixtral at ``sizes`` (``experts``: another number of experts, top-k kept;
    ``intermediate``: each expert's intermediate size)."""
    import dataclasses

    if experts is not None:
        sizes = dataclasses.replace(sizes, experts=experts)
    overrides = {} if intermediate is None else {"intermediate_size": intermediate}
    return families.build("mixtral", sizes, **overrides)
