"""The KV-cache step's default rewrite reading only the cache rows up to the position (the
visible rows), on small exported graphs without lowering: run as a module over steps of
several lengths, it equals eager; where the mask is not proven to block every later row it reads
all rows; each guard has a case that goes wrong without it. The partitioner's side (its configs
taking the run-time sizes) is checked here on its configs, and by the lowered tests
(tests/test_kv_cache.py, tests/test_hf.py)."""

import pytest
import torch

import test_kv_cache_rewrite as cases
from test_kv_cache_rewrite import CacheAttention, matches, ops_of, steps, varied_steps
from xnnfold import XnnpackPartitioner
from xnnfold.graph.program_copy import copy_program
from xnnfold.steps import kv_cache
from xnnfold.steps.kv_cache import mask_proof, visible, visible_config

SLICE = "aten.slice.Tensor"


def rewritten(module, example, dynamic=False, llm=False):
    torch.manual_seed(0)
    shapes = None
    if dynamic:
        length = torch.export.Dim("length", min=1, max=cases.PREFILL)
        shapes = ({1: length}, {0: length})
    ep = torch.export.export(module.eval(), example, dynamic_shapes=shapes)
    program = copy_program(ep)
    return ep, program, kv_cache.rewrite_kv_caches(program, llm, visible_rows=True)


def cut_caches(program) -> int:
    """How many slices of a cache end at a run-time size."""
    return sum(1 for n in program.graph.nodes if n.target is torch.ops.aten.slice.Tensor
               and isinstance(n.args[3], torch.fx.Node))


@pytest.mark.parametrize("style", ["hf", "et"])
def test_decode_reads_the_visible_rows_and_equals_eager(style):
    module = CacheAttention(style)
    sequence = steps(count=6)
    ep, program, records = rewritten(module, sequence[0])
    assert records[0].rewritten and visible.HOW in records[0].proven, records[0].describe()
    assert cut_caches(program) == 2            # the keys and the values, to P + L rows
    assert "aten.sym_constrain_range_for_size.default" in ops_of(program)
    assert matches(program, module, sequence).ok
    assert cut_caches(ep) == 0                 # the caller's program is not touched


def test_prefill_chunks_of_every_length_equal_eager():
    """Steps of 2, 4, 1 and 1 tokens (a dynamic length): the rows P .. P + L - 1 and the
    causal mask within the step."""
    module = CacheAttention("hf")
    sequence = varied_steps()
    _, program, records = rewritten(module, sequence[0], dynamic=True)
    assert visible.HOW in records[0].proven
    assert matches(program, module, sequence).ok


def test_window_reads_the_visible_rows_and_keeps_the_window():
    module = CacheAttention("hf", mask="window")
    sequence = steps(count=6)
    _, program, records = rewritten(module, sequence[0])
    assert "sliding window of 3" in records[0].proven and visible.HOW in records[0].proven
    assert matches(program, module, sequence).ok


def test_window_with_llm_kernels_reads_the_visible_rows():
    """With llm_kernels, a window is not custom_sdpa's (it attends every row up to the
    position): the cache is updated in place and XNNPACK attends the visible rows."""
    module = CacheAttention("hf", mask="window")
    sequence = steps(count=6)
    _, program, records = rewritten(module, sequence[0], llm=True)
    record = records[0]
    assert record.kernels.startswith("llama::update_cache, XNNPACK") and \
        visible.HOW in record.proven, record.describe()
    assert "llama.custom_sdpa.default" not in ops_of(program)
    assert matches(program, module, sequence).ok


def test_window_wrong_without_its_condition(monkeypatch):
    """The mask over the visible rows without the window's lower bound: rows the window blocks
    are attended."""
    monkeypatch.setattr(visible, "window_rows", lambda proven: None)
    module = CacheAttention("hf", mask="window")
    sequence = steps(count=6)
    _, program, records = rewritten(module, sequence[0])
    assert visible.HOW in records[0].proven
    assert not matches(program, module, sequence).ok


@pytest.mark.parametrize("mask", ["padding", "first3"])
def test_mask_not_proven_reads_every_row(mask):
    """A mask read from a user input, or one causal for short steps only: not proven to block
    every row past the position, so every row is read, under the model's own mask."""
    module = CacheAttention("hf", mask=mask)
    if mask == "padding":
        module, sequence = cases.padding_case()
        _, program, records = rewritten(module, sequence[0])
    else:
        sequence = varied_steps()
        _, program, records = rewritten(module, sequence[0], dynamic=True)
    assert records[0].rewritten and visible.HOW not in records[0].proven
    assert cut_caches(program) == 0
    assert matches(program, module, sequence).ok


def test_padding_wrong_without_the_guard(monkeypatch):
    """The guard removed: the visible rows' mask (causal from the position) replaces the
    model's, which also blocks the keys the user marked invalid."""
    monkeypatch.setattr(visible, "why_not", lambda *a, **k: None)
    module, sequence = cases.padding_case()
    _, program, records = rewritten(module, sequence[0])
    assert visible.HOW in records[0].proven
    assert not matches(program, module, sequence).ok


def test_partitioner_for_other_precisions_keeps_every_row():
    """A partitioner taking dynamically quantized ops only has no fp32 bmm config to take the
    attention over the visible rows."""
    from executorch.backends.xnnpack.partition.config.xnnpack_config import ConfigPrecisionType

    ours = XnnpackPartitioner(config_precisions=ConfigPrecisionType.DYNAMIC_QUANT)
    assert kv_cache.STEP in ours.fold.steps and kv_cache.STEP_VISIBLE_ROWS not in ours.fold.steps


def test_off_unless_asked():
    """fold_gemm_params with a stock partitioner (whose configs decline run-time sizes) and the
    unit API's default read every row."""
    module = CacheAttention("hf")
    example = steps()[0]
    program = copy_program(torch.export.export(module.eval(), example))
    records = kv_cache.rewrite_kv_caches(program)
    assert visible.HOW not in records[0].proven and cut_caches(program) == 0


def test_partitioner_opens_its_configs_and_step():
    """xnnfold's partitioner wraps its own configs of the attention's ops (not executorch's
    classes, nor another partitioner's) and uses the step that emits the visible rows."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
        XnnpackPartitioner as Stock)

    ours, stock = XnnpackPartitioner(), Stock()
    for target in ("bmm.default", "_softmax.default", "add.Tensor", "permute_copy.default"):
        assert type(ours.target_partitioner_configs[target]).__name__.startswith("VisibleRows")
        assert not type(stock.target_partitioner_configs[target]).__name__.startswith(
            "VisibleRows")
    assert kv_cache.STEP_VISIBLE_ROWS in ours.fold.steps and kv_cache.STEP not in ours.fold.steps


def test_closed_path_keeps_every_row(monkeypatch):
    """Where the configs cannot be wrapped (an executorch without them), the partitioner's step
    reads every row: XNNPACK would leave the attention's bmm on portable."""
    monkeypatch.setattr(visible_config, "_WRAPPED_TARGETS", ("no_such_op.default",))
    ours = XnnpackPartitioner()
    assert kv_cache.STEP in ours.fold.steps and kv_cache.STEP_VISIBLE_ROWS not in ours.fold.steps


def test_config_takes_marked_nodes_with_sizes_of_at_least_one():
    """A marked node's run-time size P + L (P >= 0, L >= 1) is taken; a size whose range
    allows 0 (P alone) is not."""
    module = CacheAttention("hf")
    _, program, _ = rewritten(module, steps()[0])
    bmm = [n for n in program.graph.nodes if n.target is torch.ops.aten.bmm.default]
    assert bmm and all(visible_config.is_marked(n) for n in bmm)
    assert all(visible_config.takes_marked(n) for n in bmm)
    (item,) = [n for n in program.graph.nodes if n.target is torch.ops.aten.item.default]
    node, saved = bmm[0], bmm[0].meta["val"]
    with saved.fake_mode:
        node.meta["val"] = torch.empty(2, item.meta["val"], 4)   # P rows: 0 .. S - 1
    try:
        assert not visible_config.takes_marked(node)
    finally:
        node.meta["val"] = saved


class WithControlFlow(torch.nn.Module):
    """An attention over a cache, then a ``torch.cond`` on its output (a routed mixture of
    experts' form)."""

    def __init__(self):
        super().__init__()
        self.attention = CacheAttention("hf")

    def forward(self, x, cache_position):
        out = self.attention(x, cache_position)
        return torch.cond(out.sum() > 0, lambda o: o * 2.0, lambda o: o - 1.0, (out,))


@pytest.mark.parametrize("llm", [False, True], ids=["default", "llm-kernels"])
def test_control_flow_makes_no_item(llm):
    """An item() of the position beside a cond fails the lowering of a mixture of experts
    (tests/test_moe_generation.py lowers one): the step reads every row and declines the LLM
    kernels."""
    module = WithControlFlow()
    sequence = varied_steps()
    _, program, records = rewritten(module, sequence[0], dynamic=True, llm=llm)
    assert records[0].rewritten and visible.HOW not in records[0].proven
    assert "control flow" in (records[0].llm_declined or "") or not llm
    assert not any(n.target is torch.ops.aten.item.default for n in program.graph.nodes)
    program.run_decompositions({})
    assert matches(program, module, sequence).ok
