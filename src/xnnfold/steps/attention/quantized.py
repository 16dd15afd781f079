"""Attention of a PT2E-quantized program (XNNPACK's quantizer, static or dynamic int8).

What the converted module computes, and so what the rewrite must compute:

- XNNPACK's quantizer annotates ``linear``, ``conv``, ``add``, ``mul``, ``cat`` and
  ``adaptive_avg_pool2d``, and shares an annotated input's quantization with the layout ops
  after it (``view``, ``reshape``, ``transpose``, ``permute``, ``squeeze``, ``slice``,
  ``dropout``...: ``_is_share_obs_or_fq_op``). It annotates no ``bmm``, ``matmul``,
  ``softmax`` or ``scaled_dot_product_attention``. ``torch.export`` keeps SDPA whole until
  ``run_decompositions``, so ``prepare_pt2e`` sees one unannotated node.
- Static (``is_dynamic=False``): each projection's output is quantized, and so are its
  ``view`` and ``transpose`` to heads; q, k and v reach the attention as
  ``dequantize_per_tensor`` (``-> contiguous``), and the attention computes in fp32 on those
  dequantized values. Its output is quantized again where an annotated op reads it (the out
  projection). In the eager form (``matmul``, ``* scale``, ``softmax``, ``matmul``) the
  quantizer annotates the ``mul``: the scores are quantized before and after it, and the
  softmax reads a dequantize too.
- Dynamic (``is_dynamic=True``): only the GEMMs' inputs are quantized, at run time; q, k, v are
  fp32 activations.

XNNPACK's partitioner takes an op as a *quantized* one only where its config supports static
quantization, every input node is a ``dequantize`` and its one user is a ``quantize``
(``GenericNodePartitionerConfig.get_node_and_deps``, which then tags those q/dq as implicit).
Elsewhere a ``dequantize`` it takes becomes a Convert (int8 -> fp32) and a ``quantize`` a
Convert (fp32 -> int8): the reference's arithmetic. The rewritten attention leaves every q/dq
node where it was and only adds ops after them; none of those ops has a ``quantize`` as its
one user (the first op on q is ``mul`` by a float and feeds ``reshape``; on k ``reshape`` ->
``transpose``; on v ``reshape`` -> ``bmm``; ``bmm`` and ``softmax`` are fp32-only configs), so
XNNPACK takes each q/dq the quantizer put there as the converted module has it, the ops it
annotated as quantized ones (the eager scores' ``mul``, the projections, their layout ops) and
the attention in fp32, as the converted module computes it. What XNNPACK computes differently
from the converted module is what it computes differently for stock: its int8 kernels' rounding.

The attention of a quantized program is thus rewritten under the same rules as an fp32 one;
this module names the dequantized inputs for ``explain``.
"""

from __future__ import annotations

import torch.fx

from ...analysis import dequantized

READS_DEQUANTIZED = "reads dequantized int8: the attention in fp32, as the converted module"


def note(proven: str, operands) -> str:
    """``proven``, with a word for ``explain`` when an operand comes out of a dequantize."""
    if any(isinstance(x, torch.fx.Node) and dequantized(x) for x in operands):
        return f"{proven}; {READS_DEQUANTIZED}"
    return proven
