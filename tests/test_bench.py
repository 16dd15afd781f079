"""The bench side: quiet output, the report's order, rounds and per-process lowering, the model
factory of ``xnnfold lower``, ``explain --all``, the ETDump breakdown, the zoo and the tied head.

Lowering-heavy checks are one per feature, at tiny shapes."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from xnnfold import cli, models

from xnnfold.pte import devtools

from xnnfold.bench import report
from xnnfold.pte import STOCK, STOCK_FLAG, XNNFOLD, lower
from xnnfold.pte.timing import time_interleaved

SRC = str(Path(__file__).resolve().parents[1] / "src")
TESTS = str(Path(__file__).resolve().parent)
NOISE_MARKERS = ("Failed to load", "cpuinfo_utils", "W1203", "_pytree")


def _run(*args, timeout=600, text=True):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, TESTS])}
    return subprocess.run([sys.executable, *args], capture_output=True, text=text, env=env,
                          timeout=timeout, cwd=TESTS)


def test_stderr_filter_drops_noise_only():
    # C++-style lines written to fd 2 in pieces, and through sys.stderr (as the runtime's
    # pybindings do), are dropped; a progress bar's partial updates and other lines pass.
    code = r"""
import os, sys
from xnnfold.pte.quiet import StderrFilter
f = StderrFilter()
for piece in (b'[', b'cpuinfo_utils.cpp', b':', b'71', b'] ', b'Reading file\n'):
    os.write(2, piece)
sys.stderr.write('[XNNCompiler.cpp:1043] Failed to create node\n'); sys.stderr.flush()
sys.stderr.write('W1203 19:43:23.518000 2898 torch/utils/_pytree.py:630] deprecated\n')
sys.stderr.flush()
os.write(2, b'\rbar 1'); os.write(2, b'\rbar 2\n')
# read glued to a progress bar's update (no line end): the runtime's line and a mark
os.write(2, b'\rbar 3[cpuinfo_utils.cpp:100] Reading file\n')
os.write(2, b'\rbar 4\x00xnnfold-mark 99\n')
f.mark()
print('xnnfold: error: kept', file=sys.stderr)
f.close()
print('after close', file=sys.stderr)
"""
    done = _run("-c", code, text=False)       # bytes: text mode would turn \r into \n
    assert done.returncode == 0, done.stderr
    assert done.stderr == b"\rbar 1\rbar 2\n\rbar 3\rbar 4xnnfold: error: kept\nafter close\n", \
        done.stderr


def test_time_interleaved_shuffles_every_round():
    calls = []

    class Fake:
        def __init__(self, name):
            self.name = name

        def run(self, inputs):
            calls.append(self.name)

    runners = {name: Fake(name) for name in "abcd"}
    times = time_interleaved(runners, (), rounds=12, seed=3, warmup=0)
    assert {name: len(ms) for name, ms in times.items()} == dict.fromkeys("abcd", 12)
    rounds = [tuple(calls[i:i + 4]) for i in range(0, 48, 4)]
    assert all(sorted(r) == list("abcd") for r in rounds)
    assert len(set(rounds)) > 3, rounds                    # not one fixed (cyclic) order
    assert len({r[0] for r in rounds}) > 1                 # not always the same variant first
    calls.clear()
    time_interleaved(runners, (), rounds=12, seed=3, warmup=0)
    assert [tuple(calls[i:i + 4]) for i in range(0, 48, 4)] == rounds   # seeded


def test_report_cli_is_quiet_and_measures_each_variant_in_its_own_process(tmp_path):
    done = _run("-m", "xnnfold", "report", "--models", "lora-linear", "--variants",
                "stock,xnnfold,ideal", "--reps", "3", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    noise = [line for line in done.stderr.splitlines() if any(m in line for m in NOISE_MARKERS)]
    assert noise == [], noise
    assert "3 rounds after 3 warm-up runs" in done.stdout and "shuffled" in done.stdout
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved["schema"] == report.SCHEMA_VERSION and saved["seed"] == 0
    by = {r["variant"]: r for r in saved["rows"]}
    assert set(by) == {STOCK, XNNFOLD, "ideal"}
    for row in by.values():
        assert row["error"] is None and row["rounds"] == 3
        assert row["min_ms"] <= row["median_ms"] <= row["max_ms"]
        assert row["peak_rss_mib"] >= row["base_rss_mib"] > 100    # torch alone is more
        assert row["lower_seconds"] > 0
    # get_delegation_info: stock leaves LoRA's merge and its linear outside, xnnfold only
    # the getitem-free output; the GEMM count agrees with it
    assert by[STOCK]["gemms_outside"] == 1 and by[XNNFOLD]["gemms_outside"] == 0
    assert by[STOCK]["ops_outside"] > by[XNNFOLD]["ops_outside"]
    assert any("mm" in op for op in by[STOCK]["ops_outside_by_type"])
    assert not any("mm" in op for op in by[XNNFOLD]["ops_outside_by_type"])
    # the ETDump breakdown: stock spends time in a portable mm, xnnfold only in the delegate
    assert any("mm" in op for op in by[STOCK]["op_ms"]), by[STOCK]["op_ms"]
    assert set(by[XNNFOLD]["op_ms"]) == {devtools.DELEGATE}, by[XNNFOLD]["op_ms"]
    assert (tmp_path / "operators.png").stat().st_size > 0
    text = (tmp_path / "report.md").read_text()
    line = next(l for l in text.split("## Lowering cost")[1].splitlines()
                if l.startswith("| lora-linear"))
    assert (f"{by[STOCK]['lower_seconds']:.1f} / {by[XNNFOLD]['lower_seconds']:.1f} / "
            f"{by['ideal']['lower_seconds']:.1f}") in line, line
    line = next(l for l in text.split("## xnnfold beside the ideal")[1].splitlines()
                if l.startswith("| lora-linear"))
    assert f"{by[XNNFOLD]['pte_bytes']:,} / {by['ideal']['pte_bytes']:,}" in line, line


@pytest.mark.slow     # a report in a child process each way (~18 s): make test-all; margin under 15 minutes
def test_quiet_unless_verbose(tmp_path):
    # Importing executorch logs torchao's "Failed to load" lines and torch's W1203 warning:
    # shown with --verbose, filtered without (the runtime's C++ lines: the report test above).
    args = ["lower", "bench_factories:mean_head", "-o", str(tmp_path / "m.pte")]
    verbose, quiet = _run("-m", "xnnfold", "--verbose", *args), _run("-m", "xnnfold", *args)
    assert verbose.returncode == quiet.returncode == 0, quiet.stderr[-1000:]
    assert "Failed to load" in verbose.stderr or "W1203" in verbose.stderr, verbose.stderr
    assert quiet.stderr == "", quiet.stderr
    assert quiet.stdout.splitlines()[-1].startswith("GEMMs outside delegates: 0")


def test_lower_from_a_factory_and_explain_all(tmp_path, capsys, monkeypatch):
    """Neither command needs the bench extra (tqdm, matplotlib; tabulate comes with
    executorch)."""
    for extra in ("tqdm", "matplotlib"):
        monkeypatch.setitem(sys.modules, extra, None)       # import raises ImportError
    out = tmp_path / "head.pte"
    assert cli.main(["lower", "bench_factories:mean_head", "-o", str(out)]) == 0
    assert "GEMMs outside delegates: 0" in capsys.readouterr().out and out.stat().st_size > 0
    assert cli.main(["explain", "--all", "bench_factories:mean_head"]) == 0
    printed = capsys.readouterr().out
    rows = devtools.why_not_delegated(torch.export.export(*_made("mean_head")))
    reasons = {r.op: r.reason for r in rows}
    # XNNPACK's own words, from its configs' WhyNoPartition records
    assert reasons["aten.mean.dim"] == ("mean.dim only supports averaging 4D tensors, got "
                                        "tensor of rank 2"), reasons
    assert reasons["aten.pow.Tensor_Scalar"] == "only support power == 2, got 4", reasons
    assert reasons["aten.sum.dim_IntList"].startswith("nothing logged: XNNPACK has no "
                                                      "partitioner config"), reasons
    assert "averaging 4D tensors" in printed and "power == 2, got 4" in printed


def _made(name):
    import bench_factories
    return getattr(bench_factories, name)()


@pytest.mark.parametrize("spec, message", [
    ("no_such_module_xyz:make", "no module no_such_module_xyz in "),
    ("bench_factories:missing", "has no function missing"),
    ("bench_factories:NOT_CALLABLE", "has no function NOT_CALLABLE"),
    ("bench_factories:not_a_pair", "must return (torch.nn.Module, tuple"),
    ("bench_factories:raises", "the factory raised ValueError: no model today"),
    ("bench_factories:not_exportable", "torch.export failed"),
])
def test_bad_factory_is_one_line_and_exit_2(spec, message, tmp_path, capsys):
    assert cli.main(["lower", spec, "-o", str(tmp_path / "x.pte")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"xnnfold: error: {spec}:"), err
    assert message in err[0], err


def test_tied_head_is_the_table_transposed_and_the_flag_takes_it():
    case = models.tied_head_case(vocab=64, embed=16, heads=2, layers=1, tokens=3, memory=5)
    model = case.model
    with torch.no_grad():
        hidden = model.decoder(model.embedding(case.inputs[0]), case.inputs[1])
        assert torch.equal(model(*case.inputs), hidden @ model.embedding.weight.t())
    ep = torch.export.export(model, case.inputs)
    stock, flag = lower(ep, STOCK), lower(ep, STOCK_FLAG)
    assert "aten.mm.default" in stock.gemms_outside        # the head stays on portable
    assert flag.gemms_outside == [], flag.gemms_outside


def test_zoo_speech_model_weight_norm_conv_is_folded():
    from xnnfold.models import zoo
    case = zoo.wav2vec2_toy()   # transformers is a test requirement: no skip
    conv = case.model.model.encoder.pos_conv_embed.conv
    assert any("parametrizations" in n or "weight_g" in n for n, _ in conv.named_parameters())
    ep = torch.export.export(case.model, case.inputs)
    stock, folded = lower(ep, STOCK), lower(ep, XNNFOLD)
    assert stock.gemms_outside == ["aten.convolution.default"]
    assert folded.gemms_outside == []


def test_zoo_eager_export_twin_has_the_weights_and_plain_attention():
    """The variant eager-export: the same weights, exported with transformers' eager attention
    (matmul, softmax, matmul) where the model has SDPA; no lowering."""
    from xnnfold.models import zoo
    case = zoo.whisper_toy()
    twin = case.eager_export()

    def sdpa_calls(module):
        graph = torch.export.export(module, case.inputs).graph
        return sum("scaled_dot_product_attention" in str(n.target) for n in graph.nodes)

    assert (sdpa_calls(case.model), sdpa_calls(twin)) == (6, 0)    # 2 enc + 2x2 dec layers
    with torch.no_grad():
        torch.testing.assert_close(twin(*case.inputs), case.model(*case.inputs),
                                   rtol=1e-4, atol=1e-5)


def test_unknown_zoo_model_and_variant(tmp_path, capsys):
    assert cli.main(["report", "--models", "vit-huge", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "unknown model 'vit-huge'" in err and "wav2vec2-toy" in err
    assert cli.main(["report", "--variants", "stock,fast", "--out", str(tmp_path)]) == 2
    assert "unknown variant 'fast'" in capsys.readouterr().err


def test_a_zoo_model_whose_package_does_not_import_is_skipped_in_one_line(tmp_path):
    code = ("import sys; sys.modules['transformers'] = None\n"
            "from xnnfold import cli\n"
            f"sys.exit(cli.main(['report', '--models', 'vit-toy', '--out', {str(tmp_path)!r}]))")
    done = _run("-c", code)
    assert done.returncode == 0, done.stderr[-2000:]
    skipped = [line for line in done.stdout.splitlines() if line.startswith("skipped")]
    assert skipped == ["skipped vit-toy: transformers does not import (ModuleNotFoundError: "
                       "import of transformers halted; None in sys.modules); "
                       "pip install -e '.[zoo]'"], done.stdout
    assert json.loads((tmp_path / "report.json").read_text())["skipped"].keys() == {"vit-toy"}


# --------------------------------------------------------------------------------------------
# Ctrl-C during the report: exit 130 at once, nothing left running

def _terminal_sigint() -> None:
    """The child starts with SIGINT as a terminal's shell gives it (default), whatever the
    test process has: a pytest worker may have it ignored at the OS level, which a child
    inherits (Python then installs no KeyboardInterrupt handler and Ctrl-C does nothing)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _session(leader: int) -> dict:
    """{pid: parent pid} of the processes in ``leader``'s session."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == leader:                     # state ppid pgrp session
            found[int(entry)] = int(fields[1])
    return found


# Quarantined to make test-all (the slow set): in every full `make test` of a clean clone on
# 2026-12-05 evening the child ignored the SIGINT (it ran to its end, or on past 30 s), while
# the test passes alone and with its own file under -n 2, on an idle machine; the cause (some
# other test's effect on the worker that starts the child) is not found yet.
@pytest.mark.slow
@pytest.mark.parametrize("to", ["group", "parent"])
def test_ctrl_c_stops_the_report_at_once(tmp_path, to):
    """The terminal's Ctrl-C (SIGINT to the process group: the report, its forkserver, the
    lowering process) or a SIGINT to the report alone, while a variant lowers: exit 130 with
    one line, no KeyboardInterrupt of a child, no process left."""
    import signal
    import threading
    import time

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, TESTS])}
    process = subprocess.Popen(
        [sys.executable, "-m", "xnnfold", "report", "--models", "lora-linear", "--variants",
         "stock,xnnfold", "--reps", "2", "--out", str(tmp_path)], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env=env, cwd=TESTS, start_new_session=True,
        preexec_fn=_terminal_sigint)
    err = []
    reader = threading.Thread(target=lambda: err.append(process.stderr.read()), daemon=True)
    reader.start()
    deadline = time.monotonic() + 300
    # a lowering process at work: a grandchild of the report (forked by its forkserver)
    while not any(parent != process.pid and parent in _session(process.pid)
                  for parent in _session(process.pid).values()):
        assert process.poll() is None and time.monotonic() < deadline, "no lowering started"
        time.sleep(0.2)
    time.sleep(1.0)
    start = time.monotonic()
    if to == "group":
        os.killpg(process.pid, signal.SIGINT)
    else:
        process.send_signal(signal.SIGINT)
    code = process.wait(timeout=60)
    seconds = time.monotonic() - start
    reader.join(10)
    stderr = err[0] if err else ""
    assert code == 130, (code, stderr[-3000:])
    assert stderr.rstrip().endswith("xnnfold: interrupted"), stderr[-2000:]
    assert "KeyboardInterrupt" not in stderr and "Traceback" not in stderr, stderr[-3000:]
    print(f"SIGINT to the {to}: exit 130 after {seconds:.2f} s")
    assert seconds < 10, seconds            # measured well under 2 s; a hang is the failure
    while _session(process.pid) and time.monotonic() < start + 15:
        time.sleep(0.2)
    assert _session(process.pid) == {}, _session(process.pid)


@pytest.mark.slow     # two quantized reports (~28 s): make test-all; margin under 15 minutes
def test_report_quantized_on_a_factory_and_a_built_in_model(tmp_path):
    """--quantize dynamic in the report: each model PT2E-quantized in every lowering process,
    its .pte run there and here and compared with the converted module (int8 tolerance)."""
    done = _run("-m", "xnnfold", "report", "bench_factories:mean_head", "lora-linear",
                "--quantize", "dynamic", "--variants", "stock,xnnfold", "--reps", "2",
                "--no-profile", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads((tmp_path / "report.json").read_text())["rows"]
    assert {(r["model"], r["variant"]) for r in rows} == {
        (model, variant) for model in ("bench_factories:mean_head int8-dynamic",
                                       "lora-linear int8-dynamic")
        for variant in (STOCK, XNNFOLD)}
    for row in rows:
        assert row["error"] is None and row["outputs_ok"] and row["rounds"] == 2, row
        assert row["gemms_outside"] == 0, row
    assert (tmp_path / "latency.png").stat().st_size > 0


def test_llm_decode_knows_the_architectures_decoder_lm_builds():
    """The script names them without importing torch (its --help answers first): the same list."""
    from xnnfold.bench.scripts import llm_decode
    from xnnfold.models import decoder_lm

    assert llm_decode.ARCHITECTURES == decoder_lm.ARCHITECTURES
    args = llm_decode.parse_args(["--arch", "gemma2", "--dynamic", "128", "--positions", "512"])
    assert (args.arch, args.dynamic) == ("gemma2", 128)
    with pytest.raises(SystemExit):
        llm_decode.parse_args(["--dynamic", "1024"])      # a step no longer than the cache less one
