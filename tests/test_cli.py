"""The command line on a small saved program and every bad input (the report: test_bench.py)."""

import subprocess
import sys

import pytest
import torch

from xnnfold.bench import cli, models
from xnnfold.bench.measure import run_pte


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    case = models.attention_case("cross")
    path = tmp_path_factory.mktemp("programs") / "cross.pt2"
    torch.export.save(torch.export.export(case.model, case.inputs), str(path))
    return case, path


def test_lower_writes_a_pte_that_runs(saved, tmp_path, capsys):
    case, path = saved
    out = tmp_path / "cross.pte"
    assert cli.main(["lower", str(path), "-o", str(out), "--explain"]) == 0
    printed = capsys.readouterr().out
    assert "GEMMs outside delegates: 0" in printed and "folded 6 constant(s)" in printed
    assert "mha.in_proj_weight" in printed and "declined" not in printed
    result = run_pte(out.read_bytes(), case.inputs)[0]
    assert float((result - case.model(*case.inputs)).abs().max()) <= 1e-5


def test_lower_stock(saved, tmp_path, capsys):
    _, path = saved
    assert cli.main(["lower", str(path), "-o", str(tmp_path / "s.pte"), "--stock"]) == 0
    assert "GEMMs outside delegates: 2" in capsys.readouterr().out


def test_explain(saved, capsys):
    _, path = saved
    assert cli.main(["explain", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    statuses = [line.split()[3] for line in lines[2:] if "packed projection" not in line]
    assert statuses == ["folded"] * 6 + ["plain"] * 2
    assert any("packed projection of 2 parts split into" in line for line in lines), lines


@pytest.mark.parametrize("kind", ["missing", "directory", "not_pt2", "corrupt", "not_program"])
def test_bad_input_is_one_line_and_exit_2(kind, tmp_path, capsys):
    path = {"missing": tmp_path / "nope.pt2", "directory": tmp_path,
            "not_pt2": tmp_path / "model.pt", "corrupt": tmp_path / "bad.pt2",
            "not_program": tmp_path / "tensor.pt2"}[kind]
    if kind == "not_pt2":
        path.write_bytes(b"x")
    elif kind == "corrupt":
        path.write_bytes(b"PK\x03\x04 this is not a zip archive")
    elif kind == "not_program":
        torch.save(torch.randn(3), str(path))
    assert cli.main(["explain", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("xnnfold: error:") and str(path) in err[0], err


def test_bad_output_folder(saved, tmp_path, capsys):
    _, path = saved
    assert cli.main(["lower", str(path), "-o", str(tmp_path / "no" / "x.pte")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_unknown_model_in_report(tmp_path, capsys):
    assert cli.main(["report", "--models", "nope", "--out", str(tmp_path)]) == 2
    assert "unknown model 'nope'" in capsys.readouterr().err


def test_debug_shows_the_traceback(tmp_path):
    with pytest.raises(cli.UsageError):
        cli.main(["--debug", "explain", str(tmp_path / "nope.pt2")])


def test_module_entry_point(tmp_path):
    done = subprocess.run([sys.executable, "-m", "xnnfold", "explain", str(tmp_path / "x.pt2")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "no such file" in done.stderr


class _TiedLinearHead(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = torch.nn.Embedding(200, 16)
        self.head = torch.nn.Linear(16, 200, bias=False)
        self.head.weight = self.embedding.weight

    def forward(self, tokens):
        return self.head(self.embedding(tokens))


def test_lower_prefer_size_stores_a_tied_table_once(tmp_path, capsys):
    torch.manual_seed(0)
    tokens = torch.tensor([[1, 5, 9]])
    path = tmp_path / "tied.pt2"
    torch.export.save(torch.export.export(_TiedLinearHead().eval(), (tokens,)), str(path))
    sizes = {}
    for prefer in ("speed", "size"):
        out = tmp_path / f"{prefer}.pte"
        assert cli.main(["lower", str(path), "-o", str(out), "--prefer", prefer,
                         "--explain"]) == 0
        assert "prefer='size'" in capsys.readouterr().out   # both options priced
        sizes[prefer] = len(out.read_bytes())
    # the table's 12,800 bytes, less the run-time input's few entries (measured: 80 bytes)
    assert sizes["speed"] - sizes["size"] >= 200 * 16 * 4 - 128, sizes
