"""The report's tables, charts and progress follow the variants a model has, on fabricated rows
(no lowering): the charts' numbers are the table's, titles and sections name only what is
there, a run with nothing to draw leaves no chart."""

from types import SimpleNamespace

import matplotlib.figure
import pytest
import torch

from xnnfold.bench import charts, report, tables
from xnnfold.pte.devtools import DELEGATE
from xnnfold.models.sources import ModelSource


def _report(model: str, **variants) -> dict:
    """A report of ``model``: ``variant=(median ms, {op: ETDump ms})``, or an error string."""
    rows = []
    for variant, value in variants.items():
        variant = variant.replace("_", "-")
        row = report.Row(model, variant)
        if isinstance(value, str):
            row.error = value
        else:
            median, row.op_ms = value
            row.latency_ms = [median * 0.9, median, median * 1.2]
            row.gemms_outside, row.delegate_calls, row.pte_bytes = 0, 1, 1000
            row.ops_delegated, row.ops_outside = 5, 2
            row.ops_outside_by_type = {f"aten.{variant}_op.default": 2}
            row.outputs_ok, row.max_abs_diff = True, 1e-7
            row.lower_seconds, row.peak_rss_mib, row.base_rss_mib = 1.0, 300.0, 250.0
        rows.append(row)
    return {"schema": report.SCHEMA_VERSION, "date": "d", "machine": "m", "reps": 3, "seed": 0,
            "order": "shuffled", "skipped": {}, "rows": [report._row_dict(r, rows) for r in rows]}


@pytest.fixture
def drawn(monkeypatch):
    """The text of every figure the charts save: suptitle, titles and labels."""
    texts = []

    def savefig(figure, path, **kwargs):
        found = [figure._suptitle.get_text()] if figure._suptitle else []
        for ax in figure.axes:
            found += [ax.get_title(loc="left")] + [t.get_text() for t in ax.texts]
        texts.append(found)
        open(path, "wb").close()

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    return texts


def test_operator_chart_and_table_show_the_latency_tables_median(drawn, tmp_path):
    # the ETDump's own sums (0.21 / 0.54 ms) are not the table's medians (0.033 / 0.072 ms):
    # the chart and its table show the medians, split in the ETDump's shares
    made = _report("m", stock=(0.072, {DELEGATE: 0.30, "addmm.out": 0.24}),
                   xnnfold=(0.033, {DELEGATE: 0.21}))
    categories, split = tables.operator_split([r for r in made["rows"]])
    assert categories == [DELEGATE, "addmm.out", tables.OTHER_PORTABLE]
    assert split["stock"] == pytest.approx([0.072 * 0.30 / 0.54, 0.072 * 0.24 / 0.54, 0.0])
    assert sum(split["xnnfold"]) == pytest.approx(0.033)
    assert charts.plot_operator_times(made, tmp_path / "operators.png")
    (labels,) = drawn
    assert (tables.ms(0.072), tables.ms(0.033)) == ("0.0720", "0.0330")
    assert {" 0.0720 ms", " 0.0330 ms"} <= set(labels), labels
    assert not any("0.54" in t or "0.21" in t for t in labels), labels
    table = tables.table(made)
    assert "0.0720 (0.0648-0.0864)" in table and "0.0330 (0.0297-0.0396)" in table, table
    operators = tables.operator_table(made, "github")
    assert "| m       | stock     | 0.0720" in operators
    # the share of the run on portable kernels: all but the delegate's (0.24 of 0.54)
    assert "| 44.4%" in operators and "| 0.0%" in operators, operators


def test_latency_chart_names_the_variants_there_with_values(drawn, tmp_path):
    assert charts.plot(_report("m", stock=(2.0, {}), xnnfold=(0.5, {}), stock_flag=(1.0, {})),
                       tmp_path / "a.png")
    assert charts.plot(_report("m", stock=(2.0, {}), xnnfold=(0.5, {}), ideal=(0.6, {})),
                       tmp_path / "b.png")
    (title, _, *labels), (title_ideal, *_) = drawn
    assert title == "ExecuTorch runtime latency: stock vs xnnfold vs stock-flag", title
    assert title_ideal == "ExecuTorch runtime latency: stock vs xnnfold vs ideal"
    assert labels == [" 2.00 ms", " 0.500 ms · 0.25x stock", " 1.00 ms · 0.5x stock"], labels


def test_nothing_to_draw_leaves_no_chart_and_no_link(tmp_path):
    (tmp_path / "latency.png").write_bytes(b"an earlier run's")
    (tmp_path / "operators.png").write_bytes(b"an earlier run's")
    made = _report("m", stock="RuntimeError: no", xnnfold="RuntimeError: no")
    assert report.write(made, tmp_path) == ["report.md", "report.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json", "report.md"]
    text = (tmp_path / "report.md").read_text()
    assert ".png" not in text and "failed [1]" in text and "[1] RuntimeError: no" in text


def test_sections_follow_the_variants_present():
    text = tables.markdown(_report("m", stock=(2.0, {}), xnnfold=(0.5, {}),
                                   stock_flag=(1.0, {})), drawn=["latency.png"])
    assert "ideal" not in text, text                      # no ideal rewrite, no section
    outside = text.split("## Ops left outside delegates")[1].split("##")[0]
    assert "| m       | stock-flag | 5" in outside and "aten.stock-flag_op.default 2" in outside
    assert "operators.png" not in text and "latency.png" in text
    with_ideal = tables.markdown(_report("m", stock=(2.0, {}), xnnfold=(0.5, {}),
                                         ideal=(0.6, {})), drawn=[])
    assert "## xnnfold beside the ideal rewrite" in with_ideal


def _not_lowered(source, variant, *rest):
    return report.Row(source.name, variant, error="not lowered (the test)"), None


def test_progress_counts_the_variants_a_model_has(monkeypatch):
    """lora-linear has an ideal and no eager export: 4 of the 5 variants asked."""
    monkeypatch.setattr(report, "_lower_row", _not_lowered)
    asked = ["stock", "xnnfold", "stock-flag", "ideal", "eager-export"]
    progress = SimpleNamespace(n=0)
    progress.update = lambda n: setattr(progress, "n", progress.n + n)
    rows = report.measure_model(ModelSource("lora-linear"), 1, asked, progress=progress,
                                profile=False)
    assert [r.variant for r in rows] == ["stock", "xnnfold", "stock-flag", "ideal"]
    assert progress.n == 4
    case = SimpleNamespace(ideal=None, eager_export=None)
    assert report.variants_of(case, asked) == ["stock", "xnnfold", "stock-flag"]
    assert torch.is_grad_enabled()                # measure_model left no global state behind


def test_the_progress_total_is_right_from_the_start(monkeypatch, tmp_path, capsys):
    """``xnnfold report``'s bar: each model's variants counted before the first lowering
    (lora-linear and weight-norm-conv1d have an ideal, no eager export: it showed 0/6, then
    0/5 and 2/4 as each model was built)."""
    import re

    from xnnfold import cli

    monkeypatch.setattr(report, "_lower_row", _not_lowered)
    assert cli.main(["report", "lora-linear", "weight-norm-conv1d", "--variants",
                     "stock,ideal,eager-export", "--reps", "1", "--no-profile", "--out",
                     str(tmp_path)]) == 1                            # every variant "failed"
    shown = re.findall(r"(\d+)/(\d+) \[", capsys.readouterr().err)
    assert shown and {total for _, total in shown} == {"4"}, shown
    assert shown[-1] == ("4", "4"), shown
