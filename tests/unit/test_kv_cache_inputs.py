"""Caches a program takes as inputs and writes in place (transformers' exporter's ``decode``:
the ``StaticCache`` passed in, written and returned), without lowering: the KV-cache step's
grouped attention over them, the caches keeping the caller's shape; and the exporter's pass
dropping the copies executorch's re-traces add before such an input is returned."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from xnnfold.export import written_inputs
from xnnfold.graph.program_copy import copy_program
from xnnfold.pte.compare import compare_outputs
from xnnfold.steps import kv_cache
from xnnfold.steps.kv_cache import pattern

E, KV, GROUPS, S, D = 16, 2, 2, 8, 4
H = KV * GROUPS


class InputCaches(nn.Module):
    """One attention as transformers' exporter traces its decode: the key and value caches and
    the position counter are inputs, written in place (``index_copy_`` at ``arange(L) + n``,
    ``n += L``); the mask is an input; the caches are returned (``returned=False``: only
    written)."""

    def __init__(self, returned=True):
        super().__init__()
        self.returned = returned
        self.q = nn.Linear(E, H * D)
        self.k, self.v = nn.Linear(E, KV * D), nn.Linear(E, KV * D)

    @staticmethod
    def _repeat(cache):
        return cache[:, :, None, :, :].expand(1, KV, GROUPS, S, D).reshape(1, H, S, D)

    def forward(self, x, mask, k_cache, v_cache, counter):
        length = x.shape[1]
        q = self.q(x).view(1, length, H, D).transpose(1, 2)
        k = self.k(x).view(1, length, KV, D).transpose(1, 2)
        v = self.v(x).view(1, length, KV, D).transpose(1, 2)
        where = torch.arange(length) + counter
        counter.add_(length)
        keys = k_cache.index_copy_(2, where, k)
        values = v_cache.index_copy_(2, where, v)
        out = F.scaled_dot_product_attention(q, self._repeat(keys), self._repeat(values),
                                             attn_mask=mask)
        out = out.transpose(1, 2).reshape(1, length, H * D)
        return (out, keys, values, counter) if self.returned else out


def inputs(seed=0, position=3):
    """A decode step at ``position``, seeded: the mask lets cache rows 1 .. position through
    (a padded prompt: row 0 blocked; at position 0 the query's whole row is blocked)."""
    gen = torch.Generator().manual_seed(seed)
    mask = torch.zeros(1, 1, 1, S, dtype=torch.bool)
    mask[..., 1:position + 1] = True
    return (torch.randn(1, 1, E, generator=gen), mask,
            torch.randn(1, KV, S, D, generator=gen), torch.randn(1, KV, S, D, generator=gen),
            torch.tensor(position))


def rewritten(module):
    torch.manual_seed(0)
    module = module.eval().requires_grad_(False)
    ep = torch.export.export(module, copy.deepcopy(inputs()))
    program = copy_program(ep)
    return program, kv_cache.rewrite_kv_caches(program)


def verdict(program, module, step_inputs):
    """The rewritten program's outputs and written inputs against eager's, on copies."""
    ours, theirs = copy.deepcopy(step_inputs), copy.deepcopy(step_inputs)
    with torch.no_grad():
        got, want = program.module()(*ours), module(*theirs)
    return compare_outputs((got, ours[2:]), (want, theirs[2:]))


def ops_of(program) -> set:
    return {str(n.target) for n in program.graph.nodes if n.op == "call_function"}


@pytest.mark.parametrize("returned", [True, False], ids=["returned", "written-only"])
def test_caches_given_as_inputs_grouped_and_kept_as_the_caller_gives_them(returned):
    module = InputCaches(returned)
    program, records = rewritten(module)
    (record,) = records
    assert record.rewritten, record.describe()
    assert record.caches == ("k_cache", "v_cache")
    assert "not repeated" in record.kernels and "[B * Hkv" not in record.proven
    assert "aten.expand.default" not in ops_of(program)
    # not the buffers' advice (run_reinplace_pass=True alone is wrong on an input)
    assert "a program input" in record.describe() and "written_inputs" in record.describe()
    shapes = {n.name: tuple(n.meta["val"].shape) for n in program.graph.nodes
              if n.op == "placeholder" and n.name.endswith("cache")}
    assert shapes == {"k_cache": (1, KV, S, D), "v_cache": (1, KV, S, D)}
    for position in (0, 3, S - 1):
        result = verdict(program, module, inputs(seed=position, position=position))
        assert result.ok, (position, result)


def test_caches_given_as_inputs_are_not_taken_without_the_rule(monkeypatch):
    """Without recognising a written input as a cache, the step leaves the attention (and its
    repeat of the cache) to the attention step: nothing to say here."""
    monkeypatch.setattr(pattern, "user_inputs", lambda program: set())
    _, records = rewritten(InputCaches())
    assert records == []


# --------------------------------------------------------------------------------------------
# The copies re-tracing adds before a written input is returned (the exporter's pass).


class Broadcast(nn.Module):
    """Writes a row broadcast over its input: ``copy(input, row)`` of another shape."""

    def forward(self, x, row):
        x.copy_(row)
        return x * 2.0


def edge_program(module, example, passes=()):
    from executorch.exir import to_edge_transform_and_lower

    module = module.eval().requires_grad_(False)
    ep = torch.export.export(module, copy.deepcopy(example))
    return to_edge_transform_and_lower(ep, transform_passes=list(passes)).exported_program()


def copies(program) -> int:
    from executorch.exir.dialects._ops import ops as exir_ops

    return sum(1 for n in program.graph.nodes if n.target is exir_ops.edge.aten.copy.default)


def test_the_copies_of_a_written_input_dropped():
    torch.manual_seed(0)
    module, example, found = InputCaches(), inputs(), []

    def dropping(graph_module):
        found.append(len(written_inputs.retrace_copies(graph_module.graph)))
        return written_inputs.drop_retrace_copies(graph_module)

    program = edge_program(module, example, [dropping])
    assert found == [3]                  # each written input copied again by the re-trace
    assert copies(program) == 0
    ours, theirs = copy.deepcopy(example), copy.deepcopy(example)
    with torch.no_grad():
        got, want = program.module()(*ours), module(*theirs)
    result = compare_outputs((got, ours[2:]), (want, theirs[2:]))
    assert result.ok, result


def test_a_copy_that_broadcasts_is_kept():
    example = (torch.zeros(2, 3), torch.arange(3.0))
    program = edge_program(Broadcast(), example, [written_inputs.drop_retrace_copies])
    assert written_inputs.retrace_copies(program.graph) == []
    assert copies(program) == 1
    ours = copy.deepcopy(example)
    with torch.no_grad():
        got = program.module()(*ours)
    assert compare_outputs((got, ours[0]), (torch.arange(3.0).expand(2, 3) * 2.0,
                                            torch.arange(3.0).expand(2, 3))).ok


def test_readers_of_an_in_place_write_read_the_tensor_written():
    """After executorch's reinplace_pass, what reads ``index_put_``'s result reads the tensor
    it wrote (its memory then lives as long as it is read); other ops are left alone."""
    from executorch.exir.dialects._ops import ops as exir_ops

    graph = torch.fx.Graph()
    cache, rows, where = (graph.placeholder(n) for n in ("cache", "rows", "where"))
    written = graph.call_function(exir_ops.edge.aten.index_put_.default,
                                  (cache, [None, None, where], rows))
    doubled = graph.call_function(exir_ops.edge.aten.mul.Scalar, (written, 2.0))
    summed = graph.call_function(exir_ops.edge.aten.add.Tensor, (doubled, doubled))
    graph.output((written, summed))
    module = torch.fx.GraphModule(torch.nn.Module(), graph)
    result = written_inputs.read_written_inputs(module)
    assert result.modified
    assert doubled.args[0] is cache and graph.output_node().args[0] == (cache, summed)
    assert summed.args == (doubled, doubled) and written in graph.nodes
    assert not written_inputs.read_written_inputs(module).modified


class WrittenThenRead(nn.Module):
    """A tensor the program makes, written by ``index_put`` and read after another tensor is
    made: what executorch 1.5.1's memory planner gets wrong once the write is in place."""

    def forward(self, x, where, rows):
        made = torch.ops.aten.index_put(x + 0.0, [None, None, where], rows)
        other = (x * 3.0 + 1.0) * (x * 3.0 + 1.0)
        return made * 2.0 + other, other


@pytest.mark.parametrize("read_written", [True, False], ids=["read-written", "reinplace-only"])
def test_an_in_place_write_read_after_other_tensors_runs_right(read_written):
    """On the runtime: with executorch's reinplace_pass alone the written tensor's memory is
    given to a later tensor while the write's result is still read (wrong); with
    :func:`read_written_inputs` after it, eager's values."""
    from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower

    from xnnfold.pte import run_pte

    gen = torch.Generator().manual_seed(0)
    example = (torch.randn(1, KV, S, D, generator=gen), torch.tensor([3]),
               torch.randn(1, KV, 1, D, generator=gen))
    edge = to_edge_transform_and_lower(torch.export.export(WrittenThenRead(), example))
    config = written_inputs.backend_config() if read_written else \
        ExecutorchBackendConfig(run_reinplace_pass=True)
    program = edge.to_executorch(config)
    assert any("index_put_" in str(n.target) for n in program.exported_program().graph.nodes)
    result = compare_outputs(run_pte(program.buffer, example), WrittenThenRead()(*example))
    assert result.ok is read_written, result
