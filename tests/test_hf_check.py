"""``xnnfold hf``'s check judges every output of every part at the scale of its row
(``compare_outputs(per_row=True)``), not only a causal LM's logits: a T5 with large activations
is right where an element-wise tolerance says WRONG on values near zero, and a broken output
is still WRONG."""

import pytest
import torch
from torch import nn

import xnnfold.pte
from xnnfold.export import hf
from xnnfold.export.hf import parts as hf_parts
from xnnfold.export.hf import plan as hf_plan
from xnnfold.export.hf.rows import Exported
from xnnfold.export.transformers import import_transformers
from xnnfold.pte import run_pte
from xnnfold.pte.compare import compare_outputs


@pytest.fixture(scope="module")
def large_t5(tmp_path_factory):
    """A T5 of activations about 3 times transformers' default (``initializer_factor=3``)
    through ``xnnfold hf``'s Python API: (its plan, the folder of its .pte files, what it
    wrote). Seed 2: a state where its encoder's .pte differs from eager by 3e-5 on a value of
    0.016 (measured 2026-12-06; the element-wise tolerance there is 1.2e-5), 4.5e-6 of its
    row's scale."""
    tf = import_transformers()
    torch.manual_seed(2)
    folder = tmp_path_factory.mktemp("large-t5")
    tf.T5ForConditionalGeneration(tf.T5Config(
        d_model=32, d_ff=64, num_layers=1, num_decoder_layers=1, num_heads=2, d_kv=16,
        vocab_size=100, initializer_factor=3.0)).save_pretrained(str(folder / "t5"))
    plan = hf_plan.plan(str(folder / "t5"), cache=False)
    return plan, folder, hf.export_folder(plan, str(folder / "t5.pte"), cache=False)


def _encoder_outputs(plan, folder):
    """(the written encoder .pte's output, eager's) on the inputs hf checked it with."""
    model, _ = hf_parts.load(plan, "auto")
    encoder = next(p for p in hf_parts.parts(plan, model, 8) if p.name == "encoder")
    with torch.no_grad():
        expected = encoder.module(*encoder.inputs)
    (got,) = run_pte((folder / "t5.encoder.pte").read_bytes(), encoder.inputs)
    return got, expected


def test_a_t5_of_large_activations_passes_where_element_wise_says_wrong(large_t5):
    plan, folder, exported = large_t5
    assert exported.wrong == [], exported.wrong
    assert [(r["part"], r["outputs"].split()[0]) for r in exported.rows] == \
        [("encoder", "max"), ("decoder", "max")], exported.rows
    got, expected = _encoder_outputs(plan, folder)
    # the same outputs, element-wise: WRONG on a value near zero (what the check said before)
    assert not compare_outputs([got], expected).ok
    assert compare_outputs([got], expected, per_row=True).ok


def test_one_row_off_by_a_share_of_its_scale_is_wrong(large_t5):
    """The .pte's real outputs with one token's hidden state off by 1e-3 of its row's scale at
    its value nearest zero (another GELU approximation in every layer is 2e-4 to 5e-4)."""
    plan, folder, _ = large_t5
    got, expected = _encoder_outputs(plan, folder)
    row = expected[0, 3]
    broken = got.clone()
    broken[0, 3, int(row.abs().argmin())] += 1e-3 * float(row.abs().max())
    verdict = compare_outputs([broken], expected, per_row=True)
    assert not verdict.ok and "row's largest |expected|" in verdict.reason, verdict


class _WithRows(nn.Module):
    """Rows of very different scales: row 0 about 1000 times row 1."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 16)

    def forward(self, x):
        return self.linear(x) * torch.tensor([[1000.0], [1.0]])


def test_hf_says_wrong_for_a_part_whose_pte_is_off_in_one_row(tmp_path, monkeypatch):
    """The check of a part (not logits), end to end: the runtime's output off by 1% of the
    small row's scale, within 1e-4 of the whole tensor's: WRONG, named."""
    class OffInRowOne(xnnfold.pte.PteRunner):
        def run(self, inputs):
            (out,) = super().run(inputs)
            out = out.clone()
            out[1, 0] += 0.01 * float(out[1].abs().max())
            return [out]

    monkeypatch.setattr(xnnfold.pte, "PteRunner", OffInRowOne)
    part = hf_parts.Part("", _WithRows().eval(), (torch.randn(2, 8),))
    exported = Exported([], [], [])
    hf._export_part(part, tmp_path / "rows.pte", exported, False, 1, "speed", True)
    assert len(exported.wrong) == 1 and "WRONG: output 0" in exported.wrong[0], exported.wrong
    assert "row's largest |expected|" in exported.wrong[0], exported.wrong
