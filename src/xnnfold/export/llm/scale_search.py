"""torchao's ``hqq_scale_only`` choice of the weight scales, computed a block of rows at a time:
the same scales and quantized values, bit for bit, in a fraction of the time and memory.

torchao 0.18's ``_choose_qparams_and_quantize_scale_only_hqq`` runs its 20 iterations over the
whole weight at once: each iteration writes and reads back some ten temporaries of the weight's
size (a 128,256 x 3,072 head: 1.6 GB each), so it runs at the memory's speed and its transient
is several times the weight. Each group's scale follows its own trajectory (the next scale is a
function of the group's weights and its current scale only); what couples the groups is the
early stop: the iterations end after the first one whose largest relative change of a scale,
over the whole weight, is below the tolerance. So here each iteration goes over the weight a
block of rows at a time (a block's temporaries stay in the cache), each block's largest change
is kept, and the stop is decided on their maximum, as torchao decides it on the whole weight's.
Every operation is torchao's, in its order, elementwise or reduced along a group, so a block's
values are the ones the whole-weight computation gives for those rows.
"""

from __future__ import annotations

import contextlib

import torch

# a block of rows holds about this many weights (1 MB in float32): large enough that torch's
# per-operation overhead is small, small enough that the block's temporaries stay in the cache
# (3,072 x 3,072 on one thread, loaded machine: 1.45 s in blocks of 2^15, 0.75 s of 2^18, 0.7 s
# of 2^19)
BLOCK_ELEMENTS = 1 << 18


def row_blocks(rows: int, columns: int, block_elements: int = BLOCK_ELEMENTS) -> list:
    """(start, stop) of the blocks of rows an iteration goes through: about ``block_elements``
    weights each, never a single row when there are more (a block of one row and one group, an
    8-bit weight per channel, is a reduction to a single value, which torch may split across
    threads in another order than the whole weight's rows)."""
    step = max(2, block_elements // max(1, columns))
    bounds = [(start, min(start + step, rows)) for start in range(0, rows, step)]
    if len(bounds) > 1 and bounds[-1][1] - bounds[-1][0] < 2:
        bounds[-2:] = [(bounds[-2][0], rows)]
    return bounds


@torch.no_grad()
def hqq_scale_only(weight: torch.Tensor, group_size: int, qmin: int, qmax: int, *,
                   iters: int = 20, early_stop_tol: float = 1e-5,
                   block_elements: int = BLOCK_ELEMENTS) -> tuple:
    """(quantized values as int8, shaped as ``weight``; scales as ``weight``'s dtype, one per
    group of ``group_size`` consecutive weights of a row) exactly as torchao's
    ``_choose_qparams_and_quantize_scale_only_hqq(weight, [1, group_size], qmin, qmax)`` gives
    them (then made int8, as its ``IntxUnpackedToInt8Tensor.from_hp`` does)."""
    if weight.ndim != 2 or weight.shape[1] % group_size or qmin >= qmax:
        raise ValueError(f"a 2-d weight whose columns {group_size} divides, qmin < qmax: "
                         f"got {tuple(weight.shape)}, group {group_size}, [{qmin}, {qmax}]")
    rows, columns = weight.shape
    groups = columns // group_size
    grouped = weight.to(torch.float32).contiguous().view(rows, groups, group_size)
    blocks = row_blocks(rows, columns, block_elements)
    with _one_thread():
        quantized, scale, _ = _search(grouped, blocks, qmin, qmax, iters, early_stop_tol)
    return quantized.view(rows, columns), scale.to(weight.dtype)


@contextlib.contextmanager
def _one_thread():
    """torch's intra-op threads set to one for the search, then restored: on a block of 1 MB
    the threads' synchronization costs more than they share (3,072 x 3,072 under load 7 on
    2 cores: 0.6-0.8 s on one thread, 3.4-21 s on two)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _search(grouped: torch.Tensor, blocks: list, qmin: int, qmax: int, iters: int,
            early_stop_tol: float) -> tuple:
    """torchao's iterations and final quantization on ``grouped`` (rows x groups x group
    size, float32), a block of rows at a time: (int8 values as ``grouped``, float32 scales,
    how many iterations ran)."""
    rows, groups, _ = grouped.shape
    eps = torch.finfo(torch.float32).eps
    qabs = max(abs(qmin), abs(qmax)) or 1
    scale = torch.empty(rows, groups, dtype=torch.float32)
    for start, stop in blocks:
        scale[start:stop] = (grouped[start:stop].abs().amax(dim=2) / qabs).clamp_min(eps)
    previous = torch.empty_like(scale)
    changes = torch.empty(len(blocks), dtype=torch.float32)
    for iteration in range(1, max(1, iters) + 1):
        previous, scale = scale, previous          # this iteration's scales into `scale`
        for index, (start, stop) in enumerate(blocks):
            changes[index] = _iterate(grouped[start:stop], previous[start:stop],
                                      scale[start:stop], qmin, qmax, eps)
        if changes.max() < early_stop_tol:
            break

    quantized = torch.empty(grouped.shape, dtype=torch.int8)
    for start, stop in blocks:
        values = (grouped[start:stop] / scale[start:stop].unsqueeze(-1)).round_()
        quantized[start:stop] = values.clamp_(qmin, qmax)
    return quantized, scale, iteration


def _iterate(grouped: torch.Tensor, previous: torch.Tensor, scale: torch.Tensor,
             qmin: int, qmax: int, eps: float) -> torch.Tensor:
    """One of torchao's iterations on a block of rows: the least-squares scale of each group
    for its values quantized with ``previous`` written into ``scale``; returns the block's
    largest relative change of a scale (a 0-d tensor: a NaN stays one)."""
    values = (grouped / previous.unsqueeze(-1)).round_().clamp_(qmin, qmax)
    num = (grouped * values).sum(dim=2, dtype=torch.float32)
    den = values.mul_(values).sum(dim=2, dtype=torch.float32)
    torch.where(den > 0, num / den, previous, out=scale)
    scale.clamp_min_(eps).abs_()
    return ((scale - previous).abs() / previous.clamp_min(eps)).max()
