"""A transformers causal LM to one generation-ready .pte: a single ``forward`` over a static KV
cache, the layout executorch's own runners (``TextLLMRunner``, ``llama_main``, the demo apps)
and its exporters (``export_llama``, optimum-executorch) use.

The cache is transformers' own (:func:`xnnfold.export.static_cache.with_static_cache`, the
``StaticCache`` of ``cache_implementation="static"``): the keys and values of every layer are
buffers of ``max_cache`` rows that the program updates in place at ``cache_position``. The one
method:

- ``forward(input_ids (1, T), cache_position (T,))``, ``1 <= T <= max_prefill`` a dynamic
  length: writes T rows of the cache at those positions and returns the logits of the last one,
  (1, 1, V) (the head runs on that position only: ``logits_to_keep=1``). A prompt goes in as
  chunks of at most ``max_prefill`` tokens, each generated token as T = 1.

``cache_position`` must be consecutive positions (transformers' wrapper reads its first value
only); executorch's runner passes ``arange(start, start + T)`` when the method's second input
has more than one element (``max_prefill > 1``), else ``(start,)``. With one method, the cache
is that method's own mutable buffers: whatever runtime loads the program, the method that
writes the cache is the one that reads it (the two-method layout xnnfold wrote before, a
``prefill`` and a ``decode``, relied on the runtime sharing one memory arena between methods;
executorch's runner does not, and its decode read a cache prefill never wrote, silently).
Constant methods carry what the runner reads, under the names executorch's LLM export uses
(``get_max_seq_len``: the longest chunk, ``get_max_context_len``: the cache rows,
``enable_dynamic_shape``: chunks of several tokens, ``use_kv_cache``, ``get_eos_ids``, and
``get_vocab_size``, ``get_bos_id``, ``get_n_layers``).

transformers is imported by the functions that need it, never by importing this module.
"""

from __future__ import annotations

import contextlib
import inspect
import tempfile
from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import nn

from ...pte.files import write_atomically
from ...usage import first_line
from ..experts import routed_experts
from ..fake_weights import export_with_fake_weights
from ..static_cache import with_static_cache
from .quantize import quantized_copy
from .release import release_lowering_memory
from .sizes import positions_of, runner_metadata, sizes, text_config  # noqa: F401 - its names

# The one method executorch's runner calls (llm_runner_helper: "forward" when the program has
# it); the names of the two-method layout, which this module no longer writes.
FORWARD = "forward"
PREFILL, DECODE = "prefill", "decode"


@dataclass
class GenerationPrograms:
    """The exported programs of one model (a generation .pte: ``{"forward": program}``) and the
    constant methods to emit with them."""

    programs: dict                      # {method name: ExportedProgram}
    metadata: dict = field(default_factory=dict)
    max_cache: int = 0
    max_prefill: int = 0
    capped: list = field(default_factory=list)   # each size capped, one line (sizes())


class CannotExport(RuntimeError):
    """torch.export could not take the model: its class and the reason in one line; the
    original error is the cause (``__cause__``)."""

    def __init__(self, model_class: str, reason: str):
        super().__init__(f"{model_class}: the export with transformers' static cache failed "
                         f"({reason})")
        self.model_class, self.reason = model_class, reason


@contextlib.contextmanager
def _named_failures(model):
    try:
        yield
    except CannotExport:
        raise
    except Exception as error:  # noqa: BLE001 - whatever torch raises, one line and the cause
        raise CannotExport(type(model).__name__, first_line(error, 300)) from error


def export_causal_lm(model: nn.Module, max_cache: Optional[int] = None,
                     max_prefill: Optional[int] = None, example_tokens: int = 4,
                     quantize: Optional[str] = None) -> GenerationPrograms:
    """``forward`` of a transformers causal LM (in eval mode), exported with transformers'
    static cache of ``max_cache`` rows, taking 1 to ``max_prefill`` tokens per call.
    ``quantize``: a scheme of :mod:`xnnfold.export.llm.quantize` applied to a copy of the
    model's linears first. The caller's model is not changed (unquantized, its weights are
    shared, not copied). Mixture-of-experts layers are exported as one cond per expert over
    its own XNNPACK delegate (:mod:`xnnfold.export.experts`). A model torch.export cannot take
    raises :class:`CannotExport`."""
    capped: list = []
    max_cache, max_prefill = sizes(model, max_cache, max_prefill, capped)
    if "logits_to_keep" not in inspect.signature(model.forward).parameters:
        raise ValueError(f"{type(model).__name__}.forward has no logits_to_keep: not a "
                         "transformers causal LM this export knows")
    if quantize is not None:
        model = quantized_copy(model, quantize)
    example = max(1, min(example_tokens, max_prefill))
    vocab = int(text_config(model).vocab_size)
    kwargs = {"input_ids": torch.randint(0, vocab, (1, example), dtype=torch.long),
              "cache_position": torch.arange(example, dtype=torch.long)}
    shapes = None
    if max_prefill > 1:            # torch.export specializes a dimension whose range is 1..1
        length = torch.export.Dim("tokens", min=1, max=max_prefill)
        shapes = {"input_ids": {1: length}, "cache_position": {0: length}}
    with torch.no_grad(), _named_failures(model):
        # the wrapper is built before the experts are routed (it runs the model once, eagerly)
        stepper = with_static_cache(model, max_cache, last_logits=True)
        with routed_experts(model, max_prefill):
            # traced over fake weights: dynamo's clone of each is not a second copy
            forward = export_with_fake_weights(stepper, (), kwargs, dynamic_shapes=shapes,
                                               strict=True)
    return GenerationPrograms({FORWARD: forward}, runner_metadata(model, max_cache, max_prefill),
                              max_cache, max_prefill, capped)


@dataclass
class LoweredGeneration:
    """The .pte of a :class:`GenerationPrograms`, each method's partitioner (xnnfold's holds
    its ``last_result``) and what ``before_emit`` returned."""

    pte: Optional[bytes]                  # None: written to lower_generation's output
    partitioners: dict                    # {method: its partitioner}
    inspected: object = None


def lower_generation(generation: GenerationPrograms, partitioner_class=None,
                     partitioner_kwargs: Optional[dict] = None, before_emit=None,
                     arenas_shared: bool = False, output=None) -> LoweredGeneration:
    """The methods lowered in one ``to_edge_transform_and_lower`` (a partitioner each; by
    default xnnfold's :class:`~xnnfold.XnnpackPartitioner`), emitted with the quantized ops'
    kernels registered and, if there are several methods, their mutable buffers at one place
    all of them share. Several methods writing mutable buffers (the LLM bench's two-method
    layout) are refused (:class:`CacheNotShared`) unless ``arenas_shared``: only a runtime that
    shares memory arenas between methods (``executorch.runtime.Runtime``) runs such a program
    right; executorch's LLM runner gives each method memory of its own and would read a cache
    another method wrote, silently. ``before_emit(edge)`` may read the lowered programs
    (``edge.exported_program(method)``) before emission rewrites them. ``output``: the .pte
    written there (:func:`~xnnfold.pte.files.write_atomically`) as it is serialized, and not
    returned (``pte`` None)."""
    from executorch.exir import to_edge_transform_and_lower

    import executorch.kernels.quantized  # noqa: F401 - a quantized program's out variants
    if partitioner_class is None:
        from ...partitioner import XnnpackPartitioner as partitioner_class
    partitioners = {name: partitioner_class(**(partitioner_kwargs or {}))
                    for name in generation.programs}
    edge = to_edge_transform_and_lower(
        dict(generation.programs), partitioner={n: [p] for n, p in partitioners.items()},
        constant_methods=dict(generation.metadata))
    # the mutations are in the signatures once functionalized (torch.export leaves add_ in)
    written = {name: set(edge.exported_program(name).graph_signature.buffers_to_mutate.values())
               for name in generation.programs}
    writers = sorted(name for name, buffers in written.items() if buffers)
    if len(writers) > 1 and not arenas_shared:
        raise CacheNotShared(
            f"methods {' and '.join(writers)} each write mutable buffers: executorch's LLM "
            "runner gives each method memory of its own; lower one method (forward), or pass "
            "arenas_shared=True for a runtime that shares memory arenas between methods")
    inspected = before_emit(edge) if before_emit is not None else None
    cache = set().union(*written.values())
    program = edge.to_executorch(emit_config())
    # the methods that write the cache share it (a vision encoder beside them holds none)
    check_shared(program.executorch_program, [name for name in generation.programs
                                              if name in writers or not writers], cache)
    # executorch's .buffer joins the serialized chunks into one bytes while they are alive: a
    # second .pte in memory at the export's peak. Streamed to a file and read back once the
    # chunks (and the lowered programs' copies of the weights) are dropped, it is there once.
    if output is not None:             # streamed into its file, never whole in memory
        write_atomically(output, program)
        del program, edge
        # the delegates torch's and executorch's caches hold (release.py)
        release_lowering_memory()
        return LoweredGeneration(None, partitioners, inspected)
    with tempfile.TemporaryFile() as file:
        program.write_to_file(file)
        del program, edge
        release_lowering_memory()
        file.seek(0)
        pte = file.read()
    return LoweredGeneration(pte, partitioners, inspected)


class CacheNotShared(RuntimeError):
    """A mutable buffer is not at one place that all the methods read and write."""


def check_shared(program, methods: list, buffers: set) -> None:
    """Every buffer of ``buffers`` (by name) is in the shared arena (mem_id 2) at the same
    offsets in each of ``methods`` of the emitted ``program``; else :class:`CacheNotShared`:
    one method would write a cache another does not read."""
    places: dict = {}
    for plan in program.execution_plan:
        if plan.name not in methods:
            continue
        for value in plan.values:
            info = getattr(value.val, "extra_tensor_info", None)
            where = getattr(value.val, "allocation_info", None)
            if info is not None and info.fully_qualified_name in buffers and where is not None:
                places.setdefault(info.fully_qualified_name, {})[plan.name] = (
                    where.memory_id, where.memory_offset_low, where.memory_offset_high)
    for fqn in sorted(buffers):
        seen = places.get(fqn, {})
        if set(seen) != set(methods) or len(set(seen.values())) != 1 or \
                next(iter(seen.values()))[0] != 2:
            raise CacheNotShared(f"buffer {fqn} is not at one shared place in "
                                 f"{' and '.join(methods)} (memory id, offsets: {seen or 'none'})")


def emit_config():
    """executorch's emission with every mutable buffer (the cache) at one place that all
    methods share, if there are several: an arena of its own (mem_id 2), the same offset in
    each method; and the
    cache updated in place (``run_reinplace_pass``: the portable ``index_put`` that writes a
    step's rows, which otherwise copies the whole cache and has the runtime copy it back,
    becomes ``index_put_``, the rows alone; 0.5 ms of a 5.4 ms decode step at ``xnnfold bench
    llm-decode``'s dims,
    docs/llm.md). executorch's pass changes only an ``index_put`` whose cache no
    later node reads. A cond's outputs (mixture-of-experts layers) planned where they live on
    (:mod:`xnnfold.export.cond_memory`)."""
    from executorch.exir import ExecutorchBackendConfig
    from executorch.exir.passes import MemoryPlanningPass

    from ..cond_memory import CondOutputsInParent
    from ..written_inputs import backend_config

    # backend_config: the reinplace pass, then what reads an index_put_'s result reads the
    # tensor it wrote (executorch 1.5.1's planner does not count the result as a reader)
    return backend_config(ExecutorchBackendConfig(
        memory_planning_pass=MemoryPlanningPass(share_mutable_buffers=True,
                                                memory_planning_algo=CondOutputsInParent()),
        emit_mutable_buffer_names=True))


def causal_lm_to_pte(model: nn.Module, max_cache: Optional[int] = None,
                     max_prefill: Optional[int] = None, quantize: Optional[str] = None,
                     **partitioner_kwargs) -> bytes:
    """The generation-ready .pte of ``model`` through xnnfold (``quantize``: ``"8da4w"`` or
    ``"int8"``, :mod:`xnnfold.export.llm.quantize`; ``partitioner_kwargs``: those of
    :class:`~xnnfold.XnnpackPartitioner`, e.g. ``prefer="size"``)."""
    generation = export_causal_lm(model, max_cache, max_prefill, quantize=quantize)
    return lower_generation(generation, partitioner_kwargs=partitioner_kwargs).pte
