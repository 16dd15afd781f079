"""The shared helper's verdicts: a broken .pte, a users'-path difference and a swallowed
internal failure each fail it with their own type. One model, lowered once per variant for
the whole module (the lowerings are cached; each test patches what it breaks)."""

import math

import pytest
import torch
import torch.nn.functional as F

import conftest
from conftest import Fallback, NumericMismatch, Params, UsersPathDiffers, check_lowering
from xnnfold.pte import STOCK, XNNFOLD
from conftest import set_strict
from xnnfold.steps.fold.probe import fast as fast_probe
from xnnfold.steps.fold.probe import verified as verified_probe

K = 8


def _two_parts(p, x):
    w1, w2 = p.weight.split(K)
    return F.linear(x, w1) + F.linear(x, w2)


@pytest.fixture(scope="module")
def packed():
    conftest.seed_everything("test_verdicts.packed")
    model = Params(_two_parts, weight=(2 * K, K)).eval()
    inputs = (torch.randn(3, K),)
    ep = torch.export.export(model, inputs)
    real, cache = conftest.lower, {}

    def lower_once(program, variant, kwargs=None):
        if variant not in cache:
            cache[variant] = real(program, variant, kwargs)
        return cache[variant]
    return model, inputs, ep, lower_once


@pytest.fixture
def helper(packed, monkeypatch):
    model, inputs, ep, lower_once = packed
    monkeypatch.setattr(conftest, "lower", lower_once)
    return lambda: check_lowering(model, inputs, ep=ep)


def test_the_helper_passes_the_unbroken_lowering(helper):
    checked = helper()
    assert checked.fold.modified and len(checked.fold.folded) == 2
    assert checked.folded_diff < 1e-5


@pytest.mark.parametrize("broken,says", [
    (lambda outputs: [torch.full_like(o, math.nan) for o in outputs], "NaN/inf"),
    (lambda outputs: [o[:, :1] for o in outputs], "shape (3,1) vs (3,8)"),
    (lambda outputs: outputs + outputs, "2 output(s) vs eager's 1"),
], ids=["nan", "wrong-shape", "extra-output"])
def test_a_broken_runtime_output_is_a_numeric_mismatch(helper, monkeypatch, broken, says):
    real = conftest.run_pte
    monkeypatch.setattr(conftest, "run_pte", lambda pte, args: broken(real(pte, args)))
    with pytest.raises(NumericMismatch) as raised:
        helper()
    assert says in str(raised.value)


def test_the_users_path_deciding_otherwise_is_caught(helper, monkeypatch):
    """Verification off, the probe declines everything: the lowering (verified) folded."""
    verified_call = verified_probe.VerifiedProbe.__call__
    monkeypatch.setattr(verified_probe.VerifiedProbe, "__call__", lambda self, program, c: (
        verified_call(self, program, c) if self.verify else set()))
    with pytest.raises(UsersPathDiffers, match="declined"):
        helper()


def test_a_fast_probe_failure_swallowed_on_the_users_path_fails_in_strict_mode(helper,
                                                                               monkeypatch):
    helper()     # the lowerings, before the fast probe is broken

    def broken(self, program, constants):
        raise RuntimeError("injected fast-probe failure")
    monkeypatch.setattr(fast_probe.FastProbe, "__call__", broken)
    with pytest.raises(Fallback, match="with verification off: .*injected fast-probe failure"):
        helper()
    # Users' path as shipped: the whole-program probe answers, the same fold, no failure.
    set_strict(monkeypatch, False)
    helper()


def test_the_cache_holds_one_lowering_per_variant(packed, helper):
    helper()
    _, _, ep, lower_once = packed
    assert lower_once(ep, STOCK) is lower_once(ep, STOCK)
    assert lower_once(ep, XNNFOLD).fold.fallback is None
