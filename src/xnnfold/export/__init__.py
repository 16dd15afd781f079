"""Exports: programs people ship, written through xnnfold.

- :mod:`.llm` — a transformers causal LM to a generation-ready .pte, and generation with it on
  the runtime;
- :mod:`.hf` — ``xnnfold hf``: a transformers folder (``save_pretrained``) to .pte files, each
  checked against eager;
- :mod:`.recipes` — executorch's export recipes (``executorch.export``) lowered through xnnfold;
- :mod:`.static_cache` — transformers' static KV cache around a causal LM (the one wrapper);
- :mod:`.transformers` — transformers imported with a broken torchvision hidden.

Above the pass and :mod:`xnnfold.pte`; the pass never imports it.
"""
