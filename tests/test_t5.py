"""T5 generates (``xnnfold.export.seq2seq`` with :mod:`~xnnfold.export.seq2seq.t5`): a T5
folder (test-sized, random weights, :mod:`xnnfold.models.t5`) through ``xnnfold hf`` (one
lowering per variant) into the encoder / text_decoder .pte BART's is, whose greedy tokens
are transformers' ``generate``'s; T5 (ReLU, a tied head scaled by ``d_model ** -0.5``, its
table in the .ptd) and, in the slow set, Flan-T5's layout (gated GELU, an untied head, no
scaling). The relative position bias of each cached step is eager's at its position: checked
on the decoder step before lowering, where a bias computed as at position 0 gives other
tokens. Options the .pte cannot honour are one line, exit 2."""

import json

import pytest
import torch

from conftest import seed_everything
from xnnfold import cli
from xnnfold.export.hf import plan as hf_plan
from xnnfold.export.seq2seq import Seq2SeqProgram
from xnnfold.export.seq2seq.export import DecoderStep, EncoderWithCrossKV, cross_attentions
from xnnfold.export.transformers import import_transformers
from xnnfold.models.t5 import save_t5_folder, t5

NEW = 12
# source lengths of seeded ids (seed 3) whose tokens depend on the position bias, in both
# variants (checked: computed as at position 0, 4 to 10 of the 12 tokens differ)
LENGTHS = (3, 20)
# T5: one layer (a lowering of two costs 38 s of CPU, one 26 s); Flan-T5 (slow): two, the
# second reading the bias the first computed
LAYERS = {"t5": 1, "flan": 2}


def _source(length: int) -> torch.Tensor:
    return torch.randint(2, 200, (1, length), generator=torch.Generator().manual_seed(3))


def _generated(model, source: torch.Tensor) -> list:
    """transformers' greedy tokens after the start token, none stopped at the end token."""
    with torch.no_grad():
        out = model.generate(source, do_sample=False, num_beams=1, max_new_tokens=NEW,
                             min_length=0, eos_token_id=None)
    return out[0, 1:].tolist()


@pytest.fixture(scope="module", params=["t5", pytest.param("flan", marks=pytest.mark.slow)])
def t5_pte(request, tmp_path_factory):
    """(the model as transformers loads the folder, the .pte ``xnnfold hf`` wrote)."""
    seed_everything(f"t5_pte-{request.param}")
    root = tmp_path_factory.mktemp(request.param)
    folder = save_t5_folder(root / "model", t5("test", flan=request.param == "flan",
                                                layers=LAYERS[request.param]))
    pte = root / "t5.pte"
    assert cli.main(["hf", str(folder), "-o", str(pte), "--max-cache", "16"]) == 0
    model = import_transformers().T5ForConditionalGeneration.from_pretrained(str(folder))
    return request.param, model.eval(), pte


@pytest.mark.parametrize("length", LENGTHS)
def test_t5_tokens_equal_greedy_generate(t5_pte, length):
    variant, model, pte = t5_pte
    expected = _generated(model, _source(length))
    assert len(set(expected)) >= 4, expected       # the tokens follow the context
    run = Seq2SeqProgram(pte).generate(_source(length), NEW, stop_at_eos=False)
    assert run.prompt == [0] and run.tokens == expected


def test_the_head_is_what_the_config_says(t5_pte):
    """T5's tied table stored once, in the .ptd that the decoder's lookup and head and the
    encoder's lookup read; Flan-T5's head a table of its own: no .ptd (and its input not
    scaled, as transformers loads it), the token table in the .pte."""
    variant, model, pte = t5_pte
    table = model.shared.weight.detach().numpy().tobytes()
    assert model.config.scale_decoder_outputs == (variant == "t5")
    assert pte.with_suffix(".ptd").is_file() == (variant == "t5")
    assert (table in pte.read_bytes()) == (variant == "flan")
    if variant == "t5":
        ptd = pte.with_suffix(".ptd").read_bytes()
        assert ptd.count(table) == 1 and len(ptd) < len(table) + 1024


def test_generate_command_prints_generates_tokens(t5_pte, capsys):
    variant, model, pte = t5_pte
    if variant != "t5":
        pytest.skip("the command once")
    source = _source(LENGTHS[0])[0].tolist()
    assert cli.main(["generate", str(pte), "--tokens", ",".join(map(str, source)),
                     "--max-new", str(NEW), "--ignore-eos", "--no-warmup"]) == 0
    expected = _generated(model, torch.tensor([source]))
    assert f"generated {NEW} token(s): {','.join(map(str, expected))}" in \
        capsys.readouterr().out.splitlines()


def _greedy_steps(model, source: torch.Tensor) -> list:
    """Greedy tokens of the exported modules run eagerly: the encoder once, then the cached
    decoder step per position."""
    encoder, step = EncoderWithCrossKV(model, "input_ids").eval(), DecoderStep(model, 16).eval()
    tokens = [model.config.decoder_start_token_id]
    with torch.no_grad():
        cross = encoder(source)
        for position in range(NEW):
            logits = step(torch.tensor([[tokens[-1]]]), cross, torch.tensor([position]))
            tokens.append(int(logits[0, -1].argmax()))
    return tokens[1:]


@pytest.fixture(scope="module")
def small_t5():
    return t5("test", layers=LAYERS["t5"])


def test_each_steps_position_bias_is_eagers_at_its_position(small_t5, monkeypatch):
    """The cached step's tokens are generate's; with the decoder's bias computed as at
    position 0 (T5Attention.compute_bias given no past tokens) they are not: the bias, not
    only the tokens, decides them."""
    source = _source(LENGTHS[0])
    expected = _generated(small_t5, source)
    assert _greedy_steps(small_t5, source) == expected
    attention = type(small_t5.decoder.block[0].layer[0].SelfAttention)
    bias = attention.compute_bias
    monkeypatch.setattr(attention, "compute_bias", lambda self, query, key, device=None,
                        past_seen_tokens=0: bias(self, query, key, device,
                                                 0 if self.is_decoder else past_seen_tokens))
    assert _greedy_steps(small_t5, source) != expected


def test_t5_and_mt5_cross_attentions_are_found():
    """Each decoder layer's cross keys/values projections, heads and head size, in T5's layout
    (mT5: the same code under another class)."""
    tf = import_transformers()
    dims = dict(vocab_size=50, d_model=32, d_kv=8, d_ff=64, num_layers=1,
                num_decoder_layers=2, num_heads=4)
    for model in (tf.T5ForConditionalGeneration(tf.T5Config(**dims)),
                  tf.MT5ForConditionalGeneration(tf.MT5Config(**dims))):
        found = cross_attentions(model)
        assert [(k, v, h, d) for k, v, h, d in found] == [
            (b.layer[1].EncDecAttention.k, b.layer[1].EncDecAttention.v, 4, 8)
            for b in model.decoder.block]


def _config_only(tmp_path, architecture="T5ForConditionalGeneration", model_type="t5"):
    folder = tmp_path / model_type
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "architectures": [architecture], "model_type": model_type, "vocab_size": 100,
        "is_encoder_decoder": True, "relative_attention_num_buckets": 32}))
    return str(folder)


def test_t5s_positions_are_the_ptes(tmp_path):
    """T5 names no positions (they are relative); its generation .pte takes 512, and only a
    generation .pte is limited by them."""
    t5_folder = _config_only(tmp_path)
    assert hf_plan.plan(t5_folder).positions == 512
    assert hf_plan.plan(t5_folder, 600, cache=False).positions is None
    mt5 = _config_only(tmp_path, "MT5ForConditionalGeneration", "mt5")
    assert (hf_plan.plan(mt5).kind, hf_plan.plan(mt5).positions) == (hf_plan.SEQ2SEQ, 512)


@pytest.mark.parametrize("options, message", [
    (["--max-cache", "600"], "--max-cache 600: 5 (the check's steps) to the decoder's 512 "
     "positions"),
    (["--tokens", "600"], "--tokens 600 is beyond the model's 512 positions "
     "(T5ForConditionalGeneration)"),
    (["--max-prefill", "8"], "--max-prefill: options of a causal LM's KV cache; "
     "T5ForConditionalGeneration's generation .pte takes --max-cache only"),
    (["--quantize", "8da4w"], "--quantize 8da4w: for a causal LM's generation .pte only "
     "(T5ForConditionalGeneration); `xnnfold lower --quantize` quantizes other programs"),
], ids=["max-cache", "tokens", "max-prefill", "quantize"])
def test_what_the_t5_pte_cannot_honour_is_one_line(tmp_path, capsys, options, message):
    folder = _config_only(tmp_path)
    assert cli.main(["hf", folder, "-o", str(tmp_path / "t5.pte"), *options]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"xnnfold: error: {message}", err
