"""What the rewritten attentions compute on their masks, computed once per mask.

Every attention of a transformers encoder reads the same mask (transformers 5.x hands SDPA a
bool ``[B, 1, L, S]`` mask, all True without padding, even to ViT), and a causal attention's
mask depends only on its sizes. The rewrite emits, per attention, the additive mask and the
keep factor on portable (``where``, ``ne``, ``any``, ``logical_not``, ``masked_fill``, a
cast; or ``ones``, ``tril``, ``zeros``, ``masked_fill``): a model of N layers computed them N
times on one mask. Portable's ``where`` alone costs about 18 ns per mask element (measured:
BERT, 4 layers, 128 tokens, 1.15 ms per run; wav2vec2, 200 frames, 2.95 ms).

Nodes the step emitted that apply the same pure op to the same values with the same
arguments are merged into the first node holding that value (graph order, so it comes before
every user of the others; :func:`xnnfold.graph.values.merge_repeats`).
"""

from __future__ import annotations

import torch
import torch.fx

from ...graph import values

aten = torch.ops.aten
# The ops of the mask bookkeeping (sdpa._mask_parts, sdpa._causal_mask): pure, no randomness.
_MASK_OPS = frozenset({
    aten.where.self, aten.scalar_tensor.default, aten.ne.Scalar, aten.any.dim,
    aten.logical_not.default, aten.masked_fill.Scalar, aten.to.dtype, aten.tril.default,
    aten.ones.default, aten.zeros.default, aten.sym_size.int,
})


def merge_repeats(graph: torch.fx.Graph, created: set) -> int:
    """Merge the repeated mask computations among ``created`` (nodes the step emitted);
    return how many nodes went."""
    return values.merge_repeats(graph, created, _MASK_OPS)
