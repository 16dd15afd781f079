"""The parts of a generation .pte's export and use that need no lowering: the sampling of
``xnnfold generate``, the tokenizer beside the .pte (copied, read as executorch's runner reads
it), the linears' quantization, a one-token ``forward`` for ``--max-prefill 1``, and the
one-line refusals of ``xnnfold hf`` before any work."""

import json
import re

import pytest
import torch
from torch import nn

from xnnfold import cli
from xnnfold.export.llm.runtime import Sampling
from xnnfold.export.llm.text import RunnerTokenizer, copy_tokenizer


# --- sampling ------------------------------------------------------------------------------

LOGITS = torch.tensor([[1.0, 3.0, 2.9, -1.0, 5.0]])


def test_greedy_is_the_first_largest_logit_and_keeps_to_the_vocabulary():
    assert Sampling().picker()(LOGITS) == 4
    assert Sampling().picker()(torch.tensor([[2.0, 7.0, 7.0]])) == 1      # first of a tie
    # ids past the tokenizer's have no text: the runner samples among its ids only
    assert Sampling(vocabulary=3).picker()(LOGITS) == 1


def test_sampling_is_seeded_and_top_p_keeps_the_likeliest():
    draws = [Sampling(temperature=2.0, seed=5).picker() for _ in range(2)]
    first = [draws[0](LOGITS) for _ in range(40)]
    assert first == [draws[1](LOGITS) for _ in range(40)]           # the same seed, the same
    assert len(set(first)) > 2                                       # sampled, not greedy
    # top-p 0.5 at temperature 1: token 4 alone holds 0.78 of the mass
    only_best = Sampling(temperature=1.0, top_p=0.5, seed=5).picker()
    assert {only_best(LOGITS) for _ in range(40)} == {4}
    # top-p 0.85: 4 (0.78), then 1 (0.11) reach it; 2 (0.10) and the rest are cut
    nucleus = Sampling(temperature=1.0, top_p=0.85, seed=5).picker()
    assert {nucleus(LOGITS) for _ in range(200)} == {1, 4}


def _nucleus(logits: torch.Tensor, temperature: float, top_p: float) -> dict:
    """{token: its probability} over the nucleus, by a full sort (the definition)."""
    probs = torch.softmax(logits.double() / temperature, -1)
    ordered, order = probs.sort(descending=True, stable=True)
    kept = (ordered.cumsum(0) - ordered) < top_p
    return {int(t): float(p) / float(ordered[kept].sum())
            for t, p in zip(order[kept], ordered[kept])}


@pytest.mark.parametrize("spread, temperature, top_p", [
    (0.02, 1.0, 0.5),     # a flat row: the vocabulary in a few buckets, the cut inside one
    (1.0, 0.8, 0.9),      # a spread one: the nucleus over many buckets
    (3.0, 1.0, 1.0)])     # no top-p: the whole vocabulary
def test_sampling_draws_from_exactly_the_nucleus_in_proportion(spread, temperature, top_p):
    """The bucketed draw against the definition: the tokens drawn are the nucleus's (a token
    past the cut in the bucket where top-p is reached never comes), at its frequencies."""
    logits = torch.randn(100) * spread
    nucleus = _nucleus(logits, temperature, top_p)
    pick = Sampling(temperature=temperature, top_p=top_p, seed=1).picker()
    draws = [pick(logits.reshape(1, -1)) for _ in range(8000)]
    counts = torch.bincount(torch.tensor(draws), minlength=100).double() / len(draws)
    assert set(draws) <= set(nucleus)
    expected = torch.zeros(100, dtype=torch.float64)
    expected[list(nucleus)] = torch.tensor(list(nucleus.values()), dtype=torch.float64)
    assert 0.5 * float((counts - expected).abs().sum()) < 0.04     # total variation


@pytest.mark.parametrize("temperature", [1e-40, 3e-39])
def test_a_tiny_temperature_keeps_the_top_token(temperature, recwarn):
    """Its inverse beyond float32 (1e-40), or the logits times it (3e-39): the top token, as
    the temperature's limit, and no overflow warning."""
    pick = Sampling(temperature=temperature, top_p=0.9, seed=2).picker()
    assert {pick(LOGITS) for _ in range(20)} == {4}
    assert not [w for w in recwarn if "overflow" in str(w.message)]


def test_sampling_cuts_the_nucleus_inside_one_bucket():
    """Logits 1e-4 apart share a bucket: the cut is the definition's, token by token."""
    logits = torch.arange(40, dtype=torch.float32) * -1e-4
    pick = Sampling(temperature=1.0, top_p=0.25, seed=3).picker()
    drawn = {pick(logits.reshape(1, -1)) for _ in range(2000)}
    assert drawn == set(_nucleus(logits, 1.0, 0.25)) == set(range(10))


@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature=-0.1), "temperature -0.1: expected 0 (greedy) or more"),
    (dict(top_p=0.0), "top_p 0.0: expected more than 0, at most 1"),
    (dict(top_p=1.5), "top_p 1.5: expected more than 0, at most 1"),
    (dict(vocabulary=0), "vocabulary 0: at least 1 token")])
def test_sampling_refuses_what_cannot_sample(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        Sampling(**kwargs)


# --- the tokenizer beside the .pte -----------------------------------------------------------

def test_the_tokenizer_is_copied_beside_the_pte_and_read_as_the_runner_reads_it(tmp_path):
    from byte_tokenizer import byte_level_tokenizer

    folder, out = tmp_path / "model", tmp_path / "out"
    folder.mkdir()
    out.mkdir()
    reference = byte_level_tokenizer(folder / "tokenizer.json", 256)
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    assert copy_tokenizer(folder, out) == out / "tokenizer.json"
    assert sorted(p.name for p in out.iterdir()) == ["tokenizer.json", "tokenizer_config.json"]
    assert copy_tokenizer(folder, folder) == folder / "tokenizer.json"     # nothing to copy
    tokenizer = RunnerTokenizer(out / "tokenizer.json")
    text = "abc defg hij"
    assert tokenizer.vocab_size == 256
    assert tokenizer.encode(text) == reference.encode(text).ids
    assert tokenizer.decode(reference.encode(text).ids) == text
    (out / "tokenizer_config.json").write_text("{}")                 # another model's
    with pytest.raises(ValueError, match="tokenizer_config.json exists and is not"):
        copy_tokenizer(folder, out)
    with pytest.raises(ValueError, match="has no text in tokenizer.json"):
        tokenizer.piece(256)


def test_hf_warns_when_the_runner_would_sample_past_the_logits(tmp_path):
    """executorch's runner sizes its sampler from the tokenizer: more ids than the model has
    logits and it reads past them. hf copies the tokenizer, prints the command lines, and
    says so."""
    from byte_tokenizer import byte_level_tokenizer

    from xnnfold.export.hf.generation import runner_notes

    folder, out = tmp_path / "model", tmp_path / "out"
    folder.mkdir()
    out.mkdir()
    byte_level_tokenizer(folder / "tokenizer.json", 256)
    notes = runner_notes(out / "m.pte", str(folder), False, 200)
    assert notes[0] == ("warning: tokenizer.json has 256 ids, the model 200 logits: "
                        "executorch's runner samples among the tokenizer's ids and would read "
                        "past the logits")
    assert [n.split(":")[0] for n in notes[1:]] == [
        "its tokenizer", "run it", "executorch's runner (Python)", "executorch's runner (C++)"]
    assert not runner_notes(out / "m.pte", str(folder), False, 256)[0].startswith("warning")


def test_a_file_the_runner_cannot_load_is_one_line(tmp_path):
    bad = tmp_path / "tokenizer.json"
    bad.write_text("not json")
    with pytest.raises(ValueError, match="not a tokenizer executorch's runner loads"):
        RunnerTokenizer(bad)


# --- quantization --------------------------------------------------------------------------

def test_linears_quantized_where_the_group_divides_their_input():
    from torchao.quantization import IntxUnpackedToInt8Tensor

    from xnnfold.export.llm.quantize import quantize_linears

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 48), nn.Linear(48, 8))
    assert quantize_linears(model, "8da4w") == 2            # 64 and 32 inputs; 48 is not
    kinds = [isinstance(m.weight, IntxUnpackedToInt8Tensor) for m in (model[0], model[2],
                                                                      model[3])]
    assert kinds == [True, True, False]
    model = nn.Sequential(nn.Linear(48, 8))
    assert quantize_linears(model, "int8") == 1              # per channel: any input size
    with pytest.raises(ValueError, match="has no nn.Linear that 8da4w quantizes"):
        quantize_linears(nn.Sequential(nn.Linear(48, 8)), "8da4w")
    with pytest.raises(ValueError, match="quantization 'int4': expected one of 8da4w, int8"):
        quantize_linears(nn.Sequential(nn.Linear(64, 8)), "int4")


def test_the_caller_model_is_not_quantized():
    import transformers

    from xnnfold.export.llm import export_causal_lm

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, vocab_size=64, max_position_embeddings=16)).eval()
    before = model.lm_head.weight.detach().clone()
    generation = export_causal_lm(model, 8, 1, quantize="int8")
    assert type(model.lm_head.weight) is nn.Parameter and torch.equal(model.lm_head.weight,
                                                                       before)
    # --max-prefill 1: one token a call, a static forward, and the runner told so
    (forward,) = generation.programs.values()
    (ids,) = [n for n in forward.graph.nodes if n.op == "placeholder" and n.name == "input_ids"]
    assert tuple(ids.meta["val"].shape) == (1, 1)
    assert generation.metadata["enable_dynamic_shape"] is False
    assert generation.metadata["get_max_seq_len"] == 1


# --- xnnfold hf refuses before any work ------------------------------------------------------

def _causal_folder(tmp_path, architecture="LlamaForCausalLM", model_type="llama"):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(
        {"architectures": [architecture], "model_type": model_type, "vocab_size": 64,
         "max_position_embeddings": 32}))
    return folder


@pytest.mark.parametrize("extra, message", [
    (["--no-cache"], "--quantize int8: for a causal LM's generation .pte only "
     "(LlamaForCausalLM with --no-cache); `xnnfold lower --quantize` quantizes other programs"),
    ([], None)])
def test_quantize_is_for_the_generation_pte(tmp_path, capsys, monkeypatch, extra, message):
    folder = _causal_folder(tmp_path)
    if message is None:               # a BERT folder: not a causal LM at all
        (folder / "config.json").write_text(json.dumps(
            {"architectures": ["BertForSequenceClassification"], "model_type": "bert",
             "vocab_size": 64, "max_position_embeddings": 32}))
        message = ("--quantize int8: for a causal LM's generation .pte only "
                   "(BertForSequenceClassification); `xnnfold lower --quantize` quantizes "
                   "other programs")
    argv = ["hf", str(folder), "-o", str(tmp_path / "m.pte"), "--quantize", "int8", *extra]
    assert cli.main(argv) == 2
    assert capsys.readouterr().err.strip().endswith(message)


@pytest.mark.parametrize("architecture, model_type", [
    ("LlamaForCausalLM", "llama"),
    ("BartForConditionalGeneration", "bart")])     # its text generation .pte too
def test_a_different_tokenizer_beside_the_output_is_refused(tmp_path, capsys, architecture,
                                                            model_type):
    folder = _causal_folder(tmp_path, architecture, model_type)
    if model_type == "bart":
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps(dict(config, is_encoder_decoder=True)))
    (folder / "tokenizer.json").write_text('{"model": 1}')
    out = tmp_path / "out"
    out.mkdir()
    (out / "tokenizer.json").write_text('{"model": 2}')
    assert cli.main(["hf", str(folder), "-o", str(out / "m.pte")]) == 2
    assert capsys.readouterr().err.strip().endswith(
        f"{out / 'tokenizer.json'} exists and is not {folder}'s tokenizer: write the .pte to "
        "another folder (its tokenizer goes beside it)")


def test_quantize_says_what_it_leaves_in_fp32_in_a_mixture_of_experts():
    """--quantize takes nn.Linear layers; the experts' stacked weights are not: the note says
    so, with their share, instead of 'linears quantized' alone."""
    import transformers

    from xnnfold.export.hf.generation import _experts_left_fp32

    torch.manual_seed(0)
    mixtral = transformers.AutoModelForCausalLM.from_config(transformers.MixtralConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, vocab_size=64, num_local_experts=4))
    llama = transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, vocab_size=64))
    assert _experts_left_fp32(mixtral) == \
        " (the experts' stacked weights, 77% of the parameters, stay fp32)"
    assert _experts_left_fp32(llama) == ""
