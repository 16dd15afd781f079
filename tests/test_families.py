"""Causal-LM families beyond the SDPA ones, through the public generation API
(``export_causal_lm`` / ``lower_generation`` / ``Generator``): Gemma2 (eager attention,
soft-capping, sliding windows, GQA), BLOOM (ALiBi), OPT (its positions read from the cache's
length), MPT and Falcon's ALiBi option. Each exports, lowers with every attention taken by the
``kv_cache`` step (no repeated cache, the cache written in place) and generates eager's greedy
tokens; what OPT, MPT and Falcon need to export (:mod:`xnnfold.export.adaptations`) is what
makes them export."""

import gc
import weakref
from collections import Counter

import pytest
import torch

from conftest import seed_everything
from xnnfold.export import adaptations
from xnnfold.models import decoder_lm
from xnnfold.pte.compare import compare_outputs

# one layer (Gemma2's first: a sliding window of DIMS.cache // 4); the tests of the step itself
# cover layers sharing a mask
DIMS = decoder_lm.Dims(hidden=32, layers=1, heads=4, kv_heads=2, vocab=128, cache=24)
PREFILL, PROMPT, NEW = 6, 5, 12
DEFAULT = ("gemma2", "bloom")
SLOW = ("opt", "mpt", "falcon-alibi")


@pytest.fixture(scope="module", params=[*DEFAULT, *(pytest.param(a, marks=pytest.mark.slow)
                                                    for a in SLOW)])
def family(request):
    """(architecture, eager model, the lowered generation) of one family."""
    from xnnfold.export.llm import export_causal_lm, lower_generation
    from xnnfold.pte import inspect_lowered

    arch = request.param
    seed_everything(f"family-{arch}")
    model = decoder_lm.causal_lm(arch, DIMS, seed=1)
    generation = export_causal_lm(model, DIMS.cache, PREFILL)
    delegates = []

    def inspect(edge):
        from executorch.exir.lowered_backend_module import get_lowered_submodules

        for method in generation.programs:
            delegates.extend(weakref.ref(module) for _, module, _ in get_lowered_submodules(
                edge.exported_program(method).graph_module))
        return {method: inspect_lowered(edge.exported_program(method))[0]
                for method in generation.programs}

    lowered = lower_generation(generation, before_emit=inspect)
    gc.collect()
    # read right after the lowering: what a later lowering leaves in the same caches is its own
    lowered.delegates_alive = sum(ref() is not None for ref in delegates)
    lowered.delegates = len(delegates)
    return arch, model, lowered


def test_no_delegate_outlives_the_lowering(family):
    """The lowered delegates (XNNPACK's serialized copy of every weight) are not kept by what
    the lowering leaves behind: here a ShapeEnv of executorch's own traces, and the last node
    XNNPACK's partitioner configs declined (their module-level ``WhyNoPartition``), whose
    graph holds every delegate (xnnfold.export.llm.release)."""
    _, _, lowered = family
    assert lowered.delegates and not lowered.delegates_alive, \
        f"{lowered.delegates_alive} of {lowered.delegates} delegates alive"


def test_every_attention_taken(family):
    """Both methods: each layer's attention rewritten by the kv_cache step, nothing repeated
    on portable (Gemma2's GQA), the cache's rows written in place."""
    arch, _, lowered = family
    for method, partitioner in lowered.partitioners.items():
        records = partitioner.last_result.of("kv_cache")
        assert len(records) == DIMS.layers and all(r.rewritten for r in records), \
            [r.describe() for r in records]
        ops = Counter(lowered.inspected[method])
        # the mask's, once; repeat_kv would add two per layer
        assert ops["aten.expand_copy.default"] <= 1, (method, ops)
        assert "aten.bmm.default" not in ops and "aten._softmax.default" not in ops, ops
        assert ops["aten.index_put.default"] == 2 * DIMS.layers, ops        # in place when emitted


def test_greedy_tokens_equal_eager(family):
    from xnnfold.export.llm import Generator

    arch, model, lowered = family
    seed_everything(f"prompt-{arch}")
    prompt = torch.randint(0, DIMS.vocab, (1, PROMPT))
    run = Generator(lowered.pte).generate(prompt[0].tolist(), NEW, stop_at_eos=False,
                                          keep_logits=True)
    with torch.no_grad():
        reference = model.generate(prompt, max_new_tokens=NEW, min_new_tokens=NEW,
                                   do_sample=False, attention_mask=torch.ones_like(prompt),
                                   output_logits=True, return_dict_in_generate=True)
    assert run.tokens == reference.sequences[0, PROMPT:].tolist()
    verdict = compare_outputs(torch.cat(run.logits), torch.cat(reference.logits),
                              per_row=True)
    assert verdict.ok, verdict


def test_random_tokens_through_the_cache_equal_eager(family):
    """Greedy decoding of a small random model may repeat one token: random tokens fed one by
    one past the sliding window, each step's logits against eager's over the whole sequence."""
    from xnnfold.export.llm import Generator

    arch, model, lowered = family
    seed_everything(f"tokens-{arch}")
    tokens = torch.randint(0, DIMS.vocab, (DIMS.cache - 1,)).tolist()
    generator = Generator(lowered.pte)
    got = [generator.prefill(tokens[:PROMPT])] + [
        generator.step(token, position) for position, token in enumerate(tokens)
        if position >= PROMPT]
    with torch.no_grad():
        eager = model(input_ids=torch.tensor([tokens]), use_cache=False).logits[0, PROMPT - 1:]
    verdict = compare_outputs(torch.stack([g.reshape(-1) for g in got]), eager, per_row=True)
    assert verdict.ok, verdict


@pytest.mark.parametrize("arch", ["opt", pytest.param("mpt", marks=pytest.mark.slow)])
def test_export_fails_without_its_adaptation(arch, monkeypatch):
    """What OPT and MPT are given is what makes their export work: without it torch.export
    or the lowering stops on a data-dependent value (the cache's length read as an int)."""
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    from xnnfold.export.llm import export_causal_lm, lower_generation

    monkeypatch.setattr(adaptations, "adaptations", lambda model: [])
    model = decoder_lm.causal_lm(arch, decoder_lm.Dims(hidden=32, layers=1, heads=4,
                                                       kv_heads=4, vocab=64, cache=8))
    with pytest.raises((torch._dynamo.exc.UserError, GuardOnDataDependentSymNode,
                        RuntimeError), match="data-dependent|Pending unbacked"):
        lower_generation(export_causal_lm(model, 8, 4))


@pytest.mark.slow
def test_falcon_alibi_asserts_the_cache_full_without_its_adaptation(monkeypatch):
    """Falcon's ALiBi over ``past + T`` keys beside a mask over the cache's S rows: without
    the full mask, the export asserts ``past + T == S`` at run time (ops executorch's verifier
    rejects), which holds at one position only."""
    from xnnfold.export.llm import export_causal_lm

    monkeypatch.setattr(adaptations, "adaptations", lambda model: [])
    model = decoder_lm.causal_lm("falcon-alibi", decoder_lm.Dims(
        hidden=32, layers=1, heads=4, kv_heads=4, vocab=64, cache=8))
    generation = export_causal_lm(model, 8, 4)
    decode = generation.programs["forward"]
    assert any(n.target is torch.sym_not for n in decode.graph.nodes)
    assert any(n.target is torch.ops.aten.item.default for n in decode.graph.nodes)


def test_adaptations_named():
    """Which families get what, with the reason (xnnfold hf prints it)."""
    names = {arch: [a.what for a in adaptations.adaptations(decoder_lm.causal_lm(
        arch, decoder_lm.Dims(hidden=32, layers=1, heads=4, kv_heads=4, vocab=64, cache=8)))]
        for arch in ("opt", "falcon-alibi", "mpt", "bloom", "llama")}
    assert names == {"opt": [adaptations.POSITION_IDS], "falcon-alibi": [adaptations.FULL_MASK],
                     "mpt": [adaptations.BOUNDED_LENGTH], "bloom": [], "llama": []}
