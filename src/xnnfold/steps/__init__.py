"""The steps of the pass, in the order a program takes them (see :mod:`xnnfold.pipeline`):

1. :mod:`.mask_index` — indexing by ``torch.where(mask)`` rewritten as indexing by ``mask``
   (the ``nonzero`` it decomposes into gives a .pte the ExecuTorch 1.5.1 runtime refuses);
2. :mod:`.kv_cache` — each attention of a decoder LM over its static KV cache (transformers'
   ExecuTorch export, executorch's example Llama) rewritten without repeating the cache for
   grouped-query attention, its buffers read in place; with ``llm_kernels=True``, the update
   and the attention on executorch's ``llama::update_cache`` / ``llama::custom_sdpa`` where
   proven exact;
3. :mod:`.attention` — each ``scaled_dot_product_attention`` and batched ``matmul`` of
   activations rewritten into ops XNNPACK takes (no safe-softmax, expand or scale glue left on
   portable), where that is exact; masked rows keep eager's zeros;
4. :mod:`.gelu_tanh` — ``gelu(approximate="tanh")`` written out as mul/add/tanh (XNNPACK
   1.5.1 computes every GELU as the exact one);
5. :mod:`.powers` — ``pow(x, 3)`` and ``pow(x, 2.0)`` written as the products torch's CPU
   kernel computes (XNNPACK 1.5.1 takes only the integer square);
6. :mod:`.canonical` — GEMMs with a transposed weight (``addmm(b, x, W.t())``, ``x @ W.T``)
   rewritten as ``linear``, so that one constant serves every form;
7. :mod:`.projections` — MHA's packed in-projection split into one linear per part;
8. :mod:`.fold` — the static computation of each GEMM's weight and bias, planned in groups,
   judged by :mod:`.fold.rules` and the probe (:mod:`.fold.probe`), folded into constants;
9. :mod:`.runtime_weight` — the linears whose weight cannot be a plain constant, marked to be
   delegated with a run-time weight.

Each step is a module named after it; ``explain`` names the step that changed each GEMM. What
steps share lives in packages of its own: :mod:`xnnfold.graph` (building nodes, SDPA's
arguments), :mod:`xnnfold.analysis` (static nodes, GEMM operands). A new step goes here, and in
the pipeline's order.
"""
