"""``xnnfold bench transformers-sweep``: transformers' classes at tiny dims (sub-configs shrunk,
token ids inside the vocabulary, both towers' inputs), the priority order, why a row is no gain
against stock or stock's flag, the totals, the sweep's resume and its re-measure of rows without
the flag's columns, a class that times out; the command itself on one class (slow: three
lowerings)."""

import csv
import json
import os
import subprocess
import sys

from pathlib import Path

import pytest
import torch

from conftest import seed_everything
from xnnfold.bench import tiny_models, transformers_sweep, transformers_sweep_measure, \
    transformers_sweep_table
from xnnfold.export.transformers import import_transformers
from xnnfold.pte import child
from xnnfold.pte.child import ChildDied

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
        assert transformers_sweep_measure._all_zero(model(**inputs))
        assert tiny_models.redraw_zero_parameters(model, torch.Generator().manual_seed(1)) > 0
        assert not transformers_sweep_measure._all_zero(model(**inputs))
    assert not transformers_sweep_measure._all_zero({"logits": torch.ones(2),
                                                     "mask": torch.zeros(2)})


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
        "xnnfold_bytes": "90", "rewritten": '[{"attention": 2}]', "stock_flag_export": "yes",
        "stock_flag_verdict": "ok 1e-7", "stock_flag_bytes": "95", "ratio_flag": "0.81",
        "stock_ms": "1.0", "stock_flag_ms": "0.99", "xnnfold_ms": "0.8"}
FAILS = "A does not export: E: no; stock's exporter fails the same way"
BEFORE_THE_FLAG = {column: "" for column in GAIN if column.startswith(("stock_flag", "ratio_f"))}
NOT_RUNNING = {"stock_flag_verdict": "does not run: RuntimeError: Failed to load method forward",
               "stock_flag_ms": "", "ratio_flag": ""}


@pytest.mark.parametrize("change, why", [
    ({}, []),
    (BEFORE_THE_FLAG, []),                            # a row from before the flag's columns
    ({"ratio": "0.99", "rewritten": "[{}]"}, ["ratio 0.99", "the pass rewrote nothing"]),
    ({"xnnfold_bytes": "120"}, [".pte 20 bytes larger than stock",
                                ".pte 25 bytes larger than the flag's"]),
    ({"xnnfold_verdict": "WRONG: logits: far"}, ["xnnfold WRONG: logits: far"]),
    ({"xnnfold_export": "stock's fallback"}, ["xnnfold: stock's fallback"]),
    ({"stock_export": "E: no", "stock_flag_export": "E: no", "xnnfold_export": FAILS,
      "ratio": "", "ratio_flag": ""}, [FAILS]),
    ({"error": "timed out after 600 s", "ratio": "", "ratio_flag": ""},
     ["timed out after 600 s"]),
    # against the flag: no faster, larger, exports where xnnfold does not, right where it is not
    ({"ratio_flag": "1.01"}, ["ratio_flag 1.01"]),
    ({"stock_flag_bytes": "80"}, [".pte 10 bytes larger than the flag's"]),
    ({"stock_export": "E: no", "xnnfold_export": FAILS, "ratio": "", "ratio_flag": ""},
     [f"xnnfold: {FAILS}"]),
    ({"stock_flag_verdict": "WRONG: logits: far"}, ["stock_flag WRONG: logits: far"]),
    (NOT_RUNNING, ["stock_flag does not run: RuntimeError: Failed to load method forward"]),
    ({**NOT_RUNNING, "stock_flag_bytes": "80"},              # no baseline: not compared
     ["stock_flag does not run: RuntimeError: Failed to load method forward"]),
])
def test_why_a_row_is_no_gain(change, why):
    assert transformers_sweep_table.losses({**GAIN, **change}) == why


def test_the_totals_count_xnnfold_against_both_and_the_flag_against_both():
    rows = [GAIN,                                       # the flag as stock, slower than xnnfold
            {**GAIN, "stock_flag_ms": "0.7", "ratio_flag": "1.14"},   # faster than both
            {**GAIN, "stock_flag_ms": "1.1", "stock_flag_bytes": "101"},  # slower, larger
            {**GAIN, **BEFORE_THE_FLAG},
            {**GAIN, **NOT_RUNNING},
            {"class": "N", "error": "not built: LookupError"}]
    assert transformers_sweep_table.totals(rows) == [
        "6 classes, 5 built at tiny dims. Exports / wrong or not running: stock 5 / 0, "
        "stock_flag 4 / 1, xnnfold 5 / 0.",
        "xnnfold against stock (5 timed): slower (> 1.03) 0, no faster (>= 0.97) 0, "
        ".pte larger 0.",
        "xnnfold against stock_flag (3 timed): slower (> 1.03) 1, no faster (>= 0.97) 1, "
        ".pte larger 0.",
        "stock_flag (3 timed): slower than stock 1, than xnnfold 2; faster than stock 1; "
        ".pte larger than stock's 1, smaller 2."]    # the one not running is no baseline


def test_the_sweep_resumes_where_it_stopped(tmp_path, monkeypatch):
    measured = []

    def run_one(class_name, model_type, folder, timeout, rounds):
        measured.append(class_name)
        return {**GAIN, "class": class_name, "model_type": model_type,
                **({"ratio": "0.99", "ratio_flag": "1.0"} if class_name == "C" else {})}

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
    assert "3 classes, 3 built at tiny dims. Exports / wrong or not running: stock 3 / 0" \
        in markdown
    assert "| C | ratio 0.99; ratio_flag 1.00 |" in markdown     # no gain, and why


def test_rows_without_the_flag_are_measured_again_first_and_replaced_in_place(tmp_path,
                                                                              monkeypatch):
    measured = []

    def run_one(class_name, model_type, folder, timeout, rounds):
        measured.append(class_name)
        return {**GAIN, "class": class_name, "model_type": model_type}

    before_the_flag = ["class", "model_type", "error", "stock_export", "xnnfold_export", "ratio"]
    with open(tmp_path / "sweep.csv", "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerows([before_the_flag, ["A", "a", "", "yes", "yes", "0.8"],
                          ["B", "b", "not built: LookupError: boxes", "", "", ""]])
    monkeypatch.setattr(tiny_models, "model_classes", lambda: [("A", "a"), ("B", "b"),
                                                               ("D", "d")])
    monkeypatch.setattr(transformers_sweep, "_run_one", run_one)
    transformers_sweep.sweep(tmp_path, echo=lambda line: None)
    assert measured == ["D"]                             # not asked: A's row kept as it is
    transformers_sweep.sweep(tmp_path, echo=lambda line: None, redo_missing_variant=True)
    assert measured == ["D", "A"]                        # B was not built, D has the flag's
    with open(tmp_path / "sweep.csv", newline="") as file:
        reader = csv.DictReader(file)
        rows = list(reader)
    assert tuple(reader.fieldnames) == transformers_sweep.FIELDS
    assert [(r["class"], r["stock_flag_export"]) for r in rows] == [
        ("A", "yes"), ("B", ""), ("D", "yes")]
    assert rows[1]["error"] == "not built: LookupError: boxes"


def test_a_redo_that_exports_less_keeps_the_earlier_row(tmp_path, monkeypatch):
    before_the_flag = ["class", "model_type", "error", "stock_export", "xnnfold_export", "ratio"]
    with open(tmp_path / "sweep.csv", "w", newline="") as file:
        csv.writer(file).writerows([before_the_flag, ["A", "a", "", "yes", "yes", "0.8"]])
    monkeypatch.setattr(tiny_models, "model_classes", lambda: [("A", "a")])
    monkeypatch.setattr(transformers_sweep, "_run_one", lambda *args: {
        "class": "A", "model_type": "a", "error": "timed out after 900 s", "stock_export": "yes"})
    transformers_sweep.sweep(tmp_path, echo=lambda line: None, redo_missing_variant=True)
    with open(tmp_path / "sweep.csv", newline="") as file:
        row = next(csv.DictReader(file))
    assert (row["xnnfold_export"], row["ratio"], row["error"]) == ("yes", "0.8", "")


def test_two_sweeps_merge_each_class_once_keeping_the_row_with_more_exports(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    for folder in (one, two):
        folder.mkdir()
    timed_out = {"class": "B", "model_type": "b", "error": "timed out after 900 s",
                 "stock_export": "yes"}
    transformers_sweep.write_rows(one / "sweep.csv", [
        {**GAIN, "class": "A", "model_type": "a"}, timed_out])
    transformers_sweep.write_rows(two / "sweep.csv", [
        {**GAIN, "class": "A", "model_type": "a", "ratio": "0.5"},       # a tie: one's kept
        {**GAIN, "class": "B", "model_type": "b"},                       # more exports: taken
        {**GAIN, "class": "C", "model_type": "c"}])                      # new
    assert transformers_sweep.merge(one, [two]) == 2
    rows = transformers_sweep.read_rows(one / "sweep.csv")
    assert [(r["class"], r["xnnfold_export"]) for r in rows] == [("A", "yes"), ("B", "yes"),
                                                                  ("C", "yes")]
    assert rows[0]["ratio"] == GAIN["ratio"]
    assert "3 classes" in (one / "sweep.md").read_text()
    assert transformers_sweep.merge(one, [two]) == 0                     # idempotent
    with pytest.raises(FileNotFoundError, match="no sweep.csv"):
        transformers_sweep.merge(one, [tmp_path / "none"])


@pytest.mark.parametrize("row, again", [
    (GAIN, False),
    ({**GAIN, **BEFORE_THE_FLAG}, True),
    ({**GAIN, "xnnfold_export": "", "error": "RuntimeError: the flag's .pte"}, True),  # cut short
    ({"class": "N", "error": "not built: LookupError: boxes"}, False),
])
def test_which_rows_lack_a_variant(row, again):
    assert transformers_sweep.lacks_a_variant(row) is again


class TimesOut:
    """In place of :class:`xnnfold.pte.child.Child`: the measurement wrote a stage, then took
    too long (or died: ``ending``)."""

    ending = TimeoutError("no answer in 5 s")

    def __init__(self, function, class_name, model_type, result, rounds, threads, preload):
        Path(result).write_text(json.dumps({"class": class_name, "model_type": model_type,
                                            "stock_export": "yes"}))

    def __enter__(self):
        return self

    def __exit__(self, *exception):
        return None

    def receive(self, timeout):
        raise self.ending


@pytest.mark.parametrize("ending, error", [
    (TimeoutError("no answer in 5 s"), "timed out after 5 s"),
    (ChildDied(-6), "its process was killed by SIGABRT"),
    (RuntimeError("the runner's own"), "RuntimeError: the runner's own"),
])
def test_a_class_that_times_out_or_dies_keeps_what_it_measured(tmp_path, monkeypatch, ending,
                                                                error):
    monkeypatch.setattr(child, "Child", TimesOut)
    monkeypatch.setattr(TimesOut, "ending", ending)
    assert transformers_sweep._run_one("A", "a", tmp_path, 5, 3) == {
        "class": "A", "model_type": "a", "stock_export": "yes", "error": error}


def test_the_flag_variant_lowers_with_stocks_partitioner_and_its_flag(monkeypatch):
    lowered = []
    exporter_class, _ = transformers_sweep_measure.exporters()["stock_flag"]
    monkeypatch.setattr(exporter_class, "_lower",
                        lambda self, model, inputs, config, partitioner: lowered.append(
                            partitioner))
    exporter_class.export_program(object.__new__(exporter_class), None, {}, None)
    (partitioner,) = lowered
    assert type(partitioner).__module__.startswith("executorch.backends.xnnpack")
    assert all(config.force_non_static_weights_for_f32_linear
               for config in partitioner.target_partitioner_configs.values())


@pytest.mark.slow
def test_the_command_on_one_class(tmp_path):
    """The sweep as a user runs it, on BERT's base model: the three export, all right, xnnfold
    with fewer delegate calls than stock with or without its flag; a second run finds it in the
    table and measures nothing."""
    command = [sys.executable, "-m", "xnnfold", "bench", "transformers-sweep", "-o",
               str(tmp_path), "--classes", "^BertModel$", "--rounds", "5"]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    row = json.loads((tmp_path / "rows" / "BertModel.json").read_text())
    assert row["stock_export"] == row["stock_flag_export"] == row["xnnfold_export"] == "yes", row
    assert all(row[f"{v}_verdict"].startswith("ok") for v in transformers_sweep_measure.VARIANTS)
    assert row["xnnfold_calls"] < row["stock_flag_calls"] == row["stock_calls"]
    assert row["rewritten"] == '[{"attention": 2}]'
    assert 0 < row["ratio"] and 0 < row["ratio_flag"]
    assert row["xnnfold_bytes"] <= min(row["stock_bytes"], row["stock_flag_bytes"])
    again = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert again.returncode == 0 and "0 classes measured" in again.stdout, again.stdout
