"""The attention step and the projection split on PT2E-quantized graphs (XNNPACK's quantizer,
static and dynamic int8), without lowering: the rewritten program, run as a module, computes
what the converted module computes; every quantize/dequantize stays where the quantizer put it;
no op the rewrite adds is one XNNPACK would take as a quantized op; an int8 packed projection
is cut into int8 row blocks. Plus the attention's users whose strides the rewrite changes.
"""

import pytest
import torch
import torch.nn.functional as F
from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
    XNNPACKQuantizer,
    get_symmetric_quantization_config,
)
from torch import nn
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

from xnnfold.analysis import find_static
from xnnfold.analysis.gemms import op_name
from xnnfold.steps import attention, projections
from xnnfold.steps.attention import restride
from xnnfold.graph.program_copy import copy_program, copy_with_nodes
from xnnfold.steps.projections import quantized as int8_parts

E, HEADS, B, L = 16, 2, 1, 6
qd = torch.ops.quantized_decomposed


class Heads(nn.Module):
    """q/k/v linears, attention (SDPA, or transformers' eager form), out linear."""

    def __init__(self, eager=False):
        super().__init__()
        self.q, self.k, self.v, self.out = (nn.Linear(E, E) for _ in range(4))
        self.eager = eager

    def forward(self, x):
        b, length, _ = x.shape
        q, k, v = (p(x).view(b, length, HEADS, E // HEADS).transpose(1, 2)
                   for p in (self.q, self.k, self.v))
        if self.eager:
            weights = torch.softmax(torch.matmul(q, k.transpose(2, 3)) * 0.35, dim=-1)
            out = torch.matmul(weights, v)
        else:
            out = F.scaled_dot_product_attention(q, k, v)
        return self.out(out.transpose(1, 2).reshape(b, length, E))


class SelfMha(nn.Module):
    def __init__(self):
        super().__init__()
        self.mha = nn.MultiheadAttention(E, HEADS, batch_first=True)
        nn.init.normal_(self.mha.in_proj_bias)

    def forward(self, x):
        return self.mha(x, x, x, need_weights=False)[0]


def converted(model, inputs, dynamic):
    config = get_symmetric_quantization_config(is_per_channel=True, is_dynamic=dynamic)
    module = prepare_pt2e(torch.export.export(model.eval(), inputs).module(),
                          XNNPACKQuantizer().set_global(config))
    module(*inputs)
    return convert_pt2e(module)


@pytest.fixture(scope="module")
def programs():
    """{(form, dynamic): (converted module, its exported program, inputs)}, built once."""
    torch.manual_seed(0)
    inputs = (torch.randn(B, L, E),)
    built = {}
    for form in ("sdpa", "eager"):
        model = Heads(eager=form == "eager")
        for dynamic in (False, True):
            module = converted(model, inputs, dynamic)
            built[form, dynamic] = (module, torch.export.export(module, inputs), inputs)
    return built


def qdq_nodes(program) -> list:
    """Each quantize / dequantize: its op and its quantization arguments."""
    return sorted((op_name(n.target), tuple(map(str, n.args[1:]))) for n in program.graph.nodes
                  if n.op == "call_function" and "quantize" in op_name(n.target))


def is_dequantize(node) -> bool:
    return node.op == "call_function" and "dequantize" in op_name(node.target)


def taken_as_quantized(node) -> bool:
    """What XNNPACK's ``GenericNodePartitionerConfig.get_node_and_deps`` takes as a quantized
    op (for a config with static quantization): every input a dequantize, one user, a
    quantize."""
    inputs = node.all_input_nodes
    if not inputs or not all(is_dequantize(i) for i in inputs) or len(node.users) != 1:
        return False
    user = next(iter(node.users))
    return user.op == "call_function" and op_name(user.target).startswith(
        "quantized_decomposed.quantize")


@pytest.mark.parametrize("form", ["sdpa", "eager"])
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_quantized_attention_is_rewritten_and_keeps_its_quantization(programs, form, dynamic):
    module, ep, inputs = programs[form, dynamic]
    copy = copy_program(ep)
    records = attention.rewrite_attention(copy)
    assert records and all(r.rewritten for r in records), records
    # static: q, k, v (and, eager, the softmax output and v) come out of a dequantize
    reads = [attention.quantized.READS_DEQUANTIZED in r.proven for r in records]
    assert reads == [not dynamic] * len(records), records
    # every q/dq the quantizer put in stays, with its parameters; nothing new is quantized
    assert qdq_nodes(copy) == qdq_nodes(ep)
    before = {n.name for n in ep.graph.nodes}
    added = [n for n in copy.graph.nodes if n.name not in before]
    assert added and not any(taken_as_quantized(n) for n in added)
    if form == "eager" and not dynamic:
        # the scores' scale is the quantized mul the quantizer annotated: still dq -> mul -> q
        muls = [n for n in copy.graph.nodes if n.target is torch.ops.aten.mul.Tensor]
        assert any(taken_as_quantized(n) for n in muls)
    # fp32 arithmetic in another order can move a value across a rounding boundary of the
    # out projection's input quantize: one of its steps at most
    step = max(n.args[1] for n in ep.graph.nodes
               if op_name(n.target) == "quantized_decomposed.quantize_per_tensor.default"
               and isinstance(n.args[1], float)) if not dynamic else 1e-5
    with torch.no_grad():
        torch.testing.assert_close(copy.module()(*inputs), module(*inputs), atol=step * 2,
                                   rtol=1e-4)


class TransposedView(nn.Module):
    """Heads laid out as ``nn.MultiheadAttention`` lays them out ([L, B*H, D] memory), and
    ``.permute(2, 0, 1, 3).contiguous().view(...)`` after SDPA, whose output keeps that
    layout: the permuted output is contiguous, so the contiguous leaves no node and the view
    relies on those strides."""

    def forward(self, x):
        length, batch, embed = x.shape
        heads = x.view(length, batch * HEADS, embed // HEADS).transpose(0, 1) \
            .view(batch, HEADS, length, embed // HEADS)
        out = F.scaled_dot_product_attention(heads, heads, heads)
        return out.permute(2, 0, 1, 3).contiguous().view(batch * length, embed)


def _heads():
    return (torch.randn(L, 2, E, generator=torch.Generator().manual_seed(3)),)


def test_a_view_relying_on_the_attentions_strides_still_traces():
    inputs = _heads()
    ep = torch.export.export(TransposedView(), inputs)
    views = [n for n in ep.graph.nodes if n.target is torch.ops.aten.view.default
             and n.args[0].target is torch.ops.aten.permute.default]
    assert views and not any(n.target is torch.ops.aten.contiguous.default
                             for n in ep.graph.nodes)
    copy = copy_program(ep)
    assert attention.rewrite_attention(copy)[0].rewritten
    copy.run_decompositions({})        # raised "Cannot view a tensor with shape ..." before
    assert [n.target for n in copy.graph.nodes if n.name == views[0].name] == \
        [torch.ops.aten.reshape.default]
    torch.testing.assert_close(copy.module()(*inputs), TransposedView()(*inputs))


def test_without_restriding_the_users_the_view_fails_to_trace(monkeypatch):
    # The negative test of restride: the users keep the strides SDPA had, and the program no
    # longer decomposes (to_edge_transform_and_lower raised where stock lowers).
    monkeypatch.setattr(restride, "plan_restride", lambda old, new: ({}, []))
    copy = copy_program(torch.export.export(TransposedView(), _heads()))
    assert attention.rewrite_attention(copy)[0].rewritten
    with pytest.raises(Exception, match="view"):
        copy.run_decompositions({})


# --------------------------------------------------------------------------------------------
# The int8 packed projection


@pytest.fixture(scope="module")
def mha_programs():
    torch.manual_seed(1)
    inputs = (torch.randn(B, L, E),)
    model = SelfMha().eval()
    built = {}
    for dynamic in (False, True):
        module = converted(model, inputs, dynamic)
        built[dynamic] = (module, torch.export.export(module, inputs), inputs)
    return built


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_int8_packed_projection_is_cut_into_int8_row_blocks(mha_programs, dynamic):
    module, ep, inputs = mha_programs[dynamic]
    facts = find_static(ep)
    (site,) = projections.find_packed_projections(facts)
    assert site.int8_weight is not None and site.int8_weight.per_channel
    assert (site.output_qdq is not None) == (not dynamic)     # static: q/dq after the linear
    packed = site.int8_weight.dequantize
    packed_int8 = facts.placeholder_values[packed.args[0]]
    packed_scales = facts.placeholder_values[packed.args[1]]
    program, nodes = copy_with_nodes(ep)
    projections.split_packed_projections(program, [site], nodes)
    assert sorted(site.part_linears) == [0, 1, 2]
    values = {n.name: v for n, v in find_static(program).placeholder_values.items()}
    for index, name in site.part_linears.items():
        part = next(n for n in program.graph.nodes if n.name == name)
        x, weight = part.args[0], part.args[1]
        assert op_name(weight.target) == "quantized_decomposed.dequantize_per_channel.default"
        rows = weight.args[0]       # a slice of the packed int8 tensor: the fold's to store
        assert rows.target is torch.ops.aten.slice.Tensor and \
            rows.args == (nodes[packed.args[0]], 0, index * E, (index + 1) * E)
        assert torch.equal(values[weight.args[1].name],
                           packed_scales[index * E:(index + 1) * E])
        # static: one dequantize of the input per part, as PT2E leaves a program;
        # dynamic: the run-time quantized input shared, as PT2E shares it
        assert (len(x.users) == 1) == (not dynamic)
        if not dynamic:
            (q,) = part.users
            assert tuple(q.args[1:]) == tuple(nodes[site.output_qdq[0]].args[1:])
    # the packed dequantize went, with its scales and zero points; its int8 tensor stays
    # (read by the slices) until the fold frees it
    names = {n.name for n in program.graph.nodes}
    assert packed.name not in names and packed.args[1].name not in names
    assert packed.args[0].name in names and packed_int8.dtype == torch.int8
    with torch.no_grad():
        torch.testing.assert_close(program.module()(*inputs), module(*inputs))


def _single_linear(dequantize) -> torch.export.ExportedProgram:
    """A linear whose weight is ``dequantize(int8 buffer, ...)``, exported."""

    class Linear(nn.Module):
        def __init__(self):
            super().__init__()
            # square: scales per row and per column have the same length
            self.register_buffer("w", torch.randint(-127, 127, (4, 4), dtype=torch.int8))
            self.register_buffer("scales", torch.rand(4) / 100 + 1e-3)
            self.register_buffer("zeros", torch.zeros(4, dtype=torch.int64))
            self.register_buffer("column_scales", torch.rand(4) / 100 + 1e-3)
            self.register_buffer("column_zeros", torch.zeros(4, dtype=torch.int64))

        def forward(self, x):
            return F.linear(x, dequantize(self))

    import executorch.exir.passes.quant_fusion_pass  # noqa: F401 - registers quantized_decomposed
    return torch.export.export(Linear(), (torch.randn(3, 4),))


def _weight_of(ep):
    linear = next(n for n in ep.graph.nodes if n.target is torch.ops.aten.linear.default)
    return linear.args[1], find_static(ep)


@pytest.mark.parametrize("dequantize, cut", [
    (lambda m: qd.dequantize_per_channel.default(m.w, m.scales, m.zeros, 0, -127, 127,
                                                 torch.int8), True),
    (lambda m: qd.dequantize_per_tensor.default(m.w, 0.01, 0, -127, 127, torch.int8), True),
    # scales per input channel: a block of rows is not a block of the quantization
    (lambda m: qd.dequantize_per_channel.default(m.w, m.column_scales, m.column_zeros, 1,
                                                 -127, 127, torch.int8), False),
    # scales computed at run time from the weight: not constants the split can cut
    (lambda m: qd.dequantize_per_channel.default(m.w, m.scales * 2, m.zeros, 0, -127, 127,
                                                 torch.int8), False),
], ids=["per-channel", "per-tensor", "per-input-channel", "computed-scales"])
def test_which_int8_weights_are_cut_by_rows(dequantize, cut):
    weight, facts = _weight_of(_single_linear(dequantize))
    assert (int8_parts.quantized_weight(weight, facts) is not None) == cut


def test_an_output_requantized_with_other_parameters_is_not_one_per_tensor_qdq():
    # linear -> q(s1) -> dq(s2) is not "the same q/dq per part" (it rescales): not matched
    class Requantized(nn.Module):
        def __init__(self, out_scale):
            super().__init__()
            self.linear, self.out_scale = nn.Linear(4, 4), out_scale

        def forward(self, x):
            y = qd.quantize_per_tensor.default(self.linear(x), 0.05, 0, -128, 127, torch.int8)
            return qd.dequantize_per_tensor.default(y, self.out_scale, 0, -128, 127, torch.int8)

    import executorch.exir.passes.quant_fusion_pass  # noqa: F401 - registers quantized_decomposed
    for out_scale, matched in ((0.05, True), (0.1, False)):
        ep = torch.export.export(Requantized(out_scale), (torch.randn(2, 4),))
        linear = next(n for n in ep.graph.nodes if n.target is torch.ops.aten.linear.default)
        assert (int8_parts.output_qdq(linear) is not None) == matched
