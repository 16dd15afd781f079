"""What a lowering leaves held once its .pte is written, released before the runtime loads it.

torch 2.13's fake-tensor dispatch caches keep the arguments of every op they saw in their keys:
for executorch's ``executorch_call_delegate`` that is the lowered delegate itself, and with it
XNNPACK's serialized weights (its ``NamedDataStoreOutput``: a copy of every delegated weight).
The caches outlive the lowering: ``FakeTensorMode.cache`` is a class attribute; the caller's
program's ``ShapeEnv`` (alive as long as the program) has its own, and ``ShapeEnv``'s methods
memoized on the class keep other ``ShapeEnv``s alive (``get_implications`` without a bound).
executorch 1.5.1's ``exir.backend.utils.is_same_node`` is memoized without a bound on the nodes
it compared, which keeps the partitioned graphs (their delegates) alive. Measured at
SmolLM2-135M's dims cut to 2 layers: 140 MB of delegate weights still alive once the program,
the lowered program and the .pte's bytes were dropped (docs/llm.md, "Export time and
memory"). Clearing these caches drops memoized results only, recomputed when next asked.

glibc keeps the pages of what the stages freed in its heap; ``malloc_trim`` gives the free
ones back to the system, so the runtime's load of the .pte does not add to them.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc


def release_lowering_memory(programs) -> None:
    """Drop the caches' references to what a finished lowering of ``programs`` (exported
    programs) made, collect, and return glibc's free heap pages to the system (nothing where
    libc has no ``malloc_trim``)."""
    from executorch.exir.backend.utils import is_same_node
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    FakeTensorMode.cache_clear()
    is_same_node.cache_clear()
    for program in programs:
        for node in program.graph.nodes:
            mode = getattr(node.meta.get("val"), "fake_mode", None)
            if getattr(mode, "shape_env", None) is not None:
                mode.shape_env.fake_tensor_cache.clear()
                break
    for method in vars(ShapeEnv).values():
        while method is not None:      # a memoized method may be wrapped again (its events)
            if callable(getattr(method, "cache_clear", None)):
                method.cache_clear()
            method = getattr(method, "__wrapped__", None)
    gc.collect()
    _malloc_trim()


def _malloc_trim() -> None:
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):      # not glibc (musl, macOS): nothing to give back
        return
    if trim is not None:
        trim(0)
