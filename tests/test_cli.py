"""The command line on a small saved program and every bad input (the report: test_bench.py)."""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from xnnfold import cli, models
from xnnfold.usage import UsageError
from xnnfold.pte import run_pte


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
    rows = [line.split() for line in lines[2:]
            if "packed projection" not in line and " step: " not in line]
    assert {tuple(row[1:3]) for row in rows} == {("mha", "(MultiheadAttention)")}, rows
    assert [row[5] for row in rows] == ["folded"] * 6 + ["plain"] * 2
    assert any(line.startswith("attention step: attention") for line in lines), lines
    assert any("packed projection of 2 parts split into" in line for line in lines), lines
    assert any(line.startswith("fold step: 6 constant(s) folded") for line in lines), lines


@pytest.mark.parametrize("kind", ["missing", "directory", "not_pt2", "corrupt", "not_program",
                                  "not_an_export_archive"])
def test_bad_input_is_one_line_and_exit_2(kind, tmp_path, capsys):
    import zipfile

    path = {"missing": tmp_path / "nope.pt2", "directory": tmp_path,
            "not_pt2": tmp_path / "model.pt", "corrupt": tmp_path / "bad.pt2",
            "not_program": tmp_path / "tensor.pt2",
            "not_an_export_archive": tmp_path / "other.pt2"}[kind]
    if kind == "not_pt2":
        path.write_bytes(b"x")
    elif kind == "corrupt":
        path.write_bytes(b"PK\x03\x04 this is not a zip archive")
    elif kind == "not_program":
        torch.save(torch.randn(3), str(path))
    elif kind == "not_an_export_archive":
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("notes.txt", "x")
    assert cli.main(["explain", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("xnnfold: error:") and str(path) in err[0], err
    if kind == "not_an_export_archive":
        # torch's error says "check the warnings above", which the command hides: the line
        # says what they said
        assert "warnings above" not in err[0] and "torch warned: RuntimeError: [enforce fail " \
            "at inline_container.cc:180] . file in archive is not in a subdirectory: " \
            "notes.txt" in err[0], err


def _tiny_pte() -> bytes:
    from executorch.exir import to_edge

    program = torch.export.export(torch.nn.Linear(4, 2).eval(), (torch.randn(1, 4),))
    return to_edge(program).to_executorch().buffer


def _noise(size: int) -> bytes:
    rng = random.Random(37)
    return bytes(rng.randrange(256) for _ in range(size))


def test_a_corrupt_pte_is_one_line_and_exit_2_never_a_signal(tmp_path):
    """``xnnfold generate`` on random bytes ended in SIGABRT with no message (the runtime
    quotes the file's identifier bytes in its log line, and executorch's pybindings abort on
    a log line that is not UTF-8); PteRunner on a program with a valid identifier and a
    corrupt flatbuffer ended in SIGSEGV when run. Each in this process of its own."""
    noise = _noise(4000)
    with pytest.raises(UnicodeDecodeError):
        noise[4:8].decode()                          # what the runtime's log line aborted on
    (tmp_path / "random.pte").write_bytes(noise)
    good = _tiny_pte()
    (tmp_path / "corrupt.pte").write_bytes(good[:8] + noise[:len(good) - 8])
    # first, its imports' noise kept off stderr (the command's filter is not on yet)
    run_corrupt = ("import os\nstderr = os.dup(2)\nos.dup2(os.open(os.devnull, os.O_WRONLY), 2)\n"
                   "import torch\nfrom xnnfold.pte.runner import NotAPte, PteRunner\n"
                   "try:\n    PteRunner(open('corrupt.pte', 'rb').read()).run("
                   "(torch.ones(1, 4),))\nexcept NotAPte as error:\n"
                   "    print('PteRunner:', error, flush=True)\nos.dup2(stderr, 2)\n")
    done = _xnnfold("generate", "random.pte", "--tokens", "1,2", cwd=tmp_path,
                    prelude=run_corrupt)
    assert (done.returncode, done.stderr.strip().splitlines()) == (2, [
        "xnnfold: error: random.pte: not an ExecuTorch program (bytes 4-8 are "
        "7\\xe9\\x90\\xc1, not ET12)"]), (done.returncode, done.stderr[-2000:])
    assert done.stdout.strip() == "PteRunner: a corrupt or truncated ExecuTorch program: " \
        "the runtime refused it (RuntimeError: Failed to load program, error: 0x:23)", \
        done.stdout


def test_the_identifier_checked_is_the_installed_executorch_one():
    import re

    import executorch
    from xnnfold.pte.runner import PROGRAM_IDENTIFIER

    schema = (Path(list(executorch.__path__)[0]) / "schema" / "program.fbs").read_text()
    assert re.findall(r'file_identifier "(\w+)";', schema) == [PROGRAM_IDENTIFIER.decode()]


@pytest.mark.parametrize("kind, says", [
    ("short", "not an ExecuTorch program (6 byte(s))"),
    ("other identifier", "not an ExecuTorch program (bytes 4-8 are ZZZZ, not ET12)"),
    ("truncated", "a corrupt or truncated ExecuTorch program: the runtime refused it "
     "(RuntimeError: Failed to load program, error: 0x:23"),
])
def test_every_load_of_a_pte_checks_it_first(kind, says):
    """PteRunner, the generation runtime and the ETDump profile refuse it in one line (the
    pybindings loaded these without a word and failed at the first call)."""
    from xnnfold.export.llm import Generator
    from xnnfold.pte.devtools import operator_times
    from xnnfold.pte.runner import NotAPte, PteRunner

    good = _tiny_pte()
    data = {"short": good[:6], "other identifier": good[:4] + b"ZZZZ" + good[8:],
            "truncated": good[:len(good) // 2]}[kind]
    for load in (PteRunner, Generator, lambda pte: operator_times(pte, (torch.ones(1, 4),))):
        with pytest.raises(NotAPte) as refused:
            load(data)
        assert str(refused.value).startswith(says), (load, refused.value)


def test_bad_output_folder(saved, tmp_path, capsys):
    _, path = saved
    assert cli.main(["lower", str(path), "-o", str(tmp_path / "no" / "x.pte")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_unknown_model_in_report(tmp_path, capsys):
    assert cli.main(["report", "--models", "nope", "--out", str(tmp_path)]) == 2
    assert "unknown model 'nope'" in capsys.readouterr().err


def test_debug_shows_the_traceback(tmp_path):
    with pytest.raises(UsageError):
        cli.main(["--debug", "explain", str(tmp_path / "nope.pt2")])


def test_module_entry_point(tmp_path):
    done = subprocess.run([sys.executable, "-m", "xnnfold", "explain", str(tmp_path / "x.pt2")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "no such file" in done.stderr


# --------------------------------------------------------------------------------------------
# The report on the user's own model, and what a command needs before it starts

SRC = str(Path(__file__).resolve().parents[1] / "src")
USER_MODEL = '''
import torch
from torch import nn


class Mine(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)
        self.head = nn.utils.parametrizations.weight_norm(nn.Linear(16, 4))

    def forward(self, x, memory):
        return self.head(self.attn(x, memory, memory, need_weights=False)[0])


def build():
    torch.manual_seed(0)
    return Mine().eval(), (torch.randn(1, 5, 16), torch.randn(1, 7, 16))
'''


def _xnnfold(*args, cwd, prelude=""):
    """``python -m xnnfold ARGS`` as a user runs it, from ``cwd``; ``prelude`` runs first (to
    hide a module)."""
    code = f"{prelude}\nimport sys\nfrom xnnfold.cli import main\nsys.exit(main({list(args)!r}))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=cwd, env={**os.environ, "PYTHONPATH": SRC}, timeout=900)


@pytest.fixture(scope="module")
def user_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("outside_the_project")
    (folder / "mymodel.py").write_text(USER_MODEL)
    return folder


def test_report_on_a_factory_outside_the_project(user_folder):
    # default variants: stock, xnnfold, stock-flag (no ideal nor eager export for it; no
    # constant_prop_pass for a user's model)
    done = _xnnfold("report", "mymodel:build", "--reps", "2", "--out", "out", cwd=user_folder)
    assert done.returncode == 0, done.stderr[-3000:]
    variants = ("stock", "xnnfold", "stock-flag")
    rows = {line.split()[1]: line.split() for line in done.stdout.splitlines()
            if line.startswith("mymodel:build ") and line.split()[1] in variants}
    assert set(rows) == set(variants), done.stdout
    assert (rows["stock"][2], rows["xnnfold"][2]) == ("3", "0"), done.stdout   # GEMMs outside
    # the GEMMs in the user's terms: module path and class, and what stock leaves outside
    assert "attn (MultiheadAttention)" in done.stdout and "head (ParametrizedLinear)" in \
        done.stdout, done.stdout
    written = {f.name for f in (user_folder / "out").iterdir()}
    assert {"report.md", "report.json", "latency.png", "operators.png"} <= written, written
    saved = json.loads((user_folder / "out" / "report.json").read_text())
    folded = next(r for r in saved["rows"] if r["variant"] == "xnnfold")
    assert {g["module"] for g in folded["gemms"]} == {"attn (MultiheadAttention)",
                                                       "head (ParametrizedLinear)"}


def test_report_without_its_packages_says_so_before_any_work(user_folder):
    done = _xnnfold("report", "mymodel:build", cwd=user_folder,
                    prelude="import sys; sys.modules['tqdm'] = None")
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "xnnfold: error: xnnfold report needs tqdm: pip install 'xnnfold[bench]'"]
    assert not (user_folder / "mymodel.pyc").exists() and "lowering" not in done.stderr


def test_quantize_builds_the_converted_model_of_a_factory(user_folder, monkeypatch):
    from xnnfold.models.sources import ModelSource
    monkeypatch.chdir(user_folder)
    case = ModelSource.of("mymodel:build", "dynamic").build()
    targets = {str(n.target) for n in case.model.graph.nodes if n.op == "call_function"}
    assert any("choose_qparams" in t for t in targets), targets      # dynamic: per call
    assert case.name == "mymodel:build int8-dynamic"
    with pytest.raises(UsageError, match="expected one of dynamic, static"):
        ModelSource.of("mymodel:build", "int4")


@pytest.mark.parametrize("returned, says", [
    ("torch.nn.Linear(2, 2), 'x'",
     "element 1 of the tuple it returned is a str, not a tuple of inputs"),
    ("torch.nn.Linear(2, 2), torch.ones(2)",
     "element 1 of the tuple it returned is a Tensor, not a tuple of inputs (one input x: "
     "(x,))"),
    ("'model', (torch.ones(2),)", "element 0 of the tuple it returned is a str, not a module"),
    ("torch.nn.Linear(2, 2)", "it returned a Linear"),
])
def test_a_factory_returning_something_else_is_named(tmp_path, monkeypatch, capsys, returned,
                                                      says):
    (tmp_path / "wrongfactory.py").write_text(f"import torch\ndef build():\n    return "
                                              f"{returned}\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "wrongfactory", raising=False)
    assert cli.main(["explain", "wrongfactory:build"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["xnnfold: error: wrongfactory:build: the factory must return "
                   "(torch.nn.Module, tuple of example inputs[, dynamic_shapes]); " + says], err


def test_bench_scripts_are_commands(tmp_path):
    from xnnfold.bench.scripts import SCRIPTS
    import importlib.util
    assert all(importlib.util.find_spec(f"xnnfold.bench.scripts.{m}") for m in SCRIPTS.values())
    done = _xnnfold("bench", "decoder-stack-memory", "--help", cwd=tmp_path)   # no lowering
    assert done.returncode == 0 and "--layers" in done.stdout, done.stderr[-2000:]


def test_report_on_a_saved_program_without_matplotlib(saved, tmp_path, capsys, monkeypatch):
    """A .pt2 in the report; and with matplotlib missing, the report says so in one line and
    writes what it can: report.md and report.json."""
    _, path = saved
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert cli.main(["report", str(path), "--variants", "stock,xnnfold", "--reps", "2",
                     "--no-profile", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr()
    rows = [line.split() for line in printed.out.splitlines() if line.startswith("cross.pt2 ")]
    assert [(r[1], r[2]) for r in rows[:2]] == [("stock", "2"), ("xnnfold", "0")], rows
    assert "charts need matplotlib (pip install 'xnnfold[bench]')" in printed.err
    assert sorted(f.name for f in tmp_path.iterdir()) == ["report.json", "report.md"]
    assert "matplotlib is not installed" in (tmp_path / "report.md").read_text()
    assert cli.main(["report", str(tmp_path / "nope.pt2"), "--out", str(tmp_path)]) == 2
    assert "nope.pt2: no such file" in capsys.readouterr().err
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


# --------------------------------------------------------------------------------------------
# --quantize end to end, and lower --check: the .pte run on the ExecuTorch runtime

TESTS = str(Path(__file__).resolve().parent)


def test_quantize_dynamic_lowers_checks_and_runs_a_factory(user_folder, monkeypatch, capsys):
    from xnnfold.pte.compare import compare_outputs, quantized_tolerance
    from xnnfold.models.sources import ModelSource
    monkeypatch.chdir(user_folder)
    out = user_folder / "q.pte"
    assert cli.main(["lower", "mymodel:build", "--quantize", "dynamic", "-o", str(out),
                     "--check"]) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "GEMMs outside delegates: 0" in printed, printed
    assert "check: runs on the ExecuTorch runtime and matches eager (max abs diff" in printed
    case = ModelSource.of("mymodel:build", "dynamic").build()
    with torch.no_grad():
        expected = case.model(*case.inputs)
    verdict = compare_outputs(run_pte(out.read_bytes(), case.inputs), expected,
                              **quantized_tolerance(expected))
    assert verdict.ok and verdict.max_abs_diff > 0, verdict     # int8 arithmetic, for real
    assert cli.main(["explain", "mymodel:build", "--quantize", "dynamic"]) == 0
    assert "head (ParametrizedLinear)" in capsys.readouterr().out


def test_quantize_static_on_a_saved_program(saved, tmp_path, capsys):
    case, path = saved
    out = tmp_path / "s.pte"
    assert cli.main(["lower", str(path), "--quantize", "static", "-o", str(out),
                     "--check"]) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "GEMMs outside delegates: 0" in printed and "check: runs" in printed, printed
    assert len(run_pte(out.read_bytes(), case.inputs)) == 1
    assert cli.main(["explain", str(path), "--quantize", "static"]) == 0
    assert "folded" in capsys.readouterr().out


def test_check_fails_in_one_line_when_the_pte_does_not_run(tmp_path):
    # stock, so that a fix of this pattern in xnnfold's pass leaves the test's point intact
    done = _xnnfold("lower", "bench_factories:where_mask", "--stock", "--check", "-o",
                    str(tmp_path / "w.pte"), cwd=TESTS)
    err = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(err) == 1, done.stderr[-3000:]
    assert err[0].startswith(f"xnnfold: error: {tmp_path / 'w.pte'}: check failed: the .pte "
                             "does not run on the ExecuTorch runtime: RuntimeError: Failed to "
                             "execute method forward, error: 0x12 ("), err
    assert "in operator aten::slice_copy.Tensor_out" in err[0], err      # the runtime's words


def test_check_fails_in_one_line_when_the_pte_aborts_the_runtime(tmp_path):
    # executorch 1.5.1's portable quantize_per_channel asserts on a float scale: stock's .pte
    # of a statically quantized LoRA linear aborts the process that runs it
    done = _xnnfold("lower", "lora-linear", "--quantize", "static", "--stock", "--check",
                    "-o", str(tmp_path / "l.pte"), cwd=tmp_path)
    err = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(err) == 1, done.stderr[-3000:]
    assert "does not run on the ExecuTorch runtime: its process was killed by SIGABRT (In " \
           "function quantize_per_channel_out(), assert failed" in err[0], err


def test_report_shows_a_pte_that_does_not_run_and_exits_1(tmp_path):
    done = _xnnfold("report", "bench_factories:where_mask", "--variants", "stock",
                    "--reps", "1", "--out", str(tmp_path / "out"), cwd=TESTS)
    assert done.returncode == 1, done.stderr[-3000:]
    row = next(line for line in done.stdout.splitlines()
               if line.startswith("bench_factories:where_mask "))
    assert row.split()[1:] == ["stock", "failed", "[1]"], row
    assert "\n[1] the .pte does not run on the ExecuTorch runtime: RuntimeError: Failed to " \
           "execute method forward, error: 0x12" in done.stdout, done.stdout
    assert done.stderr.strip().splitlines()[-1].startswith(
        "xnnfold: error: every variant of bench_factories:where_mask failed (first: the .pte "
        "does not run"), done.stderr[-2000:]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["report.json",
                                                                    "report.md"]
