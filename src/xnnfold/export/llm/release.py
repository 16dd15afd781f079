"""What a lowering leaves held once its .pte is written, released before the runtime loads it.

torch 2.13's fake-tensor dispatch caches keep the arguments of every op they saw in their keys:
for executorch's ``executorch_call_delegate`` that is the lowered delegate itself, and with it
XNNPACK's serialized weights (its ``NamedDataStoreOutput``: a copy of every delegated weight).
The caches outlive the lowering: ``FakeTensorMode.cache`` is a class attribute; the caller's
program's ``ShapeEnv`` (alive as long as the program) has its own, and ``ShapeEnv``'s methods
memoized on the class keep other ``ShapeEnv``s alive (``get_implications`` without a bound),
and the ``ShapeEnv``s the stages made for their own traces (the decompositions', emission's)
live on as long as anything reaches them: every ``ShapeEnv`` still alive has its cache cleared,
not only the caller's program's (at Qwen2.5-0.5B's dims cut to 4 layers, one of them held
every delegate: 0.78 GB of XNNPACK's serialized weights at the check). executorch's XNNPACK
partitioner configs keep, in module-level ``WhyNoPartition`` objects, the last node each
declined (its ``node``, for the debug log line): that node's graph, the partitioned one, holds
every delegate; the reference is dropped (the object logs the next node as before).
executorch 1.5.1's ``exir.backend.utils.is_same_node`` is memoized without a bound on the nodes
it compared, which keeps the partitioned graphs (their delegates) alive. Measured at
SmolLM2-135M's dims cut to 2 layers: 140 MB of delegate weights still alive once the program,
the lowered program and the .pte's bytes were dropped (docs/llm.md, "Export time and
memory"). Clearing these caches drops memoized results only, recomputed when next asked.

glibc keeps the pages of what the stages freed in its heap; ``malloc_trim`` gives the free
ones back to the system, so the runtime's load of the .pte does not add to them. A process that
exports can also have glibc map each large block on its own (:func:`map_large_blocks`), so that
such blocks never enter the heap.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc


def release_lowering_memory() -> None:
    """Drop the caches' references to what a finished lowering made, collect, and return
    glibc's free heap pages to the system (nothing where libc has no ``malloc_trim``). Every
    ``ShapeEnv`` still alive is reached, the caller's programs' among them."""
    from executorch.exir.backend.utils import WhyNoPartition, is_same_node
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    FakeTensorMode.cache_clear()
    is_same_node.cache_clear()
    gc.collect()
    # the stages' own ShapeEnvs, wherever they are held; type(), not isinstance(): a weak
    # proxy whose object is gone raises on isinstance
    for alive in gc.get_objects():
        if issubclass(type(alive), ShapeEnv):
            alive.fake_tensor_cache.clear()
        elif issubclass(type(alive), WhyNoPartition):
            alive.node = None
    for method in vars(ShapeEnv).values():
        while method is not None:      # a memoized method may be wrapped again (its events)
            if callable(getattr(method, "cache_clear", None)):
                method.cache_clear()
            method = getattr(method, "__wrapped__", None)
    gc.collect()
    trim = _libc("malloc_trim")
    if trim is not None:
        trim(0)


# mallopt's parameter: the size from which malloc maps a block of its own (glibc's malloc.h)
_M_MMAP_THRESHOLD = -3


def map_large_blocks(threshold: int = 1 << 20) -> bool:
    """Have glibc map every block of ``threshold`` bytes or more on its own and unmap it when
    freed; whether it was set (False where libc is not glibc). glibc's own threshold starts at
    128 KiB and rises to the size of each mapped block freed, up to 32 MiB: after the first
    weight's copy is freed, the copies an export makes of the weights (torch.export's clones,
    the partitions' copies, XNNPACK's serialized buffers), 1 to 32 MB each, go to the heap,
    where what is freed between them stays resident. Measured with ``xnnfold hf`` at
    Qwen2.5-0.5B's dims cut to 4 layers (0.78 GB of fp32 weights): the lowering's peak 3.80 ->
    3.51 GB, emission's 4.34 -> 3.51 (docs/llm.md, "Export time and memory"). It changes the
    allocator of the whole process: the ``hf`` command sets it; a program that calls the
    export functions decides for itself."""
    mallopt = _libc("mallopt")
    return bool(mallopt is not None and mallopt(_M_MMAP_THRESHOLD, int(threshold)) == 1)


def _libc(function: str):
    """glibc's ``function``, or None where the C library has none (musl, macOS)."""
    name = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(name), function) if name else None
    except (OSError, AttributeError):
        return None
