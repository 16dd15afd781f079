"""``xnnfold hf``: transformers models saved with save_pretrained in a local folder (toy
configs, random weights) to .pte files through xnnfold, with the stock comparison."""

import pytest
import torch

from xnnfold.bench import cli, zoo
from xnnfold.bench.measure import run_pte


def _saved(folder, model):
    model.save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="module")
def tf():
    try:
        return zoo._transformers()
    except zoo.ZooUnavailable as error:
        pytest.skip(str(error))


def _rows(printed: str) -> dict:
    """{(part, variant): [cells]} of the table ``xnnfold hf`` prints."""
    return {tuple(line.split()[:2]): line.split() for line in printed.splitlines()
            if line.split()[1:2] in (["stock"], ["xnnfold"])}


def test_whisper_encoder_and_decoder_step_with_the_stock_comparison(tf, tmp_path, capsys):
    torch.manual_seed(0)
    config = tf.WhisperConfig(vocab_size=512, num_mel_bins=16, d_model=64, encoder_layers=1,
                              decoder_layers=1, encoder_attention_heads=2,
                              decoder_attention_heads=2, encoder_ffn_dim=128,
                              decoder_ffn_dim=128, max_source_positions=50,
                              max_target_positions=16, pad_token_id=0, bos_token_id=1,
                              eos_token_id=2, decoder_start_token_id=1)
    folder = _saved(tmp_path / "whisper", tf.WhisperForConditionalGeneration(config))
    assert cli.main(["hf", str(folder), "-o", str(tmp_path / "w.pte"), "--compare",
                     "--reps", "2"]) == 0
    rows = _rows(capsys.readouterr().out)
    assert set(rows) == {(p, v) for p in ("encoder", "decoder") for v in ("stock", "xnnfold")}
    assert all(cells[2] == "0" for cells in rows.values()), rows        # GEMMs outside
    # the decoder's head is tied to the token table: stock stores it twice, xnnfold once
    assert int(rows["decoder", "xnnfold"][4].replace(",", "")) < \
        int(rows["decoder", "stock"][4].replace(",", "")), rows
    features = torch.randn(1, 16, 100)
    (states,) = run_pte((tmp_path / "w.encoder.pte").read_bytes(), (features,))
    assert states.shape == (1, 50, 64)


def test_causal_lm_and_vit(tf, tmp_path, capsys):
    torch.manual_seed(0)
    gpt2 = _saved(tmp_path / "gpt2", tf.GPT2LMHeadModel(tf.GPT2Config(
        n_layer=1, n_embd=32, n_head=2, vocab_size=100, n_positions=16)))
    vit = _saved(tmp_path / "vit", tf.ViTModel(tf.ViTConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        image_size=16, patch_size=8)))
    # the stock comparison is the whisper test's: here, xnnfold only (one lowering each)
    assert cli.main(["hf", str(gpt2), "-o", str(tmp_path / "lm.pte")]) == 0
    rows = _rows(capsys.readouterr().out)
    assert set(rows) == {("model", "xnnfold")} and rows["model", "xnnfold"][2] == "0", rows
    (logits,) = run_pte((tmp_path / "lm.pte").read_bytes(), (torch.randint(0, 100, (1, 8)),))
    assert logits.shape == (1, 8, 100)
    # GPT-2's lm_head is an nn.Linear tied to the token table: --prefer size stores it once
    assert cli.main(["hf", str(gpt2), "-o", str(tmp_path / "lm-size.pte"), "--prefer",
                     "size"]) == 0
    capsys.readouterr()
    default, size = ((tmp_path / f).stat().st_size for f in ("lm.pte", "lm-size.pte"))
    assert size < default - 100 * 32 * 4 * 0.9, (size, default)
    assert cli.main(["hf", str(vit), "-o", str(tmp_path / "vit.pte")]) == 0
    assert set(_rows(capsys.readouterr().out)) == {("model", "xnnfold")}
    assert (tmp_path / "vit.pte").stat().st_size > 0


def test_a_folder_without_a_config_is_one_line(tf, tmp_path, capsys):
    assert cli.main(["hf", str(tmp_path), "-o", str(tmp_path / "x.pte")]) == 2
    assert capsys.readouterr().err.strip() == \
        f"xnnfold: error: {tmp_path}: no config.json (save the model with save_pretrained)"
