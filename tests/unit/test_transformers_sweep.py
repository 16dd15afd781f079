"""``xnnfold bench transformers-sweep``: transformers' classes at tiny dims (sub-configs shrunk,
token ids inside the vocabulary, both towers' inputs), the priority order, why a row is no gain,
and the sweep's resume; the command itself on one class (slow: two lowerings)."""

import csv
import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import seed_everything
from xnnfold.bench import tiny_models, transformers_sweep, transformers_sweep_table
from xnnfold.export.transformers import import_transformers

tf = import_transformers()


def test_tiny_config_shrinks_sub_configs_and_keeps_token_ids_in_the_vocabulary():
    config = tiny_models.tiny_config("clip")
    for sub in (config.text_config, config.vision_config):
        assert sub.hidden_size == tiny_models.HIDDEN and sub.num_hidden_layers == 2
        assert sub.intermediate_size == tiny_models.FF
    assert config.vision_config.image_size == 32 and config.vision_config.patch_size == 8
    assert config.projection_dim == tiny_models.HIDDEN
    text = config.text_config
    assert text.vocab_size == tiny_models.VOCAB
    assert text.bos_token_id < text.vocab_size and text.eos_token_id < text.vocab_size


def test_tiny_config_stage_lists_and_widths():
    seed_everything("transformers_sweep.stages")
    swin = tiny_models.tiny_config("swin")
    assert swin.depths == [1, 1, 1, 1] and swin.num_heads == [1, 1, 1, 1]
    # a layer per stage, the width doubling per stage, the last stage a whole window
    assert swin.num_layers == 4 and swin.hidden_size == swin.embed_dim * 8 == 256
    assert swin.window_size == 2 and swin.image_size == swin.patch_size * 16 == 64
    model = tf.SwinModel(swin).eval()
    with torch.no_grad():
        model(**tiny_models.sample_inputs(model, torch.Generator().manual_seed(0)))
    resnet = tiny_models.tiny_config("resnet")
    assert resnet.hidden_sizes == [8, 16, 32, 64]
    falcon = tiny_models.tiny_config("falcon")
    assert falcon.ffn_hidden_size == tiny_models.FF and falcon.use_cache is False


def test_sample_inputs_fill_both_towers_and_the_decoder():
    seed_everything("transformers_sweep.inputs")
    clip = tf.CLIPModel(tiny_models.tiny_config("clip")).eval()
    inputs = tiny_models.sample_inputs(clip, torch.Generator().manual_seed(0))
    assert set(inputs) == {"input_ids", "attention_mask", "pixel_values"}
    assert tuple(inputs["pixel_values"].shape) == (1, 3, 32, 32)
    assert int(inputs["input_ids"].max()) < tiny_models.VOCAB
    with torch.no_grad():
        clip(**inputs)                                    # the inputs the forward takes
    t5 = tf.T5Model(tiny_models.tiny_config("t5")).eval()
    assert set(tiny_models.sample_inputs(t5, torch.Generator().manual_seed(0))) == {
        "input_ids", "attention_mask", "decoder_input_ids"}


class NeedsBoxes(tf.BertModel):
    def forward(self, input_ids, boxes):
        return super().forward(input_ids=input_ids).last_hidden_state + boxes.sum()


def test_an_input_the_sweep_does_not_build_is_named():
    model = NeedsBoxes(tiny_models.tiny_config("bert"))
    with pytest.raises(LookupError, match="forward needs 'boxes'"):
        tiny_models.sample_inputs(model, torch.Generator().manual_seed(0))


def test_outputs_all_zero_get_the_zero_parameters_drawn():
    """MobileViT at tiny dims outputs zeros (its zero biases): no comparison can judge that."""
    seed_everything("transformers_sweep.zeros")
    model = tf.MobileViTModel(tiny_models.tiny_config("mobilevit")).eval()
    inputs = tiny_models.sample_inputs(model, torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert transformers_sweep._all_zero(model(**inputs))
        assert tiny_models.redraw_zero_parameters(model, torch.Generator().manual_seed(1)) > 0
        assert not transformers_sweep._all_zero(model(**inputs))
    assert not transformers_sweep._all_zero({"logits": torch.ones(2), "mask": torch.zeros(2)})


def test_model_classes_most_used_families_first_each_once():
    classes = tiny_models.model_classes()
    names = [name for name, _ in classes]
    assert len(names) == len(set(names)) > 500
    assert names[:3] == ["BertModel", "RobertaModel", "DistilBertModel"]
    first_heads = names.index("BertLMHeadModel")
    # every priority family's base model comes before any head
    assert {t for _, t in classes[:first_heads]} == set(tiny_models.PRIORITY)
    assert names.index("LlamaForCausalLM") < names.index("BertForSequenceClassification")
    assert names.index("BertForSequenceClassification") < names.index("XLNetModel")


GAIN = {"class": "A", "stock_export": "yes", "xnnfold_export": "yes", "stock_verdict": "ok 1e-7",
        "xnnfold_verdict": "ok 1e-7", "ratio": "0.8", "stock_bytes": "100",
        "xnnfold_bytes": "90", "rewritten": '[{"attention": 2}]'}


@pytest.mark.parametrize("change, why", [
    ({}, []),
    ({"ratio": "0.99", "rewritten": "[{}]"}, ["ratio 0.99", "the pass rewrote nothing"]),
    ({"xnnfold_bytes": "120"}, [".pte 20 bytes larger"]),
    ({"xnnfold_verdict": "WRONG: logits: far"}, ["xnnfold WRONG: logits: far"]),
    ({"xnnfold_export": "stock's fallback"}, ["xnnfold: stock's fallback"]),
    ({"stock_export": "E: no", "xnnfold_export": "A does not export: E: no; stock's exporter "
      "fails the same way", "ratio": ""},
     ["A does not export: E: no; stock's exporter fails the same way"]),
    ({"error": "timed out after 600 s", "ratio": ""}, ["timed out after 600 s"]),
])
def test_why_a_row_is_no_gain(change, why):
    assert transformers_sweep_table.losses({**GAIN, **change}) == why


def test_the_sweep_resumes_where_it_stopped(tmp_path, monkeypatch):
    measured = []

    def run_one(class_name, model_type, folder, timeout, rounds):
        measured.append(class_name)
        return {**GAIN, "class": class_name, "model_type": model_type,
                "ratio": "0.99" if class_name == "C" else "0.8"}

    monkeypatch.setattr(tiny_models, "model_classes",
                        lambda: [("A", "a"), ("B", "b"), ("C", "c"), ("Other", "o")])
    monkeypatch.setattr(transformers_sweep, "_run_one", run_one)
    transformers_sweep.sweep(tmp_path, "^[A-C]$", limit=2, echo=lambda line: None)
    assert measured == ["A", "B"]
    transformers_sweep.sweep(tmp_path, "^[A-C]$", echo=lambda line: None)
    assert measured == ["A", "B", "C"]                   # A and B already in the table
    with open(tmp_path / "sweep.csv", newline="") as file:
        assert [row["class"] for row in csv.DictReader(file)] == ["A", "B", "C"]
    markdown = (tmp_path / "sweep.md").read_text()
    assert "3 classes: 3 built at tiny dims; stock exports 3, xnnfold 3" in markdown
    assert "| C | ratio 0.99 |" in markdown             # no gain, and why


@pytest.mark.slow
def test_the_command_on_one_class(tmp_path):
    """The sweep as a user runs it, on BERT's base model: both export, both right, xnnfold
    with fewer delegate calls; a second run finds it in the table and measures nothing."""
    command = [sys.executable, "-m", "xnnfold", "bench", "transformers-sweep", "-o",
               str(tmp_path), "--classes", "^BertModel$", "--rounds", "5"]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    row = json.loads((tmp_path / "rows" / "BertModel.json").read_text())
    assert row["stock_export"] == row["xnnfold_export"] == "yes", row
    assert row["stock_verdict"].startswith("ok") and row["xnnfold_verdict"].startswith("ok")
    assert row["xnnfold_calls"] < row["stock_calls"] and row["rewritten"] == '[{"attention": 2}]'
    assert 0 < row["ratio"] and row["xnnfold_bytes"] <= row["stock_bytes"]
    again = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert again.returncode == 0 and "0 classes measured" in again.stdout, again.stdout
