"""``xnnfold hf`` on an audio-text-to-text folder (a tiny Voxtral: Whisper-like audio encoder,
projector, Llama; random weights, a byte-level tokenizer with an ``[AUDIO]`` token): the .pte
executorch's ``MultimodalRunner`` runs with an ``Audio`` input
(:mod:`xnnfold.export.multimodal.audio`), one lowering for the module; the runner's greedy
text against transformers' ``generate`` on the same mel features and prompt; ``xnnfold
generate --audio`` and its one-line errors."""

import json
from pathlib import Path

import pytest
import torch

from conftest import seed_everything
from xnnfold import cli
from xnnfold.export import hf
from xnnfold.export.hf import plan as hf_plan

VOCAB, AUDIO_TOKEN, NEW, BINS, FRAMES, PER_CHUNK = 300, 299, 12, 16, 64, 8
BEFORE, AFTER = [5, 40, 7], [81, 9, 120]


def _tiny_voxtral(transformers):
    audio = transformers.VoxtralEncoderConfig(
        hidden_size=32, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
        num_mel_bins=BINS, max_source_positions=FRAMES // 2)
    text = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, vocab_size=VOCAB, max_position_embeddings=256,
        bos_token_id=0, eos_token_id=1)
    config = transformers.VoxtralConfig(audio_config=audio, text_config=text,
                                        audio_token_id=AUDIO_TOKEN)
    model = transformers.VoxtralForConditionalGeneration(config).eval()
    # at the default init (std 0.02) the audio's embeddings are as small as the text's and the
    # text hardly depends on them (measured: the audio reversed in time, the same 12 tokens)
    for linear in (model.model.multi_modal_projector.linear_1,
                   model.model.multi_modal_projector.linear_2):
        torch.nn.init.normal_(linear.weight, std=0.1)
    return model


def _tokenizer(folder: Path) -> None:
    """A byte-level tokenizer whose last id is ``[AUDIO]``."""
    from byte_tokenizer import byte_level_tokenizer
    from tokenizers import AddedToken

    tokenizer = byte_level_tokenizer(folder / "tokenizer.json", VOCAB - 1)
    tokenizer.add_special_tokens([AddedToken("[AUDIO]", special=True)])
    tokenizer.save(str(folder / "tokenizer.json"))


@pytest.fixture(scope="module")
def voxtral(tmp_path_factory):
    """(the model as xnnfold hf loads it, one chunk of features, .pte, what xnnfold hf
    returned)."""
    import transformers

    seed_everything("voxtral")
    root = tmp_path_factory.mktemp("voxtral")
    _tiny_voxtral(transformers).save_pretrained(str(root / "folder"))
    _tokenizer(root / "folder")
    model = transformers.VoxtralForConditionalGeneration.from_pretrained(
        str(root / "folder")).eval()
    features = torch.randn(1, BINS, FRAMES)
    pte = root / "out" / "voxtral.pte"
    pte.parent.mkdir()
    plan = hf_plan.plan(str(root / "folder"), tokens=4, max_cache=64)
    exported = hf.export_folder(plan, str(pte), tokens=4, max_cache=64)
    return model, features, pte, exported


def _ids(chunks: int = 1) -> list:
    return BEFORE + [AUDIO_TOKEN] * PER_CHUNK * chunks + AFTER


def _eager_greedy(model, ids, features) -> list:
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor([ids]), input_features=features,
                             max_new_tokens=NEW, do_sample=False)
    return out[0, len(ids):].tolist()


def _runner_pieces(pte: Path, inputs: list) -> list:
    from executorch.extension.llm.runner import GenerationConfig, MultimodalRunner

    runner = MultimodalRunner(str(pte), str(pte.parent / "tokenizer.json"))
    pieces = []
    runner.generate(inputs, GenerationConfig(max_new_tokens=NEW, temperature=0.0, echo=False),
                    pieces.append)
    return pieces


def _audio_prompt(features, before=BEFORE, after=AFTER) -> list:
    from executorch.extension.llm.runner import make_audio_input, make_token_input

    audio = [make_audio_input(chunk.unsqueeze(0).contiguous()) for chunk in features]
    return [make_token_input(before)] * bool(before) + audio + [make_token_input(after)]


def _pieces_of(pte: Path, tokens: list) -> list:
    from xnnfold.export.llm.text import RunnerTokenizer

    tokenizer = RunnerTokenizer(pte.parent / "tokenizer.json")
    return [tokenizer.piece(t) for t in tokens]


def test_runner_text_is_eager_greedy(voxtral):
    """executorch's MultimodalRunner on the .pte and the tokenizer beside it, the prompt's
    tokens around one chunk of mel features: its pieces are those of transformers' greedy
    tokens on the same features and prompt."""
    model, features, pte, exported = voxtral
    assert not exported.wrong, exported.wrong
    tokens = _eager_greedy(model, _ids(), features)
    assert len(tokens) == NEW and len(set(tokens)) > NEW // 4, tokens
    assert _runner_pieces(pte, _audio_prompt(features)) == _pieces_of(pte, tokens)


def test_the_audio_and_its_place_decide_the_text(voxtral):
    """Negative: the same tokens with the audio's embeddings before them (not at the audio
    tokens), the audio reversed in time, or no audio at all, give another text: the check
    above can tell where the audio went and which it was."""
    from executorch.extension.llm.runner import make_token_input

    _, features, pte, _ = voxtral
    right = _runner_pieces(pte, _audio_prompt(features))
    assert _runner_pieces(pte, _audio_prompt(features, [], BEFORE + AFTER)) != right
    assert _runner_pieces(pte, _audio_prompt(features.flip(-1))) != right
    assert _runner_pieces(pte, [make_token_input(BEFORE + AFTER)]) != right


def test_a_long_audio_is_its_chunks_one_after_the_other(voxtral):
    """Two chunks (the processor's input_features of a long audio, one run of their audio
    tokens): given to the runner as one Audio input each, the text is transformers' on the
    batch of both."""
    model, _, pte, _ = voxtral
    features = torch.randn(2, BINS, FRAMES)
    tokens = _eager_greedy(model, _ids(2), features)
    assert _runner_pieces(pte, _audio_prompt(features)) == _pieces_of(pte, tokens)


def test_rows_checked_and_the_audio_encoder_delegated(voxtral):
    """The audio encoder's GEMMs (its two convolutions, attention, MLP, the projector) and
    the text decoder's all on XNNPACK; every phase's outputs match eager; the runner's
    command line printed."""
    *_, pte, exported = voxtral
    rows = {(r["part"], r["variant"]): r for r in exported.rows}
    assert set(rows) == {(p, "xnnfold") for p in ("audio_encoder", "prefill", "decode")}
    assert all(r["gemms_outside"] == 0 and r["delegate_calls"] >= 1 for r in rows.values())
    assert all(r["outputs"].startswith("max abs diff") for r in rows.values()), rows
    assert any("MultimodalRunner(" in note and "make_audio_input" in note
               for note in exported.notes), exported.notes


def test_generate_with_audio_is_eager_greedy(voxtral, tmp_path, capsys):
    model, features, pte, _ = voxtral
    torch.save(features, tmp_path / "features.pt")
    assert cli.main(["generate", str(pte), "--audio", str(tmp_path / "features.pt"),
                     "--tokens", ",".join(map(str, _ids())), "--max-new", str(NEW),
                     "--ignore-eos", "--no-warmup"]) == 0
    printed = capsys.readouterr().out
    eager = _eager_greedy(model, _ids(), features)
    assert f"generated {NEW}: " + ",".join(map(str, eager)) in printed


@pytest.mark.parametrize("shape, prompt, said", [
    ((1, 80, FRAMES), "ab <audio> cd", "audio features of shape (1, 80, 64): this .pte's "
     f"audio encoder takes chunks of {BINS} mel bins x {FRAMES} frames"),
    ((1, BINS, 3000), "ab <audio> cd", "audio features of shape (1, 16, 3000)"),
    (None, "ab <audio> cd", "the prompt's audio tokens take 1 chunk(s) of audio (8 audio "
     "tokens 299 each) and 0 chunk(s) are given"),
    ((1, BINS, FRAMES), "ab cd", "the prompt's audio tokens take 0 chunk(s) of audio"),
])
def test_a_wrong_audio_or_prompt_is_one_line(voxtral, tmp_path, capsys, shape, prompt, said):
    *_, pte, _ = voxtral
    audio = []
    if shape is not None:
        torch.save(torch.randn(shape), tmp_path / "features.pt")
        audio = ["--audio", str(tmp_path / "features.pt")]
    assert cli.main(["generate", str(pte), "--prompt", prompt, "--no-warmup"] + audio) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and said in err, err


def test_a_run_of_audio_tokens_that_is_not_whole_chunks_is_one_line(voxtral, tmp_path,
                                                                    capsys):
    *_, pte, _ = voxtral
    torch.save(torch.randn(1, BINS, FRAMES), tmp_path / "features.pt")
    ids = BEFORE + [AUDIO_TOKEN] * (PER_CHUNK - 1) + AFTER
    assert cli.main(["generate", str(pte), "--audio", str(tmp_path / "features.pt"),
                     "--tokens", ",".join(map(str, ids)), "--no-warmup"]) == 2
    err = capsys.readouterr().err.strip()
    assert "a run of 7 audio tokens (299): a chunk of audio is 8 of them" in err, err


def _folder(tmp_path, **config):
    (tmp_path / "config.json").write_text(json.dumps(dict(
        architectures=["VoxtralForConditionalGeneration"], model_type="voxtral",
        audio_config={}, text_config={"max_position_embeddings": 64}, **config)))
    return str(tmp_path)


def test_a_voxtral_folder_is_planned_for_the_runner(tmp_path):
    plan = hf_plan.plan(_folder(tmp_path), tokens=4, max_cache=32)
    assert (plan.kind, plan.positions) == (hf_plan.AUDIO_TEXT, 64)


@pytest.mark.parametrize("option, said", [
    (["--no-cache"], "--no-cache: VoxtralForConditionalGeneration's .pte for executorch's "
     "MultimodalRunner has a KV cache on XNNPACK"),
    (["--quantize", "8da4w"], "--quantize 8da4w: for a causal LM's generation .pte only"),
])
def test_options_of_a_text_pte_alone_are_one_line(tmp_path, capsys, option, said):
    """Refused from config.json, before the weights load (the folder has none)."""
    assert cli.main(["hf", _folder(tmp_path), "-o", str(tmp_path / "x.pte")] + option) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and said in err, err


def test_the_prefill_takes_a_chunk_in_one_call():
    """max_prefill below a chunk's embeddings is one line, before torch.export."""
    import transformers

    from xnnfold.export.multimodal.audio import export_audio_text_to_text

    seed_everything("voxtral-prefill")
    with pytest.raises(ValueError, match="max_prefill 4: the runner prefills an audio "
                       "chunk's 8 embeddings in one call"):
        export_audio_text_to_text(_tiny_voxtral(transformers), max_cache=64, max_prefill=4)


def test_an_image_text_class_is_not_an_audio_one():
    from xnnfold.export.multimodal.audio import check_audio_supported

    with pytest.raises(ValueError, match="LlavaForConditionalGeneration: no "
                       "audio-text-to-text export for it yet; supported: "
                       "VoxtralForConditionalGeneration"):
        check_audio_supported(type("LlavaForConditionalGeneration", (torch.nn.Module,), {})())


@pytest.mark.parametrize("files, copied, prompt", [
    (["tokenizer.json", "tekken.json"], "tokenizer.json", "--prompt '<audio> What is said?'"),
    (["tekken.json"], "tekken.json", "--tokens IDS (the prompt's ids, 8 audio tokens 299 a "
     "chunk)"),
])
def test_the_runner_is_given_the_folders_tokenizer(tmp_path, files, copied, prompt):
    """Voxtral's published folder has mistral-common's tekken.json, which executorch's runner
    loads by that name: copied beside the .pte when the folder has no tokenizer.json (which
    comes first); xnnfold generate, which cannot read it, is shown with token ids."""
    from xnnfold.export.hf.audio import runner_notes

    folder, out = tmp_path / "folder", tmp_path / "out"
    folder.mkdir(), out.mkdir()
    for name in files:
        (folder / name).write_text(json.dumps({"name": name}))
    notes = runner_notes(out / "v.pte", str(folder), {"get_audio_token_id": AUDIO_TOKEN,
                                                      "get_audio_tokens": PER_CHUNK})
    assert sorted(p.name for p in out.iterdir()) == [copied]
    assert notes[0] == f"its tokenizer: {out / copied} (copied from {folder})"
    assert prompt in notes[1] and f"MultimodalRunner('{out / 'v.pte'}', '{out / copied}')" \
        in notes[2], notes
    (folder / copied).write_text("another")
    if copied == "tekken.json":      # never over another file of that name
        assert "exists and is not" in runner_notes(out / "v.pte", str(folder), {})[0]
        assert (out / copied).read_text() != "another"


# two more lowerings (about 20 s of CPU): slow; by default the rows test above checks the
# .pte's own GEMMs
@pytest.mark.slow
def test_the_audio_encoder_against_stock(voxtral):
    """The audio encoder alone, lowered by xnnfold and by stock (the shared check: eager's
    outputs, never worse than stock): every GEMM (the convolutions, the projections, the
    projector) in XNNPACK, and nothing of the attention outside; the layer norms stay on
    portable kernels, as in stock's lowering (XNNPACK 1.5.1 has no layer norm)."""
    from conftest import assert_all_delegated, check_lowering
    from xnnfold.export.multimodal.audio import AudioEmbeddings

    model, features, _, _ = voxtral
    checked = check_lowering(AudioEmbeddings(model).eval(), (features,))
    assert_all_delegated(checked)
    assert set(checked.folded.ops_outside) == {"aten.native_layer_norm.default",
                                               "aten.unsqueeze_copy.default"}, \
        checked.folded.ops_outside
    assert "aten.where.self" in checked.stock.ops_outside       # the safe softmax's glue
