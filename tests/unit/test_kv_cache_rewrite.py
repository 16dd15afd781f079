"""The KV-cache step on small exported graphs, without lowering: the rewritten program, run as a
module over several decode steps (its cache buffers carried from step to step), equals eager;
what the step does not take says why; each guard has a case that goes wrong without it."""

import copy

import pytest
import torch

from conftest import set_strict
from xnnfold.graph.sdpa import SDPA, sdpa_args
from xnnfold.graph.values import ValueNumbers, written_placeholders
import torch.nn.functional as F
from torch import nn

from xnnfold.pte.compare import compare_outputs
from xnnfold.steps import kv_cache
from xnnfold.graph.program_copy import copy_program
from xnnfold.steps.kv_cache import mask_proof, pairing, pattern, plan, positions

E, KV, GROUPS, S, D = 16, 2, 2, 8, 4
H = KV * GROUPS


class CacheAttention(nn.Module):
    """One attention over a static KV cache, written as transformers writes it (``style="hf"``:
    ``index_copy_`` at ``arange(L) + cumulative_length``, ``repeat_kv``, a mask from the
    position) or as executorch's example does (``"et"``: ``cache[:, :, pos] = k``,
    ``repeat_interleave``, rows of a causal mask buffer). ``mask``: "causal", "window" (a
    sliding window of 3: not causal from the position), "padding" (also blocks the keys a user
    input marks invalid), "first3" (causal for the first 3 rows of a step, the later rows of a
    longer step attend nothing). ``peek``: also reads the key cache before updating it."""

    def __init__(self, style="hf", mask="causal", peek=False, groups=GROUPS):
        super().__init__()
        self.style, self.mask, self.peek, self.groups = style, mask, peek, groups
        heads = KV * groups
        self.q = nn.Linear(E, heads * D)
        self.k, self.v = nn.Linear(E, KV * D), nn.Linear(E, KV * D)
        self.register_buffer("k_cache", torch.zeros(1, KV, S, D), persistent=False)
        self.register_buffer("v_cache", torch.zeros(1, KV, S, D), persistent=False)
        self.register_buffer("length", torch.tensor(0), persistent=False)
        self.register_buffer("causal", torch.tril(torch.ones(S, S, dtype=torch.bool)),
                             persistent=False)

    def _repeat(self, cache):
        if self.style == "et":
            return cache.repeat_interleave(self.groups, dim=1)
        return cache[:, :, None, :, :].expand(1, KV, self.groups, S, D).reshape(
            1, KV * self.groups, S, D)

    def forward(self, x, cache_position, valid=None):
        length = x.shape[1]
        heads = KV * self.groups
        q = self.q(x).view(1, length, heads, D).transpose(1, 2)
        k = self.k(x).view(1, length, KV, D).transpose(1, 2)
        v = self.v(x).view(1, length, KV, D).transpose(1, 2)
        peeked = self.k_cache[:, :, 0].sum() if self.peek else 0.0
        if self.style == "et":
            self.k_cache[:, :, cache_position] = k
            self.v_cache[:, :, cache_position] = v
            mask = self.causal[cache_position]
        else:
            self.length.copy_(cache_position[0])
            start = self.length.to(torch.int64)
            where = torch.arange(length) + start
            self.k_cache.index_copy_(2, where, k)
            self.v_cache.index_copy_(2, where, v)
            rows = (torch.arange(length) + start)[:, None]
            columns = torch.arange(S)[None, :]
            mask = columns <= rows
            if self.mask == "window":
                mask = mask & (columns > rows - 3)
            if self.mask == "first3":
                mask = mask & (torch.arange(length) < 3)[:, None]
            mask = mask[None, None]
        if self.mask == "padding":
            mask = mask & valid
        out = F.scaled_dot_product_attention(q, self._repeat(self.k_cache),
                                             self._repeat(self.v_cache), attn_mask=mask)
        return out.transpose(1, 2).reshape(1, length, heads * D) + peeked


def steps(length=1, count=4, seed=0, valid=None):
    gen = torch.Generator().manual_seed(seed)
    extra = () if valid is None else (valid,)
    return [(torch.randn(1, length, E, generator=gen),
             torch.arange(i * length, (i + 1) * length)) + extra for i in range(count)]


def exported(module, example):
    torch.manual_seed(0)
    return torch.export.export(module.eval(), example)


def rewritten(module, example, llm=False):
    ep = exported(module, example)
    program = copy_program(ep)
    return ep, program, kv_cache.rewrite_kv_caches(program, llm)


def run_steps(program_or_module, sequence) -> list:
    """Outputs of each step on one module (its buffers carry the cache across steps)."""
    module = program_or_module.module() if hasattr(program_or_module, "module") \
        else program_or_module
    with torch.no_grad():
        return [module(*args) for args in sequence]


def matches(program, module, sequence):
    """The worst comparison of the rewritten program's steps with eager's."""
    eager = copy.deepcopy(module)
    verdict = None
    for got, want in zip(run_steps(program, sequence), run_steps(eager, sequence)):
        one = compare_outputs(got, want)
        verdict = one if verdict is None else verdict.worst(one)
    return verdict


def ops_of(program):
    return {str(n.target) for n in program.graph.nodes if n.op == "call_function"}


def rewritten_and_run(module, sequence) -> tuple:
    """(the step's records, the rewritten program's verdict over ``sequence``) with the LLM
    kernels; the verdict None where the rewritten program raised when run (failing to run is
    one way of being wrong, which is what a test without a guard expects). The rewrite itself
    must not raise: in users' mode a failure keeps the attention, and its record says so."""
    _, program, records = rewritten(module, sequence[0], llm=True)
    try:
        return records, matches(program, module, sequence)
    except RuntimeError:           # the rewritten program does not run: wrong
        return records, None


def broken_without_the_guard(records, verdict) -> bool:
    """What a guard prevents: the attention rewritten into a program that computes other values
    than eager's (or does not run), or the rewrite failing half-way (users' mode keeps the
    attention as stock has it; strict mode would raise)."""
    (record,) = records
    if record.rewritten:
        return verdict is None or not verdict.ok
    return "internal failure" in record.kept_because


@pytest.mark.parametrize("style", ["hf", "et"])
@pytest.mark.parametrize("llm", [False, True], ids=["default", "llm-kernels"])
def test_rewrite_equals_eager_over_steps(style, llm):
    module = CacheAttention(style)
    sequence = steps()
    ep, program, records = rewritten(module, sequence[0], llm)
    assert [r.rewritten for r in records] == [True], records
    assert matches(program, module, sequence).ok
    ops = ops_of(program)
    assert "aten.scaled_dot_product_attention.default" not in ops
    assert not {"aten.expand.default", "aten.repeat_interleave.self_int"} & ops, ops
    if llm:
        assert {"llama.update_cache.default", "llama.custom_sdpa.default"} <= ops, ops
        assert "aten.index_copy_.default" not in ops and "aten.index_put_.default" not in ops
        assert records[0].kernels == "llama::update_cache, llama::custom_sdpa"
    else:
        assert not any(op.startswith("llama.") for op in ops), ops
        assert records[0].proven.startswith("mask proven causal: no fully blocked row")
    # the caller's program is not touched
    assert "aten.scaled_dot_product_attention.default" in ops_of(ep)
    assert tuple(ep.constants["k_cache"].shape) == (1, KV, S, D)


def test_prefill_then_decode_llm_kernels():
    """A 3-token step written at 0 and 3 (update_cache and custom_sdpa over L rows)."""
    module = CacheAttention("hf")
    sequence = steps(length=3, count=2)
    _, program, records = rewritten(module, sequence[0], llm=True)
    assert records[0].kernels.startswith("llama::update_cache")
    assert matches(program, module, sequence).ok


PREFILL = 5        # the longest step of a dynamic length


def dynamic(module, example, llm):
    """``module`` exported with a dynamic step length (1 .. PREFILL, as a prefill method) and
    rewritten."""
    torch.manual_seed(0)
    length = torch.export.Dim("length", min=1, max=PREFILL)
    ep = torch.export.export(module.eval(), example,
                             dynamic_shapes=({1: length}, {0: length}))
    program = copy_program(ep)
    return program, kv_cache.rewrite_kv_caches(program, llm)


def varied_steps():
    """Steps of 2, 4, 1 and 1 tokens at consecutive positions, all S of them (a prompt in
    chunks, then decoding)."""
    gen, start, sequence = torch.Generator().manual_seed(0), 0, []
    for length in (2, 4, 1, 1):
        sequence.append((torch.randn(1, length, E, generator=gen),
                         torch.arange(start, start + length)))
        start += length
    return sequence


@pytest.mark.parametrize("llm", [False, True], ids=["default", "llm-kernels"])
def test_dynamic_length_proven_for_every_length(llm):
    """A prefill of 1 to PREFILL tokens: the positions arange(L) + P with L the step's own
    symbol, the mask proven causal for every L and P, so no keep factor (default) and
    custom_sdpa (llm_kernels), equal to eager over steps of several lengths."""
    module = CacheAttention("hf")
    sequence = varied_steps()
    program, records = dynamic(module, sequence[0], llm)
    assert records[0].rewritten, records[0].describe()
    if llm:
        assert records[0].kernels == "llama::update_cache, llama::custom_sdpa"
    else:
        assert records[0].proven.startswith("mask proven causal"), records[0].proven
    assert matches(program, module, sequence).ok


def test_mask_causal_for_short_steps_only_is_not_proven():
    """Causal for steps of up to 3 tokens (the export's example has 2), not for 4 or 5: the
    proof covers every length, custom_sdpa is refused, fully blocked rows keep eager's 0."""
    module = CacheAttention("hf", mask="first3")
    sequence = varied_steps()
    program, records = dynamic(module, sequence[0], True)
    assert records[0].llm_declined.startswith("custom_sdpa: at position 0 for 4 rows"), \
        records[0].describe()
    assert matches(program, module, sequence).ok


def test_mask_causal_for_short_steps_wrong_with_one_length_proven(monkeypatch):
    """The rule above removed (the mask proven for the example's length only): custom_sdpa
    attends the rows the mask blocks in a step of 4."""
    monkeypatch.setattr(positions, "length_bounds", lambda length, cache: range(2, 3))
    module = CacheAttention("hf", mask="first3")
    sequence = varied_steps()
    program, records = dynamic(module, sequence[0], True)
    assert records[0].kernels.startswith("llama::update_cache, llama::custom_sdpa")
    assert not matches(program, module, sequence).ok


def test_arange_of_another_length_is_no_start():
    """positions arange(M) + P with M not the step's length: not 'rows P .. P + L - 1'."""
    ep = exported(CacheAttention("hf"), steps(length=3)[0])
    numbers = ValueNumbers(ep.graph, set())
    adds = [n for n in ep.graph.nodes if n.target is torch.ops.aten.add.Tensor and
            n.args[0].target is torch.ops.aten.arange.default]
    assert adds and all(positions.start_of(n, numbers) is not None for n in adds)
    arange = adds[0].args[0]
    arange.args = (2,)                      # arange(2) + P beside a step of 3
    arange.meta["val"] = torch.empty(2, dtype=torch.int64)
    assert positions.start_of(adds[0], numbers) is None


def test_one_query_head_per_kv_head():
    module = CacheAttention("hf", groups=1)
    sequence = steps()
    _, program, records = rewritten(module, sequence[0])
    assert records[0].rewritten and "per KV head" not in records[0].kernels
    assert matches(program, module, sequence).ok


def test_window_mask_proven_and_keeps_custom_sdpa_away():
    """A sliding window is proven as what it is (causal within 3 rows, for every position):
    no keep factor; the cache is still updated in place, but XNNPACK attends all rows under the
    mask: custom_sdpa would attend the rows the window blocks."""
    module = CacheAttention("hf", mask="window")
    sequence = steps(count=6)
    _, program, records = rewritten(module, sequence[0], llm=True)
    record = records[0]
    window = "causal within a sliding window of 3 cache rows"
    assert record.rewritten and record.llm_declined == \
        f"custom_sdpa: the mask is {window}: custom_sdpa attends every row up to the position"
    assert record.kernels.startswith("llama::update_cache, XNNPACK + portable")
    assert f"mask proven {window}: no fully blocked row" in record.proven
    assert "llama.custom_sdpa.default" not in ops_of(program)
    assert "aten.any.dim" not in ops_of(program)        # no keep factor
    assert matches(program, module, sequence).ok


def test_window_mask_wrong_without_the_proof(monkeypatch):
    """The guard above, removed: custom_sdpa on a window mask differs from eager."""
    monkeypatch.setattr(mask_proof, "prove_mask", lambda *a, **k: plan.CAUSAL)
    module = CacheAttention("hf", mask="window")
    sequence = steps(count=6)
    _, program, records = rewritten(module, sequence[0], llm=True)
    assert records[0].kernels.startswith("llama::")
    assert not matches(program, module, sequence).ok


def padding_case():
    valid = torch.ones(S, dtype=torch.bool)
    valid[0] = False                   # the first step's only key is invalid: an empty row
    module = CacheAttention("hf", mask="padding")
    return module, steps(valid=valid)


def test_padding_mask_empty_rows_keep_factor():
    """A mask read from a user input is not proven: fully blocked rows get eager's zeros."""
    module, sequence = padding_case()
    _, program, records = rewritten(module, sequence[0], llm=True)
    record = records[0]
    assert "fully blocked rows handled by a keep factor" in record.proven
    assert "a user input" in record.llm_declined
    assert matches(program, module, sequence).ok


def test_padding_mask_wrong_without_the_keep_factor(monkeypatch):
    monkeypatch.setattr(mask_proof, "prove_mask", lambda *a, **k: plan.CAUSAL)
    module, sequence = padding_case()
    _, program, _ = rewritten(module, sequence[0])
    assert not matches(program, module, sequence).ok


def test_cache_read_elsewhere_is_left_alone():
    module = CacheAttention("hf", peek=True)
    sequence = steps()
    _, program, records = rewritten(module, sequence[0], llm=True)
    assert records == [] or not any(r.rewritten for r in records)
    assert "aten.scaled_dot_product_attention.default" in ops_of(program)
    updates, refused = pattern.find_updates(program)
    assert "also read by" in refused["b_k_cache"], refused


def test_cache_read_elsewhere_wrong_without_the_guard(monkeypatch):
    """Without the guard, the buffer is re-laid out under a reader that expects [B, Hkv, S, D]:
    the rewrite fails or computes another value."""
    original = pattern._as_update

    def no_guard(buffer, writers, target):
        saved = dict(buffer.users)
        for user in list(buffer.users):
            if user is not writers[0]:
                del buffer.users[user]
        try:
            return original(buffer, writers, target)
        finally:
            buffer.users.update(saved)

    monkeypatch.setattr(pattern, "_as_update", no_guard)
    set_strict(monkeypatch, False)
    module = CacheAttention("hf", peek=True)
    sequence = steps()
    records, verdict = rewritten_and_run(module, sequence)
    assert broken_without_the_guard(records, verdict), records


def test_layers_share_one_start_and_one_mask():
    """transformers copies cache_position[0] into every layer's cumulative_length: one value,
    several nodes; one item() and one additive mask serve all layers."""
    class TwoLayers(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = CacheAttention("hf"), CacheAttention("hf")

        def forward(self, x, cache_position):
            return self.b(self.a(x, cache_position)[..., :E], cache_position)

    module = TwoLayers()
    sequence = steps()
    _, program, records = rewritten(module, sequence[0], llm=True)
    assert all(r.kernels.startswith("llama::") for r in records) and len(records) == 2
    assert sum(n.target is torch.ops.aten.item.default for n in program.graph.nodes) == 1
    assert matches(program, module, sequence).ok


class TwoLayers(nn.Module):
    """Two attentions, each with its cache and its own nodes computing one mask."""

    def __init__(self):
        super().__init__()
        self.a, self.b = CacheAttention("hf"), CacheAttention("hf")

    def forward(self, x, cache_position):
        return self.b(self.a(x, cache_position)[..., :E], cache_position)


def count(program, target) -> int:
    return sum(n.target is target for n in program.graph.nodes)


@pytest.mark.parametrize("visible_rows", [False, True], ids=["every-row", "visible-rows"])
def test_layers_share_one_mask_computation(visible_rows):
    """The mask each layer's rewrite builds (additive, or over the visible rows) is computed
    once for all layers; the model's own mask, no longer read, is not computed at all."""
    module, sequence = TwoLayers(), steps()
    program = copy_program(exported(module, sequence[0]))
    records = kv_cache.rewrite_kv_caches(program, visible_rows=visible_rows)
    assert len(records) == 2 and all(r.rewritten for r in records)
    assert count(program, torch.ops.aten.where.self) == 1
    if visible_rows:   # each layer's positions' arange(L), and arange(P + L): no arange(S) left
        assert count(program, torch.ops.aten.arange.default) == 3
    assert matches(program, module, sequence).ok


def test_each_layer_computes_the_mask_again_without_merging(monkeypatch):
    """The negative test of the step's merge_mask_repeats: one where per layer without it."""
    monkeypatch.setattr(kv_cache, "merge_mask_repeats", lambda graph, created, more: 0)
    module, sequence = TwoLayers(), steps()
    program = copy_program(exported(module, sequence[0]))
    kv_cache.rewrite_kv_caches(program, visible_rows=True)
    assert count(program, torch.ops.aten.where.self) == 2


def test_caches_that_do_not_pair_are_kept():
    """A value cache of another length than the key cache: the rows do not pair."""
    module = CacheAttention("hf")
    sequence = steps()
    ep = exported(module, sequence[0])
    program = copy_program(ep)
    sdpa = next(n for n in program.graph.nodes if n.target is SDPA)
    updates, _ = pattern.find_updates(program)
    value_update = next(u for u in updates.values() if u.target == "v_cache")
    value_update.shape = (1, KV, S + 1, D)       # a value cache of another length
    found = pairing.why_not_sdpa(sdpa_args(sdpa), sdpa.args[0].meta["val"],
                             next(u for u in updates.values() if u.target == "k_cache"),
                             value_update, GROUPS, GROUPS)
    assert "do not pair" in found


def test_dropout_and_dtype_are_kept():
    class Dropout(CacheAttention):
        def forward(self, x, cache_position):
            self.length.copy_(cache_position[0])
            start = self.length.to(torch.int64)
            self.k_cache.index_copy_(2, torch.arange(1) + start, self.k(x).view(1, 1, KV, D)
                                     .transpose(1, 2))
            self.v_cache.index_copy_(2, torch.arange(1) + start, self.v(x).view(1, 1, KV, D)
                                     .transpose(1, 2))
            q = self.q(x).view(1, 1, H, D).transpose(1, 2)
            return F.scaled_dot_product_attention(q, self._repeat(self.k_cache),
                                                  self._repeat(self.v_cache), dropout_p=0.5)

    module = Dropout("hf")
    ep = torch.export.export(module.train(), steps()[0])
    program = copy_program(ep)
    records = kv_cache.rewrite_kv_caches(program)
    assert records[0].kept_because == "dropout_p=0.5: random, not rewritten"


def test_value_numbers_see_through_copies():
    class Copies(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("a", torch.tensor(0), persistent=False)
            self.register_buffer("b", torch.tensor(0), persistent=False)

        def forward(self, position):
            self.a.copy_(position[0])
            self.b.copy_(position[0])
            return self.a.to(torch.int64) + 1, self.b.to(torch.int64) + 1, self.a + self.b

    ep = torch.export.export(Copies(), (torch.tensor([3]),))
    written = set(written_placeholders(ep))
    numbers = ValueNumbers(ep.graph, written)
    outputs = ep.graph.output_node().args[0]
    first, second = outputs[0], outputs[1]
    assert numbers(first.args[0]) is numbers(second.args[0])      # both: position[0]
    assert numbers(first) is numbers(second)                       # the same + 1


def test_explain_names_what_stays_outside():
    module = CacheAttention("hf")
    _, _, records = rewritten(module, steps()[0])
    text = records[0].describe()
    assert text.startswith("kv_cache step: attention")
    assert "index_put" in text and "run_reinplace_pass=True" in text


def scattered_steps():
    """Three tokens a step, written at scattered positions (2, 0, 1 then 5, 3, 4)."""
    gen = torch.Generator().manual_seed(3)
    return [(torch.randn(1, 3, E, generator=gen), torch.tensor(p)) for p in ([2, 0, 1],
                                                                             [5, 3, 4])]


def test_scattered_positions_keep_the_update_on_portable():
    module = CacheAttention("et")
    sequence = scattered_steps()
    _, program, records = rewritten(module, sequence[0], llm=True)
    record = records[0]
    assert record.rewritten and "are not arange(L) + P" in record.llm_declined
    assert "aten.index_put_.default" in ops_of(program)
    assert matches(program, module, sequence).ok


def test_scattered_positions_wrong_without_the_guard(monkeypatch):
    monkeypatch.setattr(positions, "start_of", lambda node, numbers: numbers(node))
    set_strict(monkeypatch, False)
    module = CacheAttention("et")
    sequence = scattered_steps()
    records, verdict = rewritten_and_run(module, sequence)
    assert broken_without_the_guard(records, verdict), records


def test_explain_says_which_kernels_the_pte_needs():
    from xnnfold.explain import Explanation, format_explanation

    for llm, needs in ((False, "XNNPACK and the portable kernels (any runtime)"),
                       (True, "llama::custom_sdpa, llama::update_cache")):
        _, _, records = rewritten(CacheAttention("hf"), steps()[0], llm)
        text = format_explanation(Explanation([], {"kv_cache": records}))
        assert "kernels the .pte needs: " in text and needs in text, text


class LeakyRepeat(CacheAttention):
    """Also returns a sum over the repeated key cache: the repeat must stay."""

    def forward(self, x, cache_position):
        out = super().forward(x, cache_position)
        return out, self._repeat(self.k_cache).sum()


def test_repeated_cache_read_elsewhere_keeps_the_cache_shape():
    module = LeakyRepeat("hf")
    sequence = steps()
    _, program, records = rewritten(module, sequence[0], llm=True)
    record = records[0]
    assert record.rewritten and "is also read by" in record.llm_declined, record
    assert "[B * Hkv" not in record.proven
    assert tuple(program.constants["k_cache"].shape) == (1, KV, S, D)
    assert matches(program, module, sequence).ok


def test_llm_decode_help_answers_before_torch():
    import subprocess
    import sys

    code = ("import sys\nfrom xnnfold.bench.scripts import llm_decode\n"
            "try:\n    llm_decode.main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.strip().endswith("False"), done.stdout[-300:] + done.stderr[-300:]
    assert "--prefill" in done.stdout


def test_mask_evaluated_one_start_at_a_time_where_vmap_cannot():
    """An op without a batching rule: the starts are evaluated one by one, to the same
    verdicts; beyond LOOP_BUDGET evaluations the mask is not proven (a cost, not a guess)."""
    def no_vmap(*args, **kwargs):
        raise RuntimeError("no batching rule")

    for mask, proven in (("causal", True), ("window", False)):
        _, _, records = rewritten(CacheAttention("hf", mask=mask), steps()[0], llm=True)
        assert (records[0].llm_declined is None) == proven
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(torch, "vmap", no_vmap)
            _, _, looped = rewritten(CacheAttention("hf", mask=mask), steps()[0], llm=True)
            assert looped[0].llm_declined == records[0].llm_declined
            patch.setattr(mask_proof, "LOOP_BUDGET", S - 1)
            _, _, refused = rewritten(CacheAttention("hf", mask=mask), steps()[0], llm=True)
            assert "cannot be evaluated in batches" in refused[0].llm_declined
