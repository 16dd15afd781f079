"""The attention step on small exported graphs, without lowering: the rewritten program, run as
a module, equals eager (fully masked rows included); what is left alone says why."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from xnnfold import pipeline
from xnnfold.explain import Explanation, format_explanation
from xnnfold.steps import attention
from xnnfold.graph.program_copy import copy_program

from conftest import Sdpa, set_strict

B, H, L, S, D = 2, 2, 5, 7, 8
BATCH, LENGTH, SOURCE = (torch.export.Dim(name, min=2, max=64) for name in ("b", "l", "s"))


def qkv(seed=0, heads=H):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, L, D, generator=gen), torch.randn(B, heads, S, D, generator=gen),
            torch.randn(B, heads, S, D, generator=gen))


def rewritten(module, inputs, **export_kwargs):
    """(the pass's copy with attention rewritten, the records)."""
    ep = torch.export.export(module.eval(), inputs, **export_kwargs)
    copy = copy_program(ep)
    return ep, copy, attention.rewrite_attention(copy)


def sdpa_nodes(ep):
    return [n for n in ep.graph.nodes if n.target is attention.SDPA]


def bool_mask_with_empty_row():
    mask = torch.rand(B, 1, L, S, generator=torch.Generator().manual_seed(1)) > 0.5
    mask[0, 0, 2] = False          # row 2 of batch 0: every key blocked
    mask[1, 0, :, 0] = True        # and rows of batch 1 that keep one key only
    mask[1, 0, 3] = False
    return mask


def float_mask_with_empty_row():
    mask = torch.randn(L, S, generator=torch.Generator().manual_seed(2))
    mask[:, 4:] = float("-inf")
    mask[1] = float("-inf")
    return mask


@pytest.mark.parametrize("kwargs, mask, proven", [
    ({}, None, attention.NO_MASK),
    ({"scale": 0.3}, None, attention.NO_MASK),
    ({"is_causal": True}, None, attention.CAUSAL),
    ({}, bool_mask_with_empty_row(), attention.KEEP_FACTOR),
    ({}, float_mask_with_empty_row(), attention.KEEP_FACTOR),
], ids=["no-mask", "scale", "causal", "bool-mask", "float-mask"])
def test_rewrite_computes_what_eager_computes(kwargs, mask, proven):
    module = Sdpa(**kwargs)
    inputs = qkv() + ((mask,) if mask is not None else ())
    ep, copy, records = rewritten(module, inputs)
    assert [(r.node, r.proven, r.kept_because) for r in records] == \
        [("scaled_dot_product_attention", proven, None)]
    assert sdpa_nodes(copy) == [] and len(sdpa_nodes(ep)) == 1     # the caller's untouched
    expected, got = module(*inputs), copy.module()(*inputs)
    assert not got.isnan().any()
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("mask", [bool_mask_with_empty_row(), float_mask_with_empty_row()],
                         ids=["bool", "float"])
def test_fully_masked_row_gives_zeros_as_eager_does(mask):
    # Without the keep factor a blocked row would be a plain softmax of -inf logits (NaN) or,
    # unblocked, the mean of v: this fails if either half of the mask handling goes.
    inputs = qkv() + (mask,)
    _, copy, _ = rewritten(Sdpa(), inputs)
    got, expected = copy.module()(*inputs), Sdpa()(*inputs)
    empty = ~(mask if mask.dtype == torch.bool else mask != float("-inf")).any(-1)
    empty = empty.expand(B, H, L)
    assert empty.any()
    assert (expected[empty] == 0).all()
    assert (got[empty] == 0).all(), got[empty]


def test_mha_self_and_cross_with_key_padding_mask():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, 2, batch_first=True).eval()
    nn.init.normal_(mha.in_proj_bias)

    class Cross(nn.Module):
        def __init__(self):
            super().__init__()
            self.mha = mha

        def forward(self, x, memory, padding):
            return self.mha(x, memory, memory, need_weights=False, key_padding_mask=padding)[0]

    padding = torch.zeros(2, S, dtype=torch.bool)
    padding[1] = True                     # batch 1: every key padded
    padding[0, 5:] = True
    inputs = (torch.randn(2, L, 16), torch.randn(2, S, 16), padding)
    _, copy, records = rewritten(Cross(), inputs)
    assert [r.proven for r in records] == [attention.KEEP_FACTOR]
    torch.testing.assert_close(copy.module()(*inputs), Cross()(*inputs), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("module, inputs, export_kwargs, reason", [
    (Sdpa(dropout_p=0.5), qkv(), {}, "dropout_p"),
    (Sdpa(enable_gqa=True), qkv(heads=1), {}, "batch shapes"),
    (Sdpa(), tuple(t.half() for t in qkv()), {}, "dtype"),
    (Sdpa(), qkv(), {"dynamic_shapes": ({0: BATCH}, {0: BATCH}, {0: BATCH})}, "dynamic batch"),
    (Sdpa(), qkv() + (torch.randn(B, 1, L, S),),
     {"dynamic_shapes": ({2: LENGTH}, {2: SOURCE}, {2: SOURCE}, {2: LENGTH, 3: SOURCE})},
     "two dynamic dims"),
], ids=["dropout", "gqa", "fp16", "dynamic-batch", "dynamic-l-s-mask"])
def test_attention_xnnpack_would_not_take_is_left_as_it_was(module, inputs, export_kwargs,
                                                             reason):
    ep, copy, records = rewritten(module, inputs, **export_kwargs)
    (record,) = records
    assert not record.rewritten and reason in record.kept_because, record
    assert len(sdpa_nodes(copy)) == 1
    assert [n.target for n in copy.graph.nodes] == [n.target for n in ep.graph.nodes]


def test_dynamic_length_is_rewritten_with_one_inferred_dim_per_reshape():
    inputs = qkv()
    _, copy, records = rewritten(Sdpa(is_causal=True), inputs,
                                 dynamic_shapes=({2: LENGTH}, {2: SOURCE}, {2: SOURCE}))
    assert [r.proven for r in records] == [attention.CAUSAL]
    reshapes = [n.args[1] for n in copy.graph.nodes if n.target is torch.ops.aten.reshape.default]
    assert reshapes and all(shape.count(-1) == 1 for shape in reshapes), reshapes
    longer = (torch.randn(B, H, 11, D), torch.randn(B, H, 3, D), torch.randn(B, H, 3, D))
    torch.testing.assert_close(copy.module()(*longer), Sdpa(is_causal=True)(*longer))


def test_a_dequantized_query_is_rewritten_and_explain_says_so():
    # The converted module computes the attention in fp32 on the dequantized values: so does
    # the rewrite (tests/unit/test_quantized_attention_step.py checks what XNNPACK makes of it).
    q, k, v = qkv()

    class Deq(nn.Module):
        def forward(self, q, k, v):
            q = torch.ops.quantized_decomposed.dequantize_per_tensor.default(
                q, 0.1, 0, -128, 127, torch.int8)
            return F.scaled_dot_product_attention(q.transpose(1, 2), k, v)

    import executorch.exir.passes.quant_fusion_pass  # noqa: F401 - registers quantized_decomposed
    qi = torch.randint(-128, 127, (B, L, H, D), dtype=torch.int8)
    _, copy, records = rewritten(Deq(), (qi, k, v))
    assert [r.proven for r in records] == \
        [f"{attention.NO_MASK}; {attention.quantized.READS_DEQUANTIZED}"]
    torch.testing.assert_close(copy.module()(qi, k, v), Deq()(qi, k, v))


def test_pipeline_runs_the_step_explain_names_it_and_the_flag_turns_it_off():
    inputs = qkv()
    ep = torch.export.export(Sdpa(is_causal=True).eval(), inputs)
    result = pipeline.run(ep, None)
    assert result.program is not ep and sdpa_nodes(result.program) == []
    assert [a.proven for a in result.of("attention")] == [attention.CAUSAL]
    text = format_explanation(Explanation.of(result))
    assert "attention step: attention scaled_dot_product_attention rewritten into ops " \
           "XNNPACK takes (causal, no empty row)" in text
    off = pipeline.run(ep, None, attention=False)
    assert off.program is ep and off.of("attention") == [] and len(sdpa_nodes(off.program)) == 1


class EagerAttention(nn.Module):
    """Attention as transformers' eager path writes it: 4-D matmuls around a plain softmax."""

    def forward(self, q, k, v, mask):
        weights = torch.softmax(torch.matmul(q, k.transpose(2, 3)) * 0.3 + mask, dim=-1)
        return torch.matmul(weights, v)


def test_batched_matmuls_become_bmm_on_3d_views():
    inputs = qkv() + (torch.randn(B, 1, L, S),)
    ep, copy, records = rewritten(EagerAttention(), inputs)
    assert [(r.op, r.node, r.proven) for r in records] == \
        [("matmul", "matmul", "same batch dims, no expand"),
         ("matmul", "matmul_1", "same batch dims, no expand")]
    targets = [n.target for n in copy.graph.nodes]
    assert torch.ops.aten.matmul.default not in targets
    assert targets.count(torch.ops.aten.bmm.default) == 2
    torch.testing.assert_close(copy.module()(*inputs), EagerAttention()(*inputs))


def test_broadcast_matmul_is_left_as_it_was():
    # [B, H, L, D] @ [1, H, D, S]: the expand is a real broadcast, not the identity.
    class Broadcast(nn.Module):
        def forward(self, a, b):
            return torch.matmul(a, b)

    _, copy, records = rewritten(Broadcast(), (torch.randn(B, H, L, D), torch.randn(1, H, D, S)))
    assert "batch shapes" in records[0].kept_because
    assert torch.ops.aten.matmul.default in [n.target for n in copy.graph.nodes]


def test_a_rewrite_that_fails_half_way_leaves_the_node_as_it_was(monkeypatch, caplog):
    # users' mode (strict mode raises instead: tests/unit/test_give_up_paths.py)
    set_strict(monkeypatch, False)
    build = attention.sdpa.causal_mask

    def fails_after_emitting(emit, *args):
        build(emit, *args)
        raise RuntimeError("boom")

    monkeypatch.setattr(attention.sdpa, "causal_mask", fails_after_emitting)
    inputs = qkv()
    ep, copy, records = rewritten(Sdpa(is_causal=True), inputs)
    assert "internal failure" in records[0].kept_because and "boom" in records[0].kept_because
    assert [n.target for n in copy.graph.nodes] == [n.target for n in ep.graph.nodes]
    assert any("boom" in r.getMessage() for r in caplog.records if r.name == "xnnfold")
    torch.testing.assert_close(copy.module()(*inputs), Sdpa(is_causal=True)(*inputs))


class TwoLayers(nn.Module):
    """Two attentions reading one mask, as every layer of a transformers encoder does."""

    def __init__(self, **kwargs):
        super().__init__()
        self.kwargs = kwargs

    def forward(self, q, k, v, mask=None):
        first = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **self.kwargs)
        return F.scaled_dot_product_attention(first, k, v, attn_mask=mask, **self.kwargs)


@pytest.mark.parametrize("kwargs, mask, op", [
    ({}, bool_mask_with_empty_row(), torch.ops.aten.where.self),
    ({"is_causal": True}, None, torch.ops.aten.tril.default),
], ids=["bool-mask", "causal"])
def test_a_mask_read_by_several_attentions_is_prepared_once(kwargs, mask, op):
    q, k, v = qkv()
    inputs = (q, k, v) + ((mask,) if mask is not None else ())
    module = TwoLayers(**kwargs)
    _, copy, records = rewritten(module, inputs)
    assert all(r.rewritten for r in records) and len(records) == 2
    assert [n.target for n in copy.graph.nodes].count(op) == 1
    torch.testing.assert_close(copy.module()(*inputs), module(*inputs), atol=1e-6, rtol=1e-5)


def test_without_merging_each_attention_prepares_the_mask_again(monkeypatch):
    # The negative test of graph.sdpa.merge_mask_repeats: the count it makes 1 is 2 without it.
    monkeypatch.setattr(attention.sdpa_rules, "merge_mask_repeats", lambda graph, created: 0)
    q, k, v = qkv()
    _, copy, _ = rewritten(TwoLayers(), (q, k, v, bool_mask_with_empty_row()))
    assert [n.target for n in copy.graph.nodes].count(torch.ops.aten.where.self) == 2


class _PackedKeysValues(nn.Module):
    """Cross-attention over keys and values given packed ``[2 * H, S, D]`` (an encoder's
    output): each sliced ``[H, S, D]`` and unsqueezed to ``[1, H, S, D]`` for SDPA, as
    xnnfold.export.seq2seq's decoder reads them; ``transposed`` hands the values in as
    ``[H, D, S]`` transposed instead (the same shape, another element order)."""

    def __init__(self, transposed=False):
        super().__init__()
        self.transposed = transposed

    def forward(self, q, packed):
        k = packed[:H].unsqueeze(0)
        v = packed[H:].transpose(1, 2).unsqueeze(0) if self.transposed else \
            packed[H:].unsqueeze(0)
        return F.scaled_dot_product_attention(q, k, v)


def _reshapes_of(program, source_name):
    return [n for n in program.graph.nodes if n.target in (torch.ops.aten.reshape.default,
                                                            torch.ops.aten.view.default)
            and source_name in {a.name for a in n.all_input_nodes}]


def test_keys_reshaped_back_to_their_source_shape_are_read_as_they_came():
    # Inside an XNNPACK delegate a reshape is a copy: reading [1, H, S, D] back as [H, S, D]
    # would copy the precomputed keys and values at every decoder step.
    gen = torch.Generator().manual_seed(3)
    q, packed = torch.randn(1, H, 1, D, generator=gen), torch.randn(2 * H, S, D, generator=gen)
    module = _PackedKeysValues()
    ep, copy, records = rewritten(module, (q, packed))
    assert [r.rewritten for r in records] == [True]
    # the slices feed the products directly; their unsqueezes are left unread
    slices = [n for n in copy.graph.nodes if n.target is torch.ops.aten.slice.Tensor]
    assert len(slices) == 2 and all(_reshapes_of(copy, n.name) == [] for n in slices)
    assert all(not n.users for n in copy.graph.nodes
               if n.target is torch.ops.aten.unsqueeze.default)
    torch.testing.assert_close(copy.module()(q, packed), module(q, packed), atol=1e-6,
                               rtol=1e-5)


def test_a_transpose_of_the_same_shape_is_not_taken_for_its_source():
    # [H, D, S] transposed is [H, S, D], the shape the rewrite wants, but not its element
    # order: reading the transpose's input in its place would attend over the wrong values.
    gen = torch.Generator().manual_seed(4)
    q = torch.randn(1, H, 1, D, generator=gen)
    packed = torch.randn(2 * H, D, D, generator=gen)      # S == D: the transpose keeps shape
    module = _PackedKeysValues(transposed=True)
    _, copy, records = rewritten(module, (q, packed))
    assert [r.rewritten for r in records] == [True]
    torch.testing.assert_close(copy.module()(q, packed), module(q, packed), atol=1e-6,
                               rtol=1e-5)
