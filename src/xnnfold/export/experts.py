"""transformers' mixture-of-experts layers exported so that a decode step reads only the experts
its token is routed to.

transformers 5 runs every ``@use_experts_implementation`` experts module (Mixtral, Qwen2/3-MoE,
OLMoE, GraniteMoE, PhiMoE, DeepSeek-V2/V3, ...) through ``config._experts_implementation``. Its
default, ``grouped_mm``, exports ``aten.histc``, which is not core ATen: executorch's lowering
raises (stock's and xnnfold's alike). ``batched_mm`` (what transformers' own ExecuTorch exporter
chooses) gathers the selected experts' weights per token (a copy, on portable) into a batched
matmul with run-time weights (packed again on every call), and edge's decomposition of its
``repeat_interleave`` fixes the prefill length to the example's. XNNPACK 1.5.1 has no grouped or
gather matmul and no conditional execution.

Here each expert becomes one ``torch.cond``: ``out += cond(any token routed to e, expert_e(x) *
w_e, zeros)``, where ``w_e`` is each token's routing weight for ``e`` (0 for a token routed
elsewhere) and ``expert_e`` is that expert's FFN lowered beforehand to one XNNPACK delegate
holding its weights as constants. A decode step runs the delegates of its top-k experts and
jumps over the others; a prefill runs each expert any of its tokens is routed to, on all its
tokens (those routed elsewhere weigh 0). The same values as transformers' ``batched_mm``: each
token's output is the sum of its routed experts' outputs times their weights (summed in expert
order: for top-2 the same two additions).

Two fixes make the conds export and run (neither patches a library): a cond's output needs
:mod:`xnnfold.export.cond_memory` when emitted, and torch 2.13's dynamo loses attribute stores
made after a cond, which breaks the ``kernels`` package's forward wrapper around transformers'
attention classes (:func:`_kernel_wrappers_bypassed`).
"""

from __future__ import annotations

import contextlib
import types

import torch
from torch import nn


def experts_modules(model: nn.Module) -> list:
    """The modules of ``model`` that run through transformers' experts interface (stacked
    expert weights and the ``has_gate`` / ``is_transposed`` flags it sets)."""
    return [m for m in model.modules()
            if all(hasattr(m, a) for a in ("has_gate", "is_transposed", "num_experts",
                                           "down_proj", "_apply_gate"))]


def _own(tensor) -> nn.Parameter:
    """A parameter of its own contiguous storage (a view's storage would be serialized from its
    start, not its offset)."""
    return nn.Parameter(tensor.detach().contiguous().clone(), requires_grad=False)


class OneExpert(nn.Module):
    """Expert ``index`` of ``experts``, computed as ``batched_mm_experts_forward`` computes it
    for one token, with weights of its own: a linear (or ``x @ W`` for a transposed layout) in,
    the gate (or the activation), a linear out, the post-expert norm if any. The default gate
    over a concatenated ``gate_up_proj`` is two GEMMs on its halves (XNNPACK has no split; each
    output element is the same dot product)."""

    def __init__(self, experts: nn.Module, index: int):
        super().__init__()
        from transformers.integrations.moe import _default_apply_gate

        name = "gate_up_proj" if experts.has_gate else "up_proj"
        bias = experts.has_bias

        def weight(param_name):     # (out, in) for a linear
            w = getattr(experts, param_name)[index]
            return w.t() if experts.is_transposed else w

        self.split = experts.has_gate and experts.is_concatenated and \
            type(experts)._apply_gate is _default_apply_gate
        if self.split:
            gate, up = weight(name).chunk(2, dim=0)
            self.w_gate, self.w_up = _own(gate), _own(up)
            biases = getattr(experts, f"{name}_bias")[index].chunk(2) if bias else (None, None)
            self.b_gate, self.b_up = (None if b is None else _own(b) for b in biases)
        else:
            self.w_in = _own(weight(name))
            self.b_in = _own(getattr(experts, f"{name}_bias")[index]) if bias else None
        self.w_out = _own(weight("down_proj"))
        self.b_out = _own(experts.down_proj_bias[index]) if bias else None
        self.act_fn = getattr(experts, "act_fn", None)    # a custom gate may have none
        self.post_expert_norm = experts.post_expert_norm if experts.has_post_expert_norm \
            else None
        # the gate is the experts class's own method (reads no parameters)
        object.__setattr__(self, "_experts", experts)

        self.gemms = None       # {name: its delegate}, when the gate stays outside them

    @property
    def gemm_names(self) -> tuple:
        return ("gate", "up", "out") if self.split else ("in", "out")

    def gemm(self, name: str) -> tuple:
        """(weight, bias) of GEMM ``name``."""
        return getattr(self, f"w_{name}"), getattr(self, f"b_{name}")

    def _linear(self, name: str, x):
        if self.gemms is not None:
            return _first(self.gemms[name](x))
        return nn.functional.linear(x, *self.gemm(name))

    def forward(self, x):
        if self.split:
            h = self.act_fn(self._linear("gate", x)) * self._linear("up", x)
        elif self._experts.has_gate:
            h = type(self._experts)._apply_gate(self._experts, self._linear("in", x))
        else:
            h = self.act_fn(self._linear("in", x))
        out = self._linear("out", h)
        return self.post_expert_norm(out) if self.post_expert_norm is not None else out


class _Linear(nn.Module):
    def __init__(self, weight, bias):
        super().__init__()
        self.weight, self.bias = weight, bias

    def forward(self, x):
        return nn.functional.linear(x, self.weight, self.bias)


class ExpertNotDelegated(RuntimeError):
    """An expert's GEMM did not lower to one XNNPACK delegate."""


def _lowered_alike(modules: list, max_tokens: int) -> list:
    """Each of ``modules`` (one structure, their own weights) on 1 to ``max_tokens`` rows,
    lowered with executorch's XnnpackPartitioner (plain weights: nothing to fold): exported
    once, lowered in one call; its single delegate, or None if it lowered to anything else."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from executorch.exir.lowered_backend_module import get_lowered_submodules

    width = next(modules[0].parameters()).shape[1]
    rows = 2 if max_tokens > 1 else 1
    dynamic = ({0: torch.export.Dim("expert_tokens", min=1, max=max_tokens)},) \
        if max_tokens > 1 else None
    with torch.no_grad():
        base = torch.export.export(modules[0], (torch.zeros(rows, width),),
                                   dynamic_shapes=dynamic, strict=True)
    programs = {f"part_{i}": _with_weights(base, m) for i, m in enumerate(modules)}
    edge = to_edge_transform_and_lower(
        programs, partitioner={name: [XnnpackPartitioner()] for name in programs})
    single = []
    for name in programs:
        graph = edge.exported_program(name).graph_module
        delegates = get_lowered_submodules(graph)
        outside = [n for n in graph.graph.nodes if n.op == "call_function" and
                   "call_delegate" not in str(n.target) and "getitem" not in str(n.target)]
        single.append(delegates[0][1] if len(delegates) == 1 and not outside else None)
    return single


def _lowered_experts(experts: nn.Module, max_tokens: int) -> list:
    """Per expert of ``experts``, what its cond's branch calls: its whole FFN as one delegate;
    where XNNPACK cannot take the gate (GPT-OSS's interleaved, clamped one), the expert with each
    GEMM a delegate of its own and the gate traced between them (portable, inside the branch)."""
    ones = [OneExpert(experts, e) for e in range(experts.num_experts)]
    whole = _lowered_alike(ones, max_tokens)
    if all(d is not None for d in whole):
        return whole
    for one in ones:
        one.gemms = {}
    for name in ones[0].gemm_names:
        lowered = _lowered_alike([_Linear(*one.gemm(name)) for one in ones], max_tokens)
        if any(d is None for d in lowered):
            raise ExpertNotDelegated(f"{type(experts).__name__}: its {name} GEMM did not lower "
                                     "to one XNNPACK delegate")
        for one, delegate in zip(ones, lowered):
            one.gemms[name] = delegate
    return ones


def _with_weights(program, one: nn.Module):
    """``program`` (an export of a module like ``one``) with ``one``'s weights in its state
    dict."""
    import copy

    state = {**dict(one.named_parameters()), **dict(one.named_buffers())}
    root = copy.deepcopy(program.graph_module)
    return torch.export.ExportedProgram(
        root=root, graph=root.graph,
        graph_signature=copy.deepcopy(program.graph_signature),
        state_dict={name: state[name] for name in program.state_dict},
        range_constraints=program.range_constraints,
        module_call_graph=copy.deepcopy(program.module_call_graph),
        constants=dict(program.constants))


def _first(result):
    return result[0] if isinstance(result, (tuple, list)) else result


def _routed_forward(self, hidden_states, top_k_index, top_k_weights):
    """The experts module's forward while exporting: one cond per expert (module docstring)."""
    out = torch.zeros_like(hidden_states)
    for e, expert in enumerate(self._xnnfold_lowered):
        routed = top_k_index == e
        weight = (top_k_weights * routed).sum(dim=-1, keepdim=True).to(hidden_states.dtype)
        out = out + torch.cond(routed.any(),
                               lambda x, w, expert=expert: _first(expert(x)) * w,
                               lambda x, w: torch.zeros_like(x), (hidden_states, weight))
    return out


@contextlib.contextmanager
def _kernel_wrappers_bypassed(model: nn.Module):
    """transformers' classes that the ``kernels`` package's ``use_kernelized_func`` wraps set
    and reset a global around forward; after a ``torch.cond`` torch 2.13's dynamo loses the set
    (its side effects are restored after tracing a branch) and the reset fails to trace. Without
    ``kernelize()`` the wrapper routes to the same functions: run the wrapped forward."""
    bypassed = []
    try:
        for module in model.modules():
            forward = type(module).forward
            code = getattr(forward, "__code__", None)
            wrapped = getattr(forward, "__wrapped__", None)
            if wrapped is not None and code is not None and code.co_name == "new_forward" \
                    and "kernels" in code.co_filename.replace("\\", "/").split("/"):
                module.forward = types.MethodType(wrapped, module)
                bypassed.append(module)
        yield bypassed
    finally:
        for module in bypassed:
            module.__dict__.pop("forward", None)


@contextlib.contextmanager
def routed_experts(model: nn.Module, max_tokens: int):
    """While inside: every experts module of ``model`` runs as routed conds over its experts'
    delegates (lowered on entry, for 1 to ``max_tokens`` tokens). The model is as before on
    exit. Yields the experts modules (none: nothing changes)."""
    modules = experts_modules(model)
    if not modules:
        yield modules
        return
    changed = []
    try:
        with _kernel_wrappers_bypassed(model):
            for module in modules:
                module._xnnfold_lowered = _lowered_experts(module, max_tokens)
                module.forward = types.MethodType(_routed_forward, module)
                changed.append(module)
            yield modules
    finally:
        for module in changed:
            module.__dict__.pop("forward", None)
            module.__dict__.pop("_xnnfold_lowered", None)
