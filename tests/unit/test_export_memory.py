"""What an LLM export holds in memory, on small graphs: the quantized copy shares the caller's
tensors (no second copy of the weights) and leaves the caller's model as it was; the .pte is
built through a file (its bytes those of executorch's ``.buffer``); no lowered delegate outlives
the written .pte."""

import gc
import weakref

import torch
from torch import nn

from xnnfold.export.llm.quantize import quantized_copy


class _Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(64, 32)
        self.body = nn.Linear(32, 32)
        self.head = nn.Linear(32, 64, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("scale", torch.ones(32))

    def forward(self, ids):
        return self.head(self.body(self.embed(ids)) * self.scale)



class _Counter(nn.Module):
    """A linear and a buffer the program writes: a generation program's two kinds of state."""

    def __init__(self, width: int):
        super().__init__()
        self.register_buffer("total", torch.zeros(width))
        self.linear = nn.Linear(width, width)

    def forward(self, x):
        self.total.add_(x.sum(0))
        return self.linear(x) + self.total

def test_the_quantized_copy_shares_the_callers_tensors_and_changes_nothing_of_it():
    model = _Tied().eval()
    before = {name: t.clone() for name, t in model.state_dict().items()}
    copied = quantized_copy(model, "8da4w")
    # the tensors nothing quantizes are the caller's own, not copies
    assert copied.embed.weight is model.embed.weight
    assert copied.scale is model.scale and copied.body.bias is model.body.bias
    # the copy's linears are quantized; the caller's are the fp32 ones, bit for bit
    assert type(copied.body.weight.data) is not torch.Tensor
    assert type(model.body.weight.data) is torch.Tensor and model.head.weight is model.embed.weight
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, before[name]), name
    ids = torch.randint(0, 64, (1, 5))
    with torch.no_grad():
        assert torch.equal(model(ids), _reference(before)(ids))


def _reference(state):
    model = _Tied().eval()
    model.load_state_dict(state)
    return model


def test_the_pte_read_back_from_the_file_is_executorchs_buffer(tmp_path):
    from executorch.exir import to_edge_transform_and_lower

    from xnnfold.export.llm.export import GenerationPrograms, lower_generation

    program = torch.export.export(_Counter(4).eval(), (torch.ones(2, 4),))
    lowered = lower_generation(GenerationPrograms({"forward": program}))
    from xnnfold.export.llm.export import emit_config
    from xnnfold.partitioner import XnnpackPartitioner

    again = to_edge_transform_and_lower({"forward": program},
                                        partitioner={"forward": [XnnpackPartitioner()]})
    assert lowered.pte == again.to_executorch(emit_config()).buffer
    # given a file, the .pte is streamed into it and not returned
    written = lower_generation(GenerationPrograms({"forward": program}),
                               output=tmp_path / "m.pte")
    assert written.pte is None and (tmp_path / "m.pte").read_bytes() == lowered.pte


def test_a_pte_file_is_scanned_for_the_llm_kernels_a_chunk_at_a_time(tmp_path):
    """Generator(path) never reads the .pte whole: the operator names are looked for a chunk at
    a time, across the chunks' boundaries too."""
    from xnnfold.export.llm.runtime import LLM_KERNELS, _file_holds

    path = tmp_path / "m.pte"
    for offset in range(0, 12):                   # the name at every place about a boundary
        path.write_bytes(b"x" * offset + LLM_KERNELS + b"y" * 5)
        assert _file_holds(str(path), LLM_KERNELS, chunk=8), offset
    path.write_bytes(b"llama:" + b"z" * 20 + b":")
    assert not _file_holds(str(path), LLM_KERNELS, chunk=8)


def test_the_written_pte_is_checked_from_its_file_with_the_program_dropped(tmp_path,
                                                                          monkeypatch):
    """export_generation's check: eager's reference computed before the lowering, then the
    runtime given the written file (not its bytes) while no exported program is alive, and
    the .pte's bytes no longer referenced. Fakes for the export, the lowering and the runtime."""
    import gc

    import xnnfold.export.llm as llm
    from xnnfold.export.hf import generation
    from xnnfold.export.llm.export import GenerationPrograms
    from xnnfold.pte.compare import Comparison

    order, given = [], []

    class Program:                   # stands for an ExportedProgram: found if still alive
        pass

    def exported(model, max_cache, max_prefill):
        order.append("export")
        return GenerationPrograms({"forward": Program()}, {"get_vocab_size": 64}, 32, 8)

    class Runtime:
        def __init__(self, pte):
            given.append(pte)
            assert not [o for o in gc.get_objects() if isinstance(o, Program)]

    def lowered(gen, variant, prefer, output=None):
        order.append("lower")
        output.write_bytes(bytes(16))            # the written variant: streamed into its file
        return output, generation.MethodLowering(16, 0.0, [], 1, [])

    monkeypatch.setattr(llm, "export_causal_lm", exported)
    monkeypatch.setattr(llm, "Generator", Runtime)
    monkeypatch.setattr(generation, "_lower", lowered)
    monkeypatch.setattr(generation, "eager_reference",
                        lambda model, prompt: order.append("eager") or "reference")
    monkeypatch.setattr(generation, "_check", lambda reference, runtime, quantized=False: (
        Comparison(True, 0.0), Comparison(True, 0.0)))
    import transformers as tf

    model = _Tied().eval()
    model.config = tf.LlamaConfig()            # what the notes read of a causal LM
    output = tmp_path / "m.pte"
    generation.export_generation(model, output, False, 4, 1, "speed", True, None, None)
    assert order == ["export", "eager", "lower"] and given == [output]
    assert output.read_bytes() == bytes(16)


# After lower_generation has written its .pte, nothing keeps the lowered delegates (and
# XNNPACK's serialized copy of the weights they hold) alive: torch's fake-tensor dispatch caches
# hold them otherwise (xnnfold.export.llm.release).

def _delegates(edge) -> list:
    from executorch.exir.lowered_backend_module import get_lowered_submodules

    graph_module = edge.exported_program("forward").graph_module
    return [weakref.ref(module) for _, module, _ in get_lowered_submodules(graph_module)]


def test_no_lowered_delegate_outlives_the_written_pte(tmp_path):
    from xnnfold.export.llm.export import GenerationPrograms, lower_generation

    torch.manual_seed(0)
    rows = torch.export.Dim("rows", min=1, max=8)      # a ShapeEnv's cache, and the class's
    program = torch.export.export(_Counter(16).eval(), (torch.randn(3, 16),),
                                  dynamic_shapes=({0: rows},))
    lowered = lower_generation(GenerationPrograms({"forward": program}), before_emit=_delegates,
                               output=tmp_path / "m.pte")
    delegates = lowered.inspected
    assert delegates and (tmp_path / "m.pte").stat().st_size > 0
    gc.collect()
    alive = [ref() for ref in delegates if ref() is not None]
    assert not alive, f"{len(alive)} of {len(delegates)} lowered delegates still alive"


def test_release_clears_every_live_shape_envs_cache_and_the_declined_nodes():
    """What a lowering leaves held in objects it does not return: the cache of any ShapeEnv
    still alive (executorch's traces make their own; the caller's program's is not the only
    one) and the node each of XNNPACK's partitioner configs last declined (module-level
    ``WhyNoPartition``: the node's graph holds the delegates)."""
    from executorch.backends.xnnpack.partition.config import gemm_configs
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from xnnfold.export.llm.release import release_lowering_memory

    class Held:                          # stands for a delegate a cache key or a node reaches
        pass

    env = ShapeEnv()                     # alive, and no program given names it
    cached, declined = Held(), Held()
    env.fake_tensor_cache[cached] = cached
    before = gemm_configs.why.node
    gemm_configs.why.node = declined
    refs = [weakref.ref(cached), weakref.ref(declined)]
    del cached, declined
    try:
        release_lowering_memory()
        gc.collect()
        assert [ref() is None for ref in refs] == [True, True]
        assert not env.fake_tensor_cache and gemm_configs.why.node is None
    finally:
        gemm_configs.why.node = before


# Run in a process of its own: in a process whose heap already has a free chunk of the size
# (a test worker's), malloc takes that chunk whatever the threshold.
_MAPPED = """
import ctypes, sys, torch
from xnnfold.export.llm.release import map_large_blocks

class Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]

mallinfo2 = ctypes.CDLL("libc.so.6").mallinfo2
mallinfo2.restype = Mallinfo2
large = torch.empty(20 << 20, dtype=torch.uint8)
del large                                  # glibc's own threshold rises to 20 MB
if sys.argv[1] == "mapped":
    assert map_large_blocks(1 << 20)
before = mallinfo2().hblkhd                # bytes in blocks malloc mapped on their own
copy = torch.ones(2 << 20, dtype=torch.uint8)
held = mallinfo2().hblkhd - before
del copy
print(held, mallinfo2().hblkhd - before)
"""


def test_large_blocks_are_mapped_on_their_own_and_given_back():
    """After a 20 MB block is freed, glibc's own threshold is 20 MB: a 2 MB weight's copy goes
    to its heap. With map_large_blocks it is mapped alone, and unmapped when freed."""
    import platform
    import subprocess
    import sys

    import pytest

    if platform.system() != "Linux" or not platform.libc_ver()[0] == "glibc":
        pytest.skip("glibc's malloc only")

    def mapped(how: str) -> list:
        done = subprocess.run([sys.executable, "-c", _MAPPED, how], capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        return [int(n) for n in done.stdout.split()[-2:]]

    assert mapped("default") == [0, 0]                 # in the heap, and kept there
    held, after = mapped("mapped")
    assert held >= 2 << 20 and after < 1 << 20


def test_the_hf_command_maps_large_blocks_before_it_exports(monkeypatch):
    import argparse

    from xnnfold.cli import hf as hf_command
    from xnnfold.export import hf
    from xnnfold.export.hf import rows as hf_rows
    from xnnfold.export.llm import release

    calls = []
    monkeypatch.setattr(release, "map_large_blocks", lambda: calls.append("mapped") or True)
    monkeypatch.setattr(hf, "export_folder", lambda *a, **k: calls.append("export") or
                        hf_rows.Exported([], [], []))
    args = argparse.Namespace(threads=None, plan=None, output="m.pte", compare=False, tokens=8,
                              attention="auto", reps=1, prefer="speed", no_check=False,
                              no_cache=False, max_cache=None, max_prefill=None,
                              llm_kernels=False, quantize=None)
    assert hf_command._cmd_hf(args) == 0 and calls == ["mapped", "export"]
