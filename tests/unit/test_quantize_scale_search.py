"""torchao's ``hqq_scale_only`` scale search a block of rows at a time
(export/llm/scale_search.py) and the quantized linears built from it (export/llm/quantize.py),
without lowering: bit for bit torchao's own result (quantized values, scales, zero points, the
module's output), whether the early stop ends the iterations or not, with a last block that is
not a full one."""

import copy

import pytest
import torch
from torch import nn

from xnnfold.export.llm import scale_search
from xnnfold.export.llm.quantize import quantize_linears


def _torchao(weight, group_size, qmin, qmax, **options):
    from torchao.quantization.quant_primitives import (
        _choose_qparams_and_quantize_scale_only_hqq)

    qdata, scale = _choose_qparams_and_quantize_scale_only_hqq(
        weight, [1, group_size], qmin, qmax, **options)
    return qdata.to(torch.int8), scale


# (rows, columns, group size, [qmin, qmax], block of rows, tolerance, iterations torchao runs on
# the weight of seed 0): the last block of rows is never a full one
CASES = {
    # every group's scale reaches its fixed point: the stop after 8 of 20 iterations
    "int4, stopped at the fixed point": (70, 96, 32, (-8, 7), 8, 1e-5, 8),
    # the whole weight's largest change below 3% after 4 iterations, while some blocks'
    # went below it earlier and their scales change again: a block stopped by its own
    # changes, or run to the end, has other scales
    "int4, stopped before the fixed point": (70, 96, 32, (-8, 7), 8, 0.03, 4),
    # 8-bit per channel: changes of 3e-4 at every iteration, never below the tolerance
    "int8 per channel, never stopped": (67, 4096, 4096, (-128, 127), 4, 1e-5, 20),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_search_is_torchao_bit_for_bit(case):
    rows, columns, group, (qmin, qmax), block_rows, tol, iterations = CASES[case]
    weight = torch.randn(rows, columns, generator=torch.Generator().manual_seed(0))
    blocks = scale_search.row_blocks(rows, columns, block_rows * columns)
    assert len(blocks) > 2 and rows % block_rows
    grouped = weight.view(rows, columns // group, group)
    assert scale_search._search(grouped, blocks, qmin, qmax, 20, tol)[2] == iterations
    threads = torch.get_num_threads()
    qdata, scale = scale_search.hqq_scale_only(weight, group, qmin, qmax, early_stop_tol=tol,
                                               block_elements=block_rows * columns)
    assert torch.get_num_threads() == threads
    expected_qdata, expected_scale = _torchao(weight, group, qmin, qmax, early_stop_tol=tol)
    assert qdata.dtype == torch.int8 and torch.equal(qdata, expected_qdata)
    assert scale.dtype == torch.float32 and torch.equal(scale, expected_scale)


def test_a_bfloat16_weight_has_bfloat16_scales_as_torchao_gives():
    weight = torch.randn(40, 64).to(torch.bfloat16)
    qdata, scale = scale_search.hqq_scale_only(weight, 32, -8, 7, block_elements=6 * 64)
    expected_qdata, expected_scale = _torchao(weight, 32, -8, 7)
    assert torch.equal(qdata, expected_qdata)
    assert scale.dtype == torch.bfloat16 and torch.equal(scale, expected_scale)


def test_blocks_cover_the_rows_and_are_never_a_single_row():
    assert scale_search.row_blocks(9, 100, 400) == [(0, 4), (4, 9)]
    assert scale_search.row_blocks(5, 10**6, 1) == [(0, 2), (2, 5)]
    assert scale_search.row_blocks(1, 64, 1) == [(0, 1)]
    assert scale_search.row_blocks(12, 10, 40) == [(0, 4), (4, 8), (8, 12)]


class _Linears(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(64, 96)
        self.down = nn.Linear(96, 64, bias=False)
        self.odd = nn.Linear(64, 48)            # 8da4w takes it; int8 too

    def forward(self, x):
        return self.odd(self.down(torch.relu(self.up(x))))


def _same_weight(got, expected) -> bool:
    names, attributes = expected.__tensor_flatten__()
    return (type(got) is type(expected) and got.__tensor_flatten__() == (names, attributes)
            and all(getattr(got, a) == getattr(expected, a) for a in attributes)
            and all(getattr(got, n).dtype == getattr(expected, n).dtype and
                    torch.equal(getattr(got, n), getattr(expected, n)) for n in names))


@pytest.mark.parametrize("scheme", ["8da4w", "int8"])
def test_quantized_linears_are_torchaos_quantize_bit_for_bit(scheme):
    from torchao.quantization import quantize_

    from xnnfold.export.llm.quantize import linear_quantization

    model = _Linears().eval()
    ours, theirs = copy.deepcopy(model), copy.deepcopy(model)
    assert quantize_linears(ours, scheme) == 3
    config, takes = linear_quantization(scheme)
    quantize_(theirs, config, filter_fn=lambda module, _: takes(module))
    for name in ("up", "down", "odd"):
        got, expected = getattr(ours, name), getattr(theirs, name)
        assert type(got.weight) is type(expected.weight)
        assert isinstance(got.weight, nn.Parameter) and not got.weight.requires_grad
        assert _same_weight(got.weight.data, expected.weight.data), name
        assert repr(got) == repr(expected)
        assert (got.bias is None) == (expected.bias is None)
    assert type(model.up.weight.data) is torch.Tensor          # the caller's model untouched
    x = torch.randn(3, 5, 64)
    with torch.no_grad():
        assert torch.equal(ours(x), theirs(x))


def test_a_config_it_does_not_build_is_torchaos_own():
    """Another choice of the scales (torchao's affine one) is handed to torchao's quantize_."""
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_
    from torchao.quantization.granularity import PerGroup

    from xnnfold.export.llm.quantize import quantize_linear

    config = Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4,
                                                   weight_granularity=PerGroup(32))
    ours, theirs = nn.Linear(64, 40), nn.Linear(64, 40)
    theirs.load_state_dict(ours.state_dict())
    quantize_linear(ours, config)
    quantize_(theirs, config)
    assert _same_weight(ours.weight.data, theirs.weight.data)
