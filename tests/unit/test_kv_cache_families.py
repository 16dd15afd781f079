"""The KV-cache step on the attention forms of other model families, on small exported graphs
without lowering: eager attention written op by op (Gemma2's soft-capping, BLOOM's ALiBi
``baddbmm``, MPT's ``masked_fill``), SDPA with a per-head (ALiBi) mask, a value head size of its
own; the rewritten program, run over several steps, equals eager; and the step's own guards: a
failure on one attention leaves only that one as it was."""

import copy
import logging
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import set_strict
from xnnfold.pte import compare_outputs
from xnnfold.graph.program_copy import copy_program
from xnnfold.steps import kv_cache
from xnnfold.steps.kv_cache import eager, mask_proof, pattern, plan

E, KV, S, D = 16, 2, 12, 4
LOWEST = torch.finfo(torch.float32).min


def alibi(heads: int) -> torch.Tensor:
    """ALiBi's bias of each head on each key position: slope_h * j ([H, 1, S])."""
    slopes = torch.tensor([2.0 ** (-8 * (h + 1) / heads) for h in range(heads)])
    return slopes[:, None, None] * torch.arange(S)[None, None, :]


class Cached(nn.Module):
    """One attention over a static KV cache written as transformers writes it (``index_copy_``
    at ``arange(L) + cumulative_length``), in the form ``style`` says:

    - "gemma2": repeat_kv, ``matmul * scale``, soft-capping ``tanh(s / 5) * 5``, a float mask
      (0 / the lowest float), ``softmax(float32)``, ``dropout(p=0)``, ``matmul``;
    - "bloom": one query head per KV head, ``baddbmm(alibi, q3, K3^T)``, the mask, ``bmm``;
    - "mpt": ``matmul * scale + alibi``, ``masked_fill(blocked, lowest)``;
    - "sdpa-alibi": SDPA under a per-head mask (ALiBi where attended, the lowest float where
      not), as Falcon's ALiBi option builds it;
    - "sdpa": SDPA under the causal mask; ``value_dim``: the value's head size.

    ``window``: the mask also blocks the keys ``window`` rows or more behind the query.
    ``returns_weights``: the attention weights are an output too. ``beta``: BLOOM's bias
    scaled; ``squared``: the scores times themselves."""

    def __init__(self, style, groups=2, window=None, value_dim=D, returns_weights=False,
                 beta=1.0, squared=False):
        super().__init__()
        self.beta, self.squared = beta, squared
        self.style, self.groups, self.window = style, groups, window
        self.returns_weights, self.heads = returns_weights, KV * groups
        self.q = nn.Linear(E, self.heads * D)
        self.k, self.v = nn.Linear(E, KV * D), nn.Linear(E, KV * value_dim)
        self.value_dim = value_dim
        self.register_buffer("k_cache", torch.zeros(1, KV, S, D), persistent=False)
        self.register_buffer("v_cache", torch.zeros(1, KV, S, value_dim), persistent=False)
        self.register_buffer("length", torch.tensor(0), persistent=False)
        self.register_buffer("bias", alibi(self.heads), persistent=False)

    def repeat(self, cache):
        b, kv, s, d = cache.shape
        return cache[:, :, None].expand(b, kv, self.groups, s, d).reshape(b, kv * self.groups,
                                                                          s, d)

    def forward(self, x, cache_position):
        length = x.shape[1]
        q = self.q(x).view(1, length, self.heads, D).transpose(1, 2)
        k = self.k(x).view(1, length, KV, D).transpose(1, 2)
        v = self.v(x).view(1, length, KV, self.value_dim).transpose(1, 2)
        self.length.copy_(cache_position[0])
        where = torch.arange(length) + self.length.to(torch.int64)
        self.k_cache.index_copy_(2, where, k)
        self.v_cache.index_copy_(2, where, v)
        rows, columns = where[:, None], torch.arange(S)[None, :]
        allowed = columns <= rows
        if self.window is not None:
            allowed = allowed & (columns > rows - self.window)
        allowed = allowed[None, None]
        additive = torch.where(allowed, 0.0, LOWEST)
        keys, values = self.repeat(self.k_cache), self.repeat(self.v_cache)
        scale = 1 / math.sqrt(D)
        if self.style.startswith("sdpa"):
            mask = allowed if self.style == "sdpa" else \
                torch.masked_fill(self.bias[None], ~allowed, LOWEST)
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
            return out.transpose(1, 2).reshape(1, length, -1)
        if self.style == "bloom":
            scores = self.bias.baddbmm(q.reshape(self.heads, -1, D),
                                       keys.reshape(self.heads, -1, D).transpose(-1, -2),
                                       beta=self.beta, alpha=scale)
            weights = F.softmax(scores.view(1, self.heads, length, -1) + additive, dim=-1,
                                dtype=torch.float32).to(q.dtype)
            out = torch.bmm(weights.view(self.heads, length, -1),
                            values.reshape(self.heads, -1, self.value_dim))
            return out.view(1, self.heads, length, -1).transpose(1, 2).reshape(1, length, -1)
        scores = torch.matmul(q, keys.transpose(2, 3)) * scale
        if self.squared:
            scores = scores * scores
        if self.style == "gemma2":
            scores = torch.tanh(scores / 5.0) * 5.0 + additive
        else:
            scores = (scores + self.bias).masked_fill(~allowed, LOWEST)
        weights = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        weights = F.dropout(weights, p=0.0, training=False)
        out = torch.matmul(weights, values).transpose(1, 2).reshape(1, length, -1)
        return (out, weights) if self.returns_weights else out


class TwoLayers(nn.Module):
    def __init__(self, style, **kwargs):
        super().__init__()
        self.a, self.b = Cached(style, **kwargs), Cached(style, **kwargs)

    def forward(self, x, cache_position):
        return self.b(self.a(x, cache_position)[..., :E], cache_position)


PREFILL = 4


def varied_steps(count=S):
    """Steps of 2, 3, 1, 1... tokens at consecutive positions (a prompt in chunks, then
    decoding) up to ``count`` rows, beyond any window."""
    gen, start, sequence = torch.Generator().manual_seed(0), 0, []
    for length in (2, 3) + (1,) * (count - 5):
        sequence.append((torch.randn(1, length, E, generator=gen),
                         torch.arange(start, start + length)))
        start += length
    return sequence


def rewritten(module, dynamic=True, llm=False):
    """(the rewritten copy of ``module``'s exported program, the step's records): a step length
    of 1 to PREFILL (as the one-method generation program has it) or static."""
    torch.manual_seed(0)
    example = varied_steps()[0]
    shapes = None
    if dynamic:
        length = torch.export.Dim("length", min=1, max=PREFILL)
        shapes = ({1: length}, {0: length})
    ep = torch.export.export(module.eval(), example, dynamic_shapes=shapes)
    program = copy_program(ep)
    return program, kv_cache.rewrite_kv_caches(program, llm)


def matches(program, module, sequence) -> bool:
    eager_module, rewritten_module = copy.deepcopy(module), program.module()
    with torch.no_grad():
        return all(compare_outputs(rewritten_module(*args), eager_module(*args)).ok
                   for args in sequence)


def ops_of(program) -> set:
    return {str(n.target) for n in program.graph.nodes if n.op == "call_function"}


@pytest.mark.parametrize("style", ["gemma2", "bloom", "mpt"])
@pytest.mark.parametrize("llm", [False, True], ids=["default", "llm-kernels"])
def test_eager_attention_rewritten_equals_eager(style, llm):
    """Each eager form, over a dynamic step length: rewritten (nothing repeated, the cache's
    update in place with llm_kernels), equal to eager over steps of several lengths."""
    module = Cached(style, groups=1 if style == "bloom" else 2)
    program, records = rewritten(module, llm=llm)
    assert [r.rewritten for r in records] == [True], [r.describe() for r in records]
    assert "eager attention: " in records[0].proven, records[0].proven
    ops = ops_of(program)
    assert not {"aten.expand.default", "aten.matmul.default", "aten.baddbmm.default",
                "aten.masked_fill.Scalar", "aten.dropout.default"} & ops, ops
    if llm:
        assert "llama.update_cache.default" in ops and "llama.custom_sdpa.default" not in ops
        assert records[0].llm_declined.startswith("custom_sdpa: an eager attention")
    assert matches(program, module, varied_steps())


def test_soft_capping_kept_in_eager_order():
    """Gemma2's scores: times the scale, over the cap, tanh, times the cap, plus the mask."""
    program, records = rewritten(Cached("gemma2"))
    assert "mul 0.5, div 5, tanh, mul 5, add " in records[0].proven, records[0].proven


def test_masked_fill_becomes_mul_and_add():
    """MPT's masked_fill (no XNNPACK config) as scores * keep + fill, on two layers."""
    module = TwoLayers("mpt")
    program, records = rewritten(module)
    assert [r.rewritten for r in records] == [True, True]
    assert "aten.masked_fill.Scalar" not in ops_of(program)
    assert matches(program, module, varied_steps())


def test_window_in_eager_mask_needs_no_proof():
    """A sliding window in an eager attention's mask: the mask is added as computed."""
    module = Cached("gemma2", window=3)
    program, records = rewritten(module)
    assert records[0].rewritten
    assert matches(program, module, varied_steps())


def test_returned_weights_keep_the_attention():
    """The attention weights are an output: the eager attention is kept, and says why."""
    module = Cached("gemma2", returns_weights=True)
    program, records = rewritten(module)
    assert not records[0].rewritten
    assert "the attention weights" in records[0].kept_because and "read by 2" in \
        records[0].kept_because, records[0].kept_because
    assert "aten.matmul.default" in ops_of(program)
    assert matches(program, module, varied_steps())


def broken(module, llm=False) -> bool:
    """What a guard prevents (in users' mode, a failure of the rewrite is kept and recorded):
    the attention rewritten into a program that computes other values than eager's or does not
    run, or the rewrite failing half-way."""
    program, (record,) = rewritten(module, llm=llm)
    if not record.rewritten:
        return "internal failure" in record.kept_because
    try:
        return not matches(program, module, varied_steps())
    except RuntimeError:           # the rewritten program does not run: wrong
        return True


def test_returned_weights_wrong_without_the_guard(monkeypatch):
    """The guard above removed (the weights' other reader ignored)."""
    monkeypatch.setattr(eager, "_users", lambda node: [
        u for u in node.users if u.op != "output" and u.target is not eager._ASSERT])
    set_strict(monkeypatch, False)
    assert broken(Cached("gemma2", returns_weights=True))


@pytest.mark.parametrize("style, change, reason", [
    ("bloom", {"beta": 0.5}, "baddbmm with beta 0.5"),
    ("gemma2", {"squared": True}, "not the scores and a number or another tensor"),
])
def test_other_forms_are_kept(style, change, reason):
    """Forms the rewrite does not compute as eager does are left as they were, and say why."""
    module = Cached(style, groups=1 if style == "bloom" else 2, **change)
    program, records = rewritten(module)
    assert not records[0].rewritten and reason in records[0].kept_because, records[0].describe()
    assert matches(program, module, varied_steps())


def test_per_head_mask_of_sdpa():
    """SDPA under a per-head float mask (ALiBi where attended, the lowest float elsewhere):
    rewritten, the mask proven to leave no row fully blocked (no keep factor)."""
    module = Cached("sdpa-alibi")
    program, records = rewritten(module, llm=True)
    record = records[0]
    assert record.rewritten, record.describe()
    assert f"mask proven {plan.ATTENDS.text}" in record.proven, record.proven
    assert record.llm_declined.startswith(f"custom_sdpa: the mask is {plan.ATTENDS.text}")
    assert "aten.any.dim" not in ops_of(program)
    assert matches(program, module, varied_steps())


class WindowThenBlocked(Cached):
    """A sliding window of 3 for every row but those at position 7, which attend nothing."""

    def forward(self, x, cache_position):
        length = x.shape[1]
        q = self.q(x).view(1, length, self.heads, D).transpose(1, 2)
        self.length.copy_(cache_position[0])
        where = torch.arange(length) + self.length.to(torch.int64)
        self.k_cache.index_copy_(2, where, self.k(x).view(1, length, KV, D).transpose(1, 2))
        self.v_cache.index_copy_(2, where, self.v(x).view(1, length, KV, D).transpose(1, 2))
        rows, columns = where[:, None], torch.arange(S)[None, :]
        allowed = (columns <= rows) & (columns > rows - 3) & (rows != 7)
        out = F.scaled_dot_product_attention(q, self.repeat(self.k_cache),
                                             self.repeat(self.v_cache), attn_mask=allowed)
        return out.transpose(1, 2).reshape(1, length, -1)


def test_window_proven_for_every_position_only():
    """The window is read from the mask, then checked at every position: a mask that blocks a
    whole row at one position is not proven, its empty rows get eager's zeros."""
    module = WindowThenBlocked("sdpa")
    program, records = rewritten(module)
    assert "fully blocked rows handled by a keep factor" in records[0].proven, records[0].proven
    assert matches(program, module, varied_steps())


def test_window_wrong_without_the_check_at_every_position(monkeypatch):
    """The window taken from the last position without the check at every other one."""
    differs = mask_proof._differs
    monkeypatch.setattr(mask_proof, "_differs", lambda got, expected, starts, rows, kind: (
        differs(got, expected, starts, rows, kind) if kind == plan.CAUSAL else None))
    module = WindowThenBlocked("sdpa")
    program, records = rewritten(module)
    assert "mask proven causal within a sliding window of 3" in records[0].proven
    assert not matches(program, module, varied_steps())


@pytest.mark.parametrize("style", ["sdpa", "gemma2"])
def test_value_head_size_of_its_own(style):
    """Values of head size 6 beside keys of 4 (latent attention's shapes): the output is
    [B, H, L, 6]; custom_sdpa, which takes caches of one size, is not used."""
    module = Cached(style, value_dim=6)
    program, records = rewritten(module, llm=True)
    assert records[0].rewritten, records[0].describe()
    if style == "sdpa":
        assert records[0].llm_declined == \
            "custom_sdpa: a value head size 6 beside the key's 4: custom_sdpa takes caches " \
            "of one size"
    assert matches(program, module, varied_steps())


def test_value_head_size_wrong_without_the_guard(monkeypatch):
    """The value's head size read as the key's: custom_sdpa over caches of two sizes, or an
    output of the wrong shape."""
    monkeypatch.setattr(pattern.CacheAttention, "value_dim", property(lambda a: a.key.shape[3]))
    set_strict(monkeypatch, False)
    assert broken(Cached("sdpa", value_dim=6), llm=True)


def failing_on_first(original):
    """``original`` (a matcher), raising for the first attention of the graph."""
    def match(node, updates):
        if node.name in ("scaled_dot_product_attention", "softmax"):
            raise RuntimeError("a matcher bug")
        return original(node, updates)
    return match


@pytest.mark.parametrize("style", ["sdpa", "gemma2"])
def test_failure_on_one_attention_keeps_only_it(style, monkeypatch, caplog):
    """A matcher that raises on one attention: that one is kept as stock has it, with a
    warning naming it; the other layer is rewritten; the program equals eager."""
    monkeypatch.setattr(pattern, "match_attention", failing_on_first(pattern.match_attention))
    monkeypatch.setattr(eager, "match_eager", failing_on_first(eager.match_eager))
    set_strict(monkeypatch, False)
    module = TwoLayers(style)
    with caplog.at_level(logging.WARNING, logger="xnnfold"):
        program, records = rewritten(module)
    assert [r.rewritten for r in records] == [False, True], [r.describe() for r in records]
    assert records[0].kept_because == "internal failure, left as stock leaves it: " \
                                      "RuntimeError: a matcher bug"
    assert "a matcher bug" in caplog.text
    assert matches(program, module, varied_steps())


def test_mask_beyond_the_evaluation_budget_is_not_proven(monkeypatch):
    """A mask with more elements to evaluate than the budget (a per-head mask of a long prefill
    over a long cache) is not proven: its fully blocked rows, if any, get the keep factor."""
    monkeypatch.setattr(mask_proof, "ELEMENT_BUDGET", 1_000)
    module = Cached("sdpa-alibi")
    program, records = rewritten(module)
    assert "fully blocked rows handled by a keep factor" in records[0].proven, records[0].proven
    assert matches(program, module, varied_steps())
