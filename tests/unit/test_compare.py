"""compare_outputs (xnnfold.pte.compare), the one comparison of the tests and the report, on
fabricated outputs: what a max of differences hides must fail, and the report must say WRONG."""

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from xnnfold.bench import report, tables
from xnnfold.pte.compare import Comparison, compare_outputs, default_tolerance
from xnnfold.models.sources import ModelSource

EXPECTED = torch.tensor([40.0, -3.0, 0.5, 0.0])


def test_scaled_tolerance_passes_what_an_absolute_1e_5_fails():
    # 40 + 1.5e-5: 4 ulp of fp32 at 40, what stock's own .pte differs by on some draws
    actual = EXPECTED.clone()
    for _ in range(4):
        actual[0] = torch.nextafter(actual[0], torch.tensor(50.0))
    verdict = compare_outputs([actual], EXPECTED)
    assert verdict.ok and 1e-5 < verdict.max_abs_diff < 2e-5, verdict
    assert verdict.max_rel_diff == pytest.approx(verdict.max_abs_diff / 40)


def test_beyond_tolerance_fails_with_the_values():
    actual = EXPECTED + torch.tensor([0.0, 0.0, 1e-3, 0.0])
    verdict = compare_outputs([actual], EXPECTED)
    assert not verdict.ok and verdict.max_abs_diff == pytest.approx(1e-3, rel=1e-3)
    assert "output 0: max abs diff 0.001" in verdict.reason and "0.501 vs 0.5" in verdict.reason
    # the caller's own tolerance: atol 1e-2 takes it
    assert compare_outputs([actual], EXPECTED, atol=1e-2).ok


def test_nan_where_eager_is_finite_fails():
    # max(0.0, nan) is 0.0: a max of differences passes an all-NaN output
    verdict = compare_outputs([torch.full((4,), math.nan)], EXPECTED)
    assert not verdict.ok and "4 NaN/inf element(s) where eager is finite" in verdict.reason
    assert str(verdict).startswith("WRONG: output 0: ")


def test_inf_where_eager_is_finite_fails():
    actual = EXPECTED.clone()
    actual[3] = math.inf
    assert "1 NaN/inf" in compare_outputs([actual], EXPECTED).reason


def test_nan_and_inf_where_eager_has_them_must_match():
    expected = torch.tensor([math.nan, math.inf, 1.0])
    assert compare_outputs([expected.clone()], expected).ok
    wrong = torch.tensor([math.nan, -math.inf, 1.0])
    assert "where eager is NaN or inf" in compare_outputs([wrong], expected).reason


def test_shape_mismatch_fails_where_broadcasting_would_pass():
    # (1,) against (4,) broadcasts: its difference from a constant reference is 0
    verdict = compare_outputs([torch.zeros(1)], torch.zeros(4))
    assert not verdict.ok and verdict.reason == "output 0: shape (1,) vs (4,)"
    assert math.isnan(verdict.max_abs_diff)


def test_dtype_mismatch_fails():
    verdict = compare_outputs([EXPECTED.double()], EXPECTED)
    assert verdict.reason == "output 0: dtype torch.float64 vs torch.float32"


def test_missing_and_extra_outputs_fail():
    # zip() drops what has no partner
    assert compare_outputs([EXPECTED], (EXPECTED, EXPECTED)).reason == "1 output(s) vs eager's 2"
    assert compare_outputs([EXPECTED, EXPECTED], EXPECTED).reason == "2 output(s) vs eager's 1"


def test_nested_eager_outputs_and_none_leaves():
    # an MHA returns (out, None); the runtime returns a flat list
    first, second = torch.randn(2, 3), torch.randn(3)
    assert compare_outputs([first, second], ((first, None), [second])).ok
    verdict = compare_outputs([first, second], ((first, None), [second + 1]))
    assert not verdict.ok and verdict.reason.startswith("output 1: ")


def test_integers_are_exact_and_defaults_per_dtype():
    assert default_tolerance(torch.int64) == (0.0, 0.0)
    assert default_tolerance(torch.float32) == (1e-4, 1e-5)
    assert not compare_outputs([torch.tensor([1, 2])], torch.tensor([1, 3])).ok
    half = torch.tensor([1.0, 2.0], dtype=torch.bfloat16)
    assert compare_outputs([half * (1 + 2 ** -8)], half).ok       # within bf16's 1.6e-2


def test_worst_keeps_the_first_failure():
    good, bad = Comparison(True, 1e-6, 1e-7), Comparison(False, math.nan, math.nan, "x")
    assert good.worst(bad) is bad and bad.worst(good) is bad
    assert good.worst(Comparison(True, 2e-6, 0.0)).max_abs_diff == 2e-6


# ---------------------------------------------------------------------------------------------
# The report: a wrong .pte is marked WRONG, never a small number


class _FakeRunner:
    def __init__(self, pte, outputs):
        self._buffer, self._outputs = pte, outputs

    def run(self, inputs):
        return self._outputs


def _lowering(tmp_path, run_error=None) -> SimpleNamespace:
    """What the report's lowering process hands back for a 3-byte .pte with one delegate."""
    pte = tmp_path / "model.pte"
    pte.write_bytes(b"pte")
    return SimpleNamespace(pte_path=str(pte), gemms_outside=0, delegate_calls=1,
                           delegation={"delegated": 1, "not_delegated": 0,
                                       "not_delegated_by_op": {}},
                           lower_seconds=0.1, peak_rss_mib=None, base_rss_mib=None,
                           gemms=[], run_error=run_error)


@pytest.mark.parametrize("outputs,says", [
    ([torch.full((1, 4), math.nan)], "NaN/inf"),
    ([torch.zeros(1)], "shape (1,) vs (1,4)"),
])
def test_report_marks_a_wrong_pte(monkeypatch, tmp_path, outputs, says):
    lowering = _lowering(tmp_path)
    monkeypatch.setattr(report, "lower_isolated", lambda *args: lowering)
    monkeypatch.setattr(report, "PteRunner", lambda data: _FakeRunner(data, outputs))
    case = SimpleNamespace(inputs=(torch.zeros(1, 4),))
    row, runner = report._lower_row(ModelSource("m"), "xnnfold", case, torch.zeros(1, 4), str(tmp_path),
                                    False)
    assert runner is not None and row.outputs_ok is False and says in row.mismatch
    rendered = tables.table({"rows": [report._row_dict(row, [row])]})
    assert "WRONG: output 0: " in rendered and says in rendered
    assert "e+00" not in rendered and "e-" not in rendered      # no small number instead


def test_report_shows_a_pte_that_does_not_run_as_failed(monkeypatch, tmp_path):
    """The lowering's process ran the .pte and it failed (or aborted): the row is failed with
    that reason, and the parent never loads it."""
    lowering = _lowering(tmp_path, run_error="the .pte does not run on the ExecuTorch "
                                             "runtime: its process was killed by SIGABRT")
    monkeypatch.setattr(report, "lower_isolated", lambda *args: lowering)
    monkeypatch.setattr(report, "PteRunner", lambda data: pytest.fail("loaded a failed .pte"))
    row, runner = report._lower_row(ModelSource("m"), "xnnfold", SimpleNamespace(inputs=()),
                                    torch.zeros(1), str(tmp_path), False)
    assert runner is None and row.error == lowering.run_error and row.pte_bytes == 3
    rendered = tables.table({"rows": [report._row_dict(row, [row])]})
    assert "failed [1]" in rendered and "\n[1] the .pte does not run on the ExecuTorch " \
           "runtime: its process was killed by SIGABRT" in rendered, rendered


@pytest.mark.parametrize("off_by, ok", [(0.22, True), (4.0, False)])
def test_report_judges_a_quantized_model_by_int8_rounding(monkeypatch, tmp_path, off_by, ok):
    # A PT2E model against its converted module: int8 kernels round otherwise than the
    # reference, by 5.5% of the largest output for stock's own .pte of a static ViT (passes);
    # a wrong value is off by the output's range (WRONG); with fp32's tolerance both would be
    # WRONG.
    expected = torch.tensor([[4.0, -1.0, 0.5, 0.0]])
    outputs = [expected + torch.tensor([[0.0, off_by, 0.0, 0.0]])]
    lowering = _lowering(tmp_path)
    monkeypatch.setattr(report, "lower_isolated", lambda *args: lowering)
    monkeypatch.setattr(report, "PteRunner", lambda data: _FakeRunner(data, outputs))
    case = SimpleNamespace(inputs=(torch.zeros(1, 4),))
    for quantize, verdict in (("static", ok), (None, False)):
        row, _ = report._lower_row(ModelSource("m", quantize), "xnnfold", case, expected,
                                   str(tmp_path), False)
        assert row.outputs_ok is verdict, (quantize, row.mismatch)


def test_report_shows_the_diff_of_a_right_pte():
    row = {"outputs_ok": True, "max_abs_diff": 2.4e-7, "mismatch": None}
    assert tables.outputs_cell(row) == "2.4e-07"
    assert tables.outputs_cell({**row, "outputs_ok": False, "mismatch": "x"}) == "WRONG: x"


def test_no_max_abs_diff_helper_left():
    """One comparison: the old zip-and-max helper is gone from the package and the tests."""
    from xnnfold.pte import lowering as measure
    assert not hasattr(measure, "max_abs_diff")
    root = Path(__file__).resolve().parents[2]
    users = [p for folder in ("src", "tests", "bench") for p in (root / folder).rglob("*.py")
             if "max_abs_diff(" in p.read_text() and p.name != "test_compare.py"]
    assert users == [], users


def test_check_pte_says_why_a_pte_fails(monkeypatch):
    """lower --check's verdict (xnnfold.pte.isolated.check_pte), the run faked: outputs that
    differ, int8 outputs within 10% of the largest, a .pte that does not run."""
    from xnnfold.pte import isolated
    expected = torch.tensor([10.0, -4.0])
    monkeypatch.setattr(isolated, "run_isolated", lambda path, inputs: [expected + 0.2])
    verdict = isolated.check_pte("m.pte", (), expected)
    assert not verdict.ok and verdict.reason.startswith(
        "its outputs differ from eager's: output 0: max abs diff 0.2"), verdict.reason
    assert isolated.check_pte("m.pte", (), expected, quantized=True).ok     # 0.2 < 1.0

    def fails(path, inputs):
        raise RuntimeError("the .pte does not run on the ExecuTorch runtime: its process was "
                           "killed by SIGABRT")
    monkeypatch.setattr(isolated, "run_isolated", fails)
    verdict = isolated.check_pte("m.pte", (), expected)
    assert not verdict.ok and verdict.reason.endswith("killed by SIGABRT"), verdict



def test_logits_are_judged_at_the_scale_of_their_row():
    expected = torch.tensor([[5.0, 0.01, -3.0]])
    near_zero_off = expected + torch.tensor([[0.0, 3e-5, 0.0]])
    assert not compare_outputs(near_zero_off, expected).ok       # 3e-5 > 1e-5 + 1e-4 * 0.01
    verdict = compare_outputs(near_zero_off, expected, per_row=True)   # <= 1e-5 + 1e-4 * 5
    assert verdict.ok and verdict.max_rel_diff == pytest.approx(3e-5 / 5, rel=1e-3)
    # another approximation of GELU in every layer (stock's Gemma): 2e-4 to 5e-4 of the rows'
    # scale
    wrong = compare_outputs(expected + torch.tensor([[0.0, 1.5e-3, 0.0]]), expected,
                            per_row=True)
    assert not wrong.ok and "rtol 0.0001 * the row's largest |expected|" in wrong.reason


def test_each_row_has_its_own_scale():
    expected = torch.tensor([[100.0, 1.0], [1.0, 0.5]])
    off = expected + torch.tensor([[0.0, 0.0], [5e-4, 0.0]])
    # the whole tensor's scale (100) would let 5e-4 through; its row's (1) does not
    assert compare_outputs(off, expected, atol=0.0, rtol=1e-4 * 100).ok
    assert not compare_outputs(off, expected, per_row=True).ok


def test_a_vector_is_one_row_and_a_scalar_its_own_scale():
    """Outputs of rank < 2 with per_row (what ``xnnfold hf`` asks for every output): a 1-D
    output's row is the whole tensor, a 0-dim one is judged at its own magnitude, integers are
    exact."""
    vector = torch.tensor([5.0, 0.01, -3.0])
    assert compare_outputs(vector + torch.tensor([0.0, 3e-5, 0.0]), vector, per_row=True).ok
    assert not compare_outputs(vector + torch.tensor([0.0, 1.5e-3, 0.0]), vector,
                               per_row=True).ok
    small = torch.tensor(0.01)
    assert not compare_outputs(small + 3e-5, small, per_row=True).ok    # > 1e-5 + 1e-4 * 0.01
    assert compare_outputs(torch.tensor(5.0) + 3e-5, torch.tensor(5.0), per_row=True).ok
    ids = torch.tensor([[3, 4]])
    assert not compare_outputs(ids + torch.tensor([[0, 1]]), ids, per_row=True).ok
