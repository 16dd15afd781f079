"""transformers' own exporter (``transformers.exporters``) lowering through xnnfold
(``xnnfold.export.transformers_exporter``): an encoder and a vision model through ``export``, a
causal LM through ``export_for_generation``, each run on transformers' ExecuTorch runner against
eager, each lowered by xnnfold's partitioner (its record of what the pass rewrote, which stock's
partitioner leaves empty); a model that does not trace is one line naming the reason and
stock's; the fallback, the backend check and the guard of transformers' internals without
lowering."""

import copy
import dataclasses
import logging

import pytest
import torch

from conftest import seed_everything
from xnnfold.errors import StrictFallback
from xnnfold.export import transformers_exporter as xt
from xnnfold.export.transformers import import_transformers
from xnnfold.pte import compare_outputs, inspect_lowered

tf = import_transformers()         # a test requirement: a failure to import fails the tests
from transformers.exporters import (AutoExportConfig, AutoHfExporter,  # noqa: E402
                                    ExecutorchConfig, ExportedModel)
from transformers.exporters.runners.runner_executorch import ExecutorchModelRunner  # noqa: E402
from transformers.exporters.utils import decompose_for_generation  # noqa: E402

GEMMS = ("aten.linear", "aten.addmm", "aten.mm", "aten.bmm", "aten.convolution")


def _gemms_outside(program) -> list:
    ops, _, _, _ = inspect_lowered(program.exported_program())
    return [op for op in ops if op.startswith(GEMMS)]


@pytest.fixture(scope="module")
def bert():
    seed_everything("transformers_exporter.bert")
    config = tf.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=64, vocab_size=100, max_position_embeddings=32)
    model = tf.BertModel(config).eval()
    inputs = {"input_ids": torch.randint(0, 100, (1, 8)),
              "attention_mask": torch.tensor([[1] * 6 + [0] * 2])}
    with torch.no_grad():
        expected = model(**inputs)
    xt.register()
    exporter = AutoHfExporter.from_config(xt.XnnfoldConfig())
    return exporter, exporter.export(model, dict(inputs), xt.XnnfoldConfig()), inputs, expected


def test_bert_through_auto_exporter_on_transformers_runner(bert):
    exporter, exported, inputs, expected = bert
    assert type(exporter) is xt.XnnfoldExecutorchExporter
    assert exported.export_format == "xnnfold"
    assert all(type(r) is ExecutorchModelRunner for r in exported.runners.values())
    # xnnfold's partitioner lowered it: its attention step rewrote each layer's attention
    assert exporter.rewritten == [{"attention": 2}], exporter.rewritten
    assert _gemms_outside(exported.program) == []
    outputs = exported(**inputs)
    for name in ("last_hidden_state", "pooler_output"):
        verdict = compare_outputs(outputs[name], expected[name])
        assert verdict.ok, (name, verdict)


def test_bert_saved_and_loaded_back(bert, tmp_path):
    _, exported, inputs, expected = bert
    exported.save_pretrained(tmp_path)
    loaded = ExportedModel.from_pretrained(tmp_path)
    assert loaded.export_format == "xnnfold"
    verdict = compare_outputs(loaded(**inputs)["last_hidden_state"], expected.last_hidden_state)
    assert verdict.ok, verdict


def test_vit_through_export(tmp_path):
    config = tf.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                          intermediate_size=64, image_size=32, patch_size=8)
    model = tf.ViTForImageClassification(config).eval()
    inputs = {"pixel_values": torch.randn(1, 3, 32, 32)}
    with torch.no_grad():
        expected = model(**inputs).logits
    exporter = xt.XnnfoldExecutorchExporter()
    exported = exporter.export(model, dict(inputs), {"backend": "xnnpack"})
    assert exporter.rewritten == [{"attention": 2}], exporter.rewritten
    assert _gemms_outside(exported.program) == []
    verdict = compare_outputs(exported(**inputs).logits, expected)
    assert verdict.ok, verdict


def test_llama_through_export_for_generation():
    config = tf.LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                            num_key_value_heads=2, intermediate_size=64, vocab_size=100,
                            max_position_embeddings=64)
    model = tf.LlamaForCausalLM(config).eval()
    inputs = {"input_ids": torch.randint(0, 100, (1, 6)),
              "attention_mask": torch.ones(1, 6, dtype=torch.long)}
    generation = tf.GenerationConfig(cache_implementation="static", max_cache_len=16,
                                     max_new_tokens=2)
    exporter = xt.XnnfoldExecutorchExporter()
    exported = exporter.export_for_generation(model, dict(inputs), xt.XnnfoldConfig(),
                                              generation_config=generation)
    assert list(exported.components) == ["prefill", "decode"]
    # the decode's attention reads the cache it is given: the KV-cache step's
    assert exporter.rewritten == [{"attention": 1}, {"kv_cache": 1}], exporter.rewritten
    stages = decompose_for_generation(model, dict(inputs), generation_config=generation)
    for name, component in exported.components.items():
        assert _gemms_outside(component.program) == [], name
        ops, _, _, _ = inspect_lowered(component.program.exported_program())
        # no copy of a written input a re-trace adds (copy); in the decode no repeat of the
        # cache (expand_copy) and its write in place (index_put_, the step's rows), not into
        # a copy of it (index_put)
        left = ("aten.copy.", "aten.expand_copy", "aten.index_put.") if name == "decode" \
            else ("aten.copy.",)
        assert not [op for op in ops if op.startswith(left)], (name, sorted(set(ops)))
        assert name != "decode" or ops.count("aten.index_put_.default") == 2, sorted(ops)
        submodel, forward_inputs = stages[name]
        with torch.no_grad():
            expected = submodel(**copy.deepcopy(forward_inputs))
        outputs = exported.runners[name](**copy.deepcopy(forward_inputs))
        verdict = compare_outputs(outputs.logits, expected.logits, per_row=True)
        assert verdict.ok, (name, verdict)
        verdict = compare_outputs(outputs.cache, expected.cache)     # the cache it wrote
        assert verdict.ok, (name, verdict)


class BranchingBert(tf.BertModel):
    """A branch on a value: torch.export cannot trace it, with either partitioner."""

    def forward(self, input_ids):
        hidden = super().forward(input_ids=input_ids).last_hidden_state
        if hidden.sum() > 0:
            return hidden * 2
        return hidden


def test_a_model_that_does_not_trace_is_one_line():
    config = tf.BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                           intermediate_size=32, vocab_size=50, max_position_embeddings=16)
    model = BranchingBert(config).eval()
    with pytest.raises(xt.ExportFailed) as failure:
        xt.XnnfoldExecutorchExporter().export(
            model, {"input_ids": torch.ones(1, 4, dtype=torch.long)}, xt.XnnfoldConfig())
    message = str(failure.value)
    assert "\n" not in message
    assert message.startswith("BranchingBert does not export: GuardOnDataDependentSymNode: "
                              "Could not guard on data-dependent expression"), message
    assert "in forward)" in message and message.endswith("stock's exporter fails the same way")


# --------------------------------------------------------------------------------------------
# Without lowering: the fallback to stock, the backend, the guard, the registration.


class Lowering:
    """Stands in for both lowerings: xnnfold's (``_lower``) fails with ``xnnfold_error``;
    stock's (``_lower_as_stock``) returns ``"stock program"`` or fails with ``stock_error``."""

    def __init__(self, exporter, monkeypatch, xnnfold_error, stock_error=None):
        self.xnnfold_error, self.stock_error, self.calls = xnnfold_error, stock_error, []
        monkeypatch.setattr(exporter, "_lower", self.xnnfold)
        monkeypatch.setattr(exporter, "_lower_as_stock", self.stock)

    def xnnfold(self, model, sample_inputs, config, partitioner):
        self.calls.append("xnnfold")
        raise self.xnnfold_error

    def stock(self, model, sample_inputs, config):
        self.calls.append("stock")
        if self.stock_error is not None:
            raise self.stock_error
        return "stock program", "metadata"


@pytest.fixture
def exporter():
    return xt.XnnfoldExecutorchExporter()


@pytest.mark.fallback_expected
def test_where_xnnfold_fails_stock_exports_it_with_a_warning(exporter, monkeypatch, caplog):
    lowering = Lowering(exporter, monkeypatch, RuntimeError("partition broke\ndetails"))
    caplog.set_level(logging.WARNING, logger="xnnfold")
    assert exporter.export_program(torch.nn.Identity(), {}, xt.XnnfoldConfig()) == \
        ("stock program", "metadata")
    assert lowering.calls == ["xnnfold", "stock"]
    (record,) = [r for r in caplog.records if r.name == "xnnfold"]
    assert record.getMessage() == ("xnnfold's exporter failed on Identity (RuntimeError: "
                                   "partition broke): exported as stock exports it")


def test_the_fallback_raises_in_strict_mode(exporter, monkeypatch):
    Lowering(exporter, monkeypatch, RuntimeError("partition broke"))
    with pytest.raises(StrictFallback, match="partition broke"):
        exporter.export_program(torch.nn.Identity(), {}, xt.XnnfoldConfig())


def test_both_failing_differently_names_both(exporter, monkeypatch):
    Lowering(exporter, monkeypatch, RuntimeError("a"), ValueError("b"))
    with pytest.raises(xt.ExportFailed) as failure:
        exporter.export_program(torch.nn.Identity(), {}, xt.XnnfoldConfig())
    assert str(failure.value) == ("Identity does not export: RuntimeError: a; stock's exporter "
                                  "fails too (ValueError: b)")


def test_another_backend_is_refused_before_any_work(exporter, monkeypatch):
    lowering = Lowering(exporter, monkeypatch, RuntimeError("never"))
    with pytest.raises(ValueError, match="lowers for XNNPACK, not backend 'cuda'"):
        exporter.export_program(torch.nn.Identity(), {}, xt.XnnfoldConfig(backend="cuda"))
    assert lowering.calls == []


def test_the_trace_runs_under_stock_format_for_the_quantizer(exporter, monkeypatch):
    """A PT2E quantizer checks the export format it is traced under: xnnfold's trace is
    stock's, under ``"executorch"``."""
    traced = []

    def trace(self, model, sample_inputs, config):
        config.quantizer.validate_environment(config.export_format)
        traced.append(config.export_format)
        raise KeyError("stop after the trace")

    monkeypatch.setattr(xt.DynamoExporter, "export_program", trace)
    quantizer = tf.exporters.PT2EQuantizer(quantizer=None)
    config = xt.XnnfoldConfig(quantizer=quantizer)
    with pytest.raises(KeyError, match="stop after the trace"):
        exporter._lower(torch.nn.Identity(), {}, config, xt.XnnpackPartitioner())
    with pytest.raises(KeyError, match="stop after the trace"):
        exporter._lower_as_stock(torch.nn.Identity(), {}, config)
    assert traced == ["executorch", "executorch"]


def test_transformers_internals_that_differ_raise_naming_the_version(monkeypatch):
    xt.check_transformers()                                  # the installed one: as mirrored
    monkeypatch.setattr(xt, "STOCK_EXPORT_PROGRAM_SHA256", "0" * 64)
    with pytest.raises(xt.TransformersMismatch,
                       match=rf"transformers {tf.__version__}'s ExecutorchExporter.export_program "
                             "differs from 5.25.0's"):
        xt.XnnfoldExecutorchExporter()
    monkeypatch.undo()
    monkeypatch.delattr(xt._stock, "_get_backend_config")
    with pytest.raises(xt.TransformersMismatch, match="has no _get_backend_config"):
        xt.register()


def test_registered_once_beside_stock(monkeypatch):
    xt.register()
    registrations, register_backend = [], xt._auto.register_backend
    monkeypatch.setattr(xt._auto, "register_backend",
                        lambda *a: registrations.append(a) or register_backend(*a))
    assert xt.register() is xt.XnnfoldExecutorchExporter
    xt.XnnfoldExecutorchExporter()
    assert registrations == []            # already registered: not again (transformers warns)
    monkeypatch.delitem(xt._auto.EXPORT_BACKENDS, "xnnfold")
    xt.register()
    assert registrations == [(xt.XnnfoldExecutorchExporter, ExecutorchModelRunner)]
    config = AutoExportConfig.from_dict(dataclasses.asdict(xt.XnnfoldConfig()))
    assert type(config) is xt.XnnfoldConfig
    assert type(AutoHfExporter.from_config(ExecutorchConfig())).__name__ == "ExecutorchExporter"
