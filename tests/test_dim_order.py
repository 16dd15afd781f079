"""Programs the ExecuTorch runtime refuses for dim orders (xnnfold.dim_order), on the runtime:
transformers' OneFormer query decoder, whose ``attention_mask[torch.where(...)] = False`` no
.pte of executorch 1.5.1 runs (xnnfold.steps.mask_index makes it run), and the table of
kernels the check asks, against the wheel's runtime."""

import pytest
import torch
import torch.nn.functional as F
from executorch.exir import to_edge_transform_and_lower
from torch import nn

from xnnfold import pipeline
from xnnfold.pte import XNNFOLD, compare_outputs, lower, run_pte
from xnnfold.dim_order import dim_order_conflicts

from conftest import PASS_THROUGH, check_where_stock_fails_to_lower, seed_everything

HIDDEN = 16


class QueryDecoder(nn.Module):
    """transformers' OneFormerTransformerModule (the query decoder: learned queries, masked
    cross-attention whose mask rows that block every key are let through with
    ``attention_mask[torch.where(attention_mask.sum(-1) == attention_mask.shape[-1])] =
    False``, self-attention, the mask and class heads), toy dims, one masked layer."""

    def __init__(self, transformers):
        super().__init__()
        from transformers.models.oneformer.modeling_oneformer import OneFormerTransformerModule

        config = transformers.OneFormerConfig(
            hidden_dim=HIDDEN, num_attention_heads=2, dim_feedforward=32, decoder_layers=2,
            query_dec_layers=1, num_queries=5, mask_dim=HIDDEN, num_labels=3, conv_dim=HIDDEN,
            enforce_input_proj=False, use_auxiliary_loss=False)
        self.module = OneFormerTransformerModule(HIDDEN, config)

    def forward(self, f0, f1, f2, mask_features, task_token):
        out = self.module([f0, f1, f2], mask_features, task_token)
        # contrastive_logits is the queries the decoder also clones: stock's delegate would
        # return one node twice ("already in the inputs"), so stock cannot lower it
        return out.object_queries, out.contrastive_logits, out.prediction_masks, \
            out.prediction_class


@pytest.fixture(scope="module")
def query_decoder():
    import transformers

    seed_everything("query_decoder")
    model = QueryDecoder(transformers).eval()
    inputs = (torch.randn(1, HIDDEN, 2, 2), torch.randn(1, HIDDEN, 4, 4),
              torch.randn(1, HIDDEN, 8, 8), torch.randn(1, HIDDEN, 8, 8), torch.randn(1, HIDDEN))
    return model, inputs


def dim_order_warnings(log) -> list:
    return [r.getMessage() for r in log.records
            if r.name == "xnnfold" and "for the dim orders" in r.getMessage()]


def test_oneformer_query_decoder_runs_and_matches_eager(query_decoder, xnnfold_log):
    model, inputs = query_decoder
    checked = check_where_stock_fails_to_lower(model, inputs, stock_error=PASS_THROUGH)
    assert [(r.node, r.where_removed) for r in checked.fold.of("mask_index")] == [("index_put_", True)]
    assert dim_order_warnings(xnnfold_log) == []


def test_without_the_mask_index_step_the_lowering_names_what_will_fail(
        query_decoder, monkeypatch, xnnfold_log):
    # The .pte executorch 1.5.1 makes of the where (stock's portable lowering, or xnnfold's
    # without the step) fails on the runtime; the lowering says so first, naming the nodes.
    without = tuple(step for step in pipeline.STEPS if step.name != "mask_index")
    monkeypatch.setattr(pipeline, "STEPS", without)
    model, inputs = query_decoder
    folded = lower(torch.export.export(model, inputs), XNNFOLD)
    (warning,) = dim_order_warnings(xnnfold_log)
    assert "aten_nonzero_default (aten::nonzero): its output is declared in dim order (1, 0)" \
        in warning and "(aten::slice_copy.Tensor) takes tensors in different dim orders" in warning
    with pytest.raises(RuntimeError, match="0x12"):
        run_pte(folded.pte, inputs)


# The check's table against the runtime: what it names fails or gives wrong values, what it
# does not name runs right. One small program per op, lowered without a partitioner.
CHANNELS_LAST = torch.channels_last
RUNTIME_CASES = {
    "cumsum (listed: fails)": (lambda x: torch.cumsum(x.to(memory_format=CHANNELS_LAST), 1),
                               True),
    "log_softmax (listed: wrong values)": (
        lambda x: F.log_softmax(x.to(memory_format=CHANNELS_LAST), -1), True),
    "mean (not listed: right)": (
        lambda x: x.to(memory_format=CHANNELS_LAST).mean(1, keepdim=True), False),
    "nonzero returned (misread)": (lambda x: (x > 0).nonzero(), True),
    "mask indexing, no nonzero (right)": (lambda x: x[x > 0] * 2, False),
}


@pytest.mark.parametrize("name", list(RUNTIME_CASES))
def test_what_the_check_names_is_what_the_runtime_breaks(name):
    fn, broken = RUNTIME_CASES[name]

    class Module(nn.Module):
        def forward(self, x):
            return fn(x)

    x = torch.randn(1, 3, 4, 5)
    edge = to_edge_transform_and_lower(torch.export.export(Module(), (x,)), partitioner=[])
    named = dim_order_conflicts(edge.exported_program().graph, lambda node: False)
    try:
        verdict = compare_outputs(run_pte(edge.to_executorch().buffer, (x,)), fn(x))
        fails = not verdict.ok
    except RuntimeError as error:
        assert "0x12" in str(error)
        fails = True
    assert (bool(named), fails) == (broken, broken), (named, fails)
