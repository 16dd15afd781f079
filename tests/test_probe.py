"""The fast probe: contexts, signatures and the probe program (no lowering, milliseconds), then
the probe against the whole-program probe, data-dependent sizes, and explain's reuse."""

import importlib

import pytest
import torch
import torch.nn.functional as F
from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
    XnnpackPartitioner as StockXnnpackPartitioner,
)
from executorch.exir import to_edge_transform_and_lower
from torch import nn

import xnnfold
from xnnfold import partitioner, pipeline, shape_env
from xnnfold.steps.fold.probe import fast as fast_probe, verified as verified_probe
from xnnfold import models
from xnnfold.pte import STOCK, XNNFOLD, compare_outputs, lower, run_pte
from xnnfold.steps.fold.probe.cut import cut_context, param_keys, signature
from xnnfold.steps.fold.probe.program import build_module
from xnnfold import config as xnnfold_config
from xnnfold.config import Config

# folds in strict mode, with and without the whole-program probe checking the fast one
VERIFIED, FAST = Config(strict=True, verify_probe=True), Config(strict=True, verify_probe=False)

K = 12


class PackedPair(nn.Module):
    """A packed weight and bias split between two linears, one followed by relu."""

    def __init__(self, dtype=torch.float32):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(2 * K, K, dtype=dtype))
        self.bias = nn.Parameter(torch.randn(2 * K, dtype=dtype))

    def forward(self, x):
        (w1, w2), (b1, b2) = self.weight.chunk(2), self.bias.chunk(2)
        return torch.relu(F.linear(x, w1, b1)), F.linear(x, w2, b2)


def _folded(model, inputs, dynamic_shapes=None):
    """The folded program with every fold the static rules allow (no probe)."""
    ep = torch.export.export(model, inputs, dynamic_shapes=dynamic_shapes)
    result = pipeline.run(ep, probe=None)
    assert result.fallback is None, result.fallback
    return result


def _contexts(result):
    program = result.program
    keys = param_keys(program)
    gemms = fast_probe.consumer_gemms(program, result.constants)
    return program, [cut_context(g, keys) for g in gemms]


# --------------------------------------------------------------------------------------------
# Builder (no lowering)


def test_context_holds_the_gemm_its_fused_user_and_its_operands():
    torch.manual_seed(0)
    program, (first, second) = _contexts(_folded(PackedPair(), (torch.randn(5, K),)))
    assert [n.target for n in first.nodes] == [torch.ops.aten.linear.default,
                                                torch.ops.aten.relu.default]
    assert [n.target for n in second.nodes] == [torch.ops.aten.linear.default]
    act, weight, bias = first.externals
    assert (act.is_param, weight.is_param, bias.is_param) == (False, True, True)
    assert weight.key.startswith("_xnnfold_") and bias.key.startswith("_xnnfold_")


def test_equal_gemms_share_a_signature_and_others_do_not():
    torch.manual_seed(0)

    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = PackedPair(), PackedPair(), PackedPair()

        def forward(self, x):
            return self.a(x) + self.b(x) + self.c(x.half().float())

    program, contexts = _contexts(_folded(Stack(), (torch.randn(5, K),)))
    ranges = dict(program.range_constraints)
    signatures = [signature(c, ranges) for c in contexts]
    assert len(contexts) == 6
    # Each layer's first linear (relu after it) equals the others', and so does each second
    # one; c's activation comes through casts, but the linear reads an fp32 tensor of the
    # same shape all the same.
    assert signatures[0] == signatures[2] == signatures[4]
    assert signatures[1] == signatures[3] == signatures[5]
    assert signatures[0] != signatures[1]
    half = _contexts(_folded(PackedPair(torch.float16), (torch.randn(5, K).half(),)))[1][0]
    assert signature(half, {}) != signatures[0]


def test_dynamic_dims_change_the_signature_and_keep_their_range():
    torch.manual_seed(0)
    rows = torch.export.Dim("rows", min=2, max=40)
    program, contexts = _contexts(_folded(PackedPair(), (torch.randn(5, K),),
                                          dynamic_shapes=({0: rows},)))
    _, static = _contexts(_folded(PackedPair(), (torch.randn(5, K),)))
    ranges = dict(program.range_constraints)
    assert signature(contexts[0], ranges) != signature(static[0], {})
    probe = build_module(contexts, ranges)
    (spec, _other) = probe.dynamic_shapes
    dim = spec[0]
    assert (dim.min, dim.max) == (2, 40)
    exported = torch.export.export(probe.module, probe.inputs,
                                   dynamic_shapes=probe.dynamic_shapes, strict=False)
    (bounds,) = exported.range_constraints.values()
    assert (int(bounds.lower), int(bounds.upper)) == (2, 40)


def test_probe_module_runs_and_exports_without_the_callers_shape_env():
    torch.manual_seed(0)
    program, contexts = _contexts(_folded(PackedPair(), (torch.randn(5, K),)))
    probe = build_module(contexts, {})
    assert len(probe.module(*probe.inputs)) == 2
    assert sorted(probe.slots.values()) == [(0, 1), (0, 2), (1, 1), (1, 2)]
    exported = torch.export.export(probe.module, probe.inputs, strict=False)
    env = next(n.meta["val"].fake_mode.shape_env for n in exported.graph.nodes
               if isinstance(n.meta.get("val"), torch.Tensor))
    caller = next(n.meta["val"].fake_mode.shape_env for n in program.graph.nodes
                  if isinstance(n.meta.get("val"), torch.Tensor))
    assert env is not caller


# --------------------------------------------------------------------------------------------
# Against the whole-program probe


def _probe(verify=False):
    return verified_probe.make_probe(StockXnnpackPartitioner(), verify=verify)


# A decoder layer's GEMMs are asked once each and its linears answered without lowering; a
# conv is asked of its config without lowering too.
@pytest.mark.parametrize("make,folded", [(models.decoder_case, 12),
                                         (models.weight_norm_case, 1)],
                         ids=["decoder layer", "weight_norm conv"])
def test_asked_once_and_answered_without_lowering(make, folded):
    case = make()
    ep = torch.export.export(case.model, case.inputs)
    probe = _probe(verify=True)
    result = pipeline.run(ep, probe, verification=probe.verification)
    assert result.fallback is None and len(result.folded) == folded
    assert (probe.fast.exports, probe.fast.lowerings) == (1, 0)


class Bf16Part(nn.Module):
    """Two parts of one weight: an fp32 linear XNNPACK takes, a bf16 one it declines."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(32, K))

    def forward(self, x, x16):
        w1, w2 = self.weight.split(16)
        return F.linear(x, w1), F.linear(x16, w2.to(torch.bfloat16))


def test_a_declined_group_agrees_with_the_whole_program_probe():
    torch.manual_seed(0)
    x = torch.randn(5, K)
    ep = torch.export.export(Bf16Part(), (x, x.bfloat16()))
    probe = _probe(verify=True)
    result = pipeline.run(ep, probe, verification=probe.verification)
    assert result.fallback is None
    # The bf16 linear is declined by the ops_to_not_decompose filter: it might still be taken
    # as an addmm once decomposed, so the probe program goes through the lowering.
    assert (probe.fast.exports, probe.fast.lowerings) == (1, 1)
    # XNNPACK takes the fp32 part, not the bf16 one (the group is folded whole).
    assert {o.gemm: o.delegated for o in result.operands} == {"linear": True, "linear_1": False}


@pytest.mark.fallback_expected
def test_a_disagreement_fails_the_fold_naming_the_gemm(monkeypatch):
    """The verification guard: a fast probe that declines everything must be caught."""
    monkeypatch.setattr(fast_probe.FastProbe, "__call__", lambda self, program, constants: set())
    ep = torch.export.export(PackedPair(), (torch.randn(5, K),))
    verified = xnnfold.fold_gemm_params(ep, config=Config(strict=False, verify_probe=True))
    assert verified.fallback is not None and "disagreement" in verified.fallback
    assert "linear" in verified.fallback
    unverified = xnnfold.fold_gemm_params(ep, config=FAST)
    assert unverified.fallback is None
    assert {o.rule for o in unverified.operands} == {"delegated"}


def _count_whole_program_probes(monkeypatch) -> list:
    calls = []
    real = verified_probe.delegated_placeholders
    monkeypatch.setattr(verified_probe, "delegated_placeholders",
                        lambda *args: calls.append(1) or real(*args))
    return calls


def test_a_lowering_checks_the_last_answer_with_its_own_partition(monkeypatch):
    """Verification of a fold's last answer costs no second decomposition in a lowering: the
    lowering's partition() is the whole-program judge. On its own, the fold asks the
    whole-program probe."""
    calls = _count_whole_program_probes(monkeypatch)
    ep = torch.export.export(PackedPair(), (torch.randn(5, K),))
    lowered = lower(ep, XNNFOLD)            # verification on (conftest)
    assert lowered.fold.fallback is None and len(lowered.fold.folded) == 4   # 2 weights, 2 biases
    assert calls == []
    assert xnnfold.fold_gemm_params(ep, config=VERIFIED).fallback is None
    assert calls == [1]


def test_a_disagreement_found_by_the_lowerings_partition_fails_it(monkeypatch):
    """The handed-over check is a real check: a fast probe that takes everything, where
    XNNPACK declines the bf16 linear, makes the lowering raise, naming that GEMM."""
    fast = fast_probe.FastProbe.__call__
    monkeypatch.setattr(fast_probe.FastProbe, "__call__", lambda self, program, constants: (
        fast(self, program, constants) | set(param_keys(program).values())))
    x = torch.randn(5, K)
    ep = torch.export.export(Bf16Part(), (x, x.bfloat16()))
    with pytest.raises(verified_probe.ProbeDisagreement, match="linear_1"):
        lower(ep, XNNFOLD)


# --------------------------------------------------------------------------------------------
# Data-dependent sizes


class MaskedAndWeightNorm(nn.Module):
    """A weight_norm linear beside a boolean-mask index (an unbacked size)."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.utils.parametrizations.weight_norm(nn.Linear(K, K))

    def forward(self, x):
        return self.linear(x), x[x > 0]


def _run_and_compare(lowered, model, x):
    with torch.no_grad():
        expected = model(x)
    expected = [expected] if isinstance(expected, torch.Tensor) else list(expected)
    outputs = run_pte(lowered.pte, (x,))
    verdict = compare_outputs(outputs, expected)
    assert verdict.ok, verdict


@pytest.mark.parametrize("dynamic", [False, True], ids=["static rows", "dynamic rows"])
def test_data_dependent_program_lowers_with_xnnfold_then_stock(dynamic):
    torch.manual_seed(0)
    model, x = MaskedAndWeightNorm().eval(), torch.randn(4, K)
    shapes = ({0: torch.export.Dim("rows", min=2, max=32)},) if dynamic else None
    ep = torch.export.export(model, (x,), dynamic_shapes=shapes)
    others = [x, torch.randn(11, K)] if dynamic else [x]
    folded = lower(ep, XNNFOLD)       # verification on (conftest): both probes ran
    assert folded.fold.fallback is None and len(folded.fold.folded) == 1
    assert folded.gemms_outside == []
    for inputs in others:
        _run_and_compare(folded, model, inputs)
    again = lower(ep, XNNFOLD)
    assert again.fold.fallback is None
    stock = lower(ep, STOCK)          # the caller's program is still lowerable
    for inputs in others:
        _run_and_compare(stock, model, inputs)


def test_own_shape_env_is_load_bearing(monkeypatch):
    """Without the isolation, xnnfold's lowering leaves the caller's ShapeEnv unlowerable."""
    monkeypatch.setattr(shape_env, "give_own_shape_env", lambda program: None)
    monkeypatch.setattr(xnnfold_config, "DEFAULT", FAST)   # the fast probe alone leaves nothing
    torch.manual_seed(0)
    ep = torch.export.export(MaskedAndWeightNorm().eval(), (torch.randn(4, K),))
    lower(ep, XNNFOLD)
    with pytest.raises(Exception, match="PendingUnbackedSymbolNotFound|Pending unbacked"):
        lower(ep, STOCK)


def test_verification_probe_isolation_is_load_bearing(monkeypatch):
    """The whole-program probe alone (on the folded program, sharing the caller's ShapeEnv)
    leaves pending symbols that break the next lowering, unless it lowers its own copy."""
    monkeypatch.setattr(verified_probe, "needs_own_shape_env", lambda program: False)
    torch.manual_seed(0)
    ep = torch.export.export(MaskedAndWeightNorm().eval(), (torch.randn(4, K),))
    result = xnnfold.fold_gemm_params(ep, config=VERIFIED)
    assert result.fallback is None
    with pytest.raises(Exception, match="PendingUnbackedSymbolNotFound|Pending unbacked"):
        to_edge_transform_and_lower(ep, partitioner=[StockXnnpackPartitioner()])


class MaskedRowsLinear(nn.Module):
    """A weight_norm linear over the rows a boolean mask keeps (an unbacked activation dim)."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.utils.parametrizations.weight_norm(nn.Linear(K, K))

    def forward(self, x):
        return self.linear(x[x[:, 0] > 0])


def test_unbacked_activation_is_asked_of_the_whole_program(xnnfold_log):
    torch.manual_seed(0)
    model, x = MaskedRowsLinear().eval(), torch.randn(6, K)
    ep = torch.export.export(model, (x,))
    folded = lower(ep, XNNFOLD)
    assert folded.fold.fallback is None
    messages = [r.getMessage() for r in xnnfold_log.records if r.name == "xnnfold"]
    assert any("fast probe cannot model node" in m for m in messages), messages
    _run_and_compare(folded, model, x)
    lower(ep, STOCK)


# --------------------------------------------------------------------------------------------
# explain


def test_explain_after_a_lowering_reuses_its_result(monkeypatch):
    case = models.attention_case("cross")
    ep = torch.export.export(case.model, case.inputs)
    used = xnnfold.XnnpackPartitioner()
    to_edge_transform_and_lower(ep, partitioner=[used])
    explain_module = importlib.import_module("xnnfold.explain")
    monkeypatch.setattr(explain_module, "fold_gemm_params",
                        lambda *args, **kwargs: pytest.fail("explain folded again"))
    rows = xnnfold.explain(ep, used)
    assert [r.status for r in rows] == [r.status for r in used.last_result.operands]
    other = torch.export.export(case.model, case.inputs)
    with pytest.raises(pytest.fail.Exception, match="folded again"):
        xnnfold.explain(other, used)     # another program: no reuse


def test_context_keeps_a_no_op_cast_of_a_param():
    """``b.type_as(x)`` reads a user input but is the param once decomposed: the probe must
    see the cast (found as a disagreement with the whole-program probe on test_real_code)."""

    class Cast(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(K, K)

        def forward(self, x):
            return F.linear(x, self.linear.weight.to(x.dtype) * 2.0,
                            self.linear.bias.type_as(x))

    program, (context,) = _contexts(_folded(Cast(), (torch.randn(3, K),)))
    assert [n.target for n in context.nodes][:1] == [torch.ops.aten.type_as.default]
    bias_param = [e for e in context.externals if e.key == "linear.bias"]
    assert len(bias_param) == 1 and bias_param[0].is_param
    result = xnnfold.fold_gemm_params(torch.export.export(Cast(), (torch.randn(3, K),)),
                                      config=VERIFIED)
    assert result.fallback is None and len(result.folded) == 1
