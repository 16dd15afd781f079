"""``xnnfold bench llm-runner --folder``'s opt-in ``--llm-kernels`` .pte and its per-part
profile, without lowering or running: the parts of a fabricated ETDump (each call counted, the
warm-up and the events inside a delegate left out), the profile's rows and table, the
``xnnfold-llm`` export's command and file, and its columns only where it was measured."""

import json
from pathlib import Path
from types import SimpleNamespace as NS

import pytest

from xnnfold.bench import runner_exports, runner_real_profile, runner_real_table
from xnnfold.bench.scripts import llm_runner
from xnnfold.pte import devtools


def _event(name, raw, inside=False):
    return NS(name=name, perf_data=NS(raw=raw), is_delegated_op=inside)


def test_parts_count_each_call_and_leave_out_the_warm_up():
    execute = NS(name="Execute", events=[
        _event("DELEGATE_CALL", [9.0, 1.0, 3.0, 2.0]),                # median of 1, 3, 2
        _event("OPERATOR_CALL", [5.0, 5.0]),                          # the same time again
        _event("native_call_slice_copy.Tensor_out", [9.0, 0.5, 0.5]),
        _event("DELEGATE_CALL", [9.0, 4.0, 4.0]),
        _event("llama::custom_sdpa.out", [9.0, 0.25, 0.25]),
        _event("native_call_slice_copy.Tensor_out", [9.0, 0.5, 0.5]),
        _event("XNNPACK_linear", [7.0, 7.0], inside=True),           # within a DELEGATE_CALL
        _event("Method::execute", [20.0, 20.0]),
        NS(name="DELEGATE_CALL", perf_data=None, is_delegated_op=False)])
    load = NS(name="Program::load_method", events=[_event("DELEGATE_CALL", [8.0, 8.0])])
    parts = devtools.parts([load, execute])
    assert parts == {devtools.DELEGATE: (6.0, 2), "slice_copy.Tensor_out": (1.0, 2),
                     "llama::custom_sdpa.out": (0.25, 1)}
    assert list(parts) == [devtools.DELEGATE, "slice_copy.Tensor_out", "llama::custom_sdpa.out"]


def _export(tool, path):
    return runner_exports.Export(tool, "8da4w", path)


def test_profile_steps_each_pte_at_the_middle_of_the_decode(tmp_path, monkeypatch):
    import xnnfold.export.llm.runtime as runtime

    seen = []

    def operator_profile(pte, inputs, runs):
        seen.append((pte, [t.tolist() for t in inputs], runs))
        return {devtools.DELEGATE: (5.0, 123), "slice_copy.Tensor_out": (0.5, 60)}

    monkeypatch.setattr(devtools, "operator_profile", operator_profile)
    monkeypatch.setattr(runtime, "set_threads", lambda threads: seen.append(threads))
    (tmp_path / "a.pte").write_bytes(b"xnnfold's")
    (tmp_path / "b.pte").write_bytes(b"optimum's")
    made = {"xnnfold": _export("xnnfold", tmp_path / "a.pte"),
            "xnnfold-llm": _export("xnnfold-llm", None),                 # its export failed
            "optimum": _export("optimum", tmp_path / "b.pte"),
            "llama.cpp": _export("llama.cpp", tmp_path / "q4_0.gguf")}  # no .pte
    args = NS(prompt=128, new=64, keep=str(tmp_path))
    rows = runner_real_profile.profile("m", "8da4w", 2, made, args)
    assert seen == [2, (b"xnnfold's", [[[7]], [160]], runner_real_profile.RUNS),
                    (b"optimum's", [[[7]], [160]], runner_real_profile.RUNS)]
    assert [r["tool"] for r in rows] == ["xnnfold", "optimum"]
    kept = [json.loads(line) for line in (tmp_path / "profile.jsonl").read_text().splitlines()]
    assert kept == rows and kept[0]["parts"]["slice_copy.Tensor_out"] == [0.5, 60]


def _profile_row(tool, threads, parts):
    return {"model": "m", "precision": "8da4w", "tool": tool, "threads": threads,
            "position": 160, "runs": 20, "parts": parts}


def test_the_profile_table():
    rows = [_profile_row("optimum", 1, {devtools.DELEGATE: [4.36, 154],
                                        "llama::custom_sdpa.out": [6.0, 30]}),
            _profile_row("xnnfold", 2, {devtools.DELEGATE: [4.43, 123],
                                        "slice_copy.Tensor_out": [0.6, 60]}),
            _profile_row("xnnfold", 1, {devtools.DELEGATE: [5.5, 123],
                                        "slice_copy.Tensor_out": [0.55, 60],
                                        "index_put_.out": [0.08, 30]})]
    lines = runner_real_profile.table(rows).splitlines()
    assert lines[0].startswith("m, 8da4w (llama.cpp q4_0): one decode step at position 160")
    assert lines[2] == "| part | xnnfold, 1 thread | xnnfold, 2 threads | optimum, 1 thread |"
    assert lines[4] == "| XNNPACK delegate calls | 5.500 (123) | 4.430 (123) | 4.360 (154) |"
    # the delegate calls first, the others by their largest time
    assert lines[5] == "| `llama::custom_sdpa.out` | — | — | 6.000 (30) |"
    assert lines[6] == "| `slice_copy.Tensor_out` | 0.550 (60) | 0.600 (60) | — |"
    assert lines[7] == "| `index_put_.out` | 0.080 (30) | — | — |"
    assert lines[8] == "| sum of the parts | 6.130 | 5.030 | 10.360 |"


def _speed_row(tools):
    row = {"model": "m", "precision": "8da4w", "threads": 2, "copy_GBps": 33.6,
           "load": ["0.5", "0.7"], "floor_ms": 2.0}
    for tool, (prefill, decode) in tools.items():
        row[tool] = {"prefill_ms": prefill, "decode_ms": decode, "prompt_tokens": [128],
                     "bytes": 1}
    return row


ARGS = NS(prompt=128, new=64)


def test_a_run_without_llm_kernels_keeps_its_table():
    table = runner_real_table.speed_table(
        [_speed_row({"xnnfold": (70, 4.6), "optimum": (160, 4.0), "llama.cpp": (126, 5.0)})],
        ARGS).splitlines()
    assert "medians; xnnfold / optimum / llama.cpp; ratios" in table[0]
    assert table[2] == ("| model | precision | threads | prefill | decode | xnnfold / optimum, "
                        "prefill / decode | xnnfold / llama.cpp, prefill / decode | floor "
                        "(copy GB/s) | decode / floor | load |")
    assert table[4] == ("| m | 8da4w (llama.cpp q4_0) | 2 | 70 / 160 / 126 | 4.60 / 4.00 / "
                        "5.00 | 0.44 / 1.15 | 0.56 / 0.92 | 2.00 ms (33.6) | 2.30 / 2.00 / "
                        "2.50 | 0.5 -> 0.7 |")


def test_the_llm_kernels_column_and_its_ratio_to_optimum():
    rows = [_speed_row({"xnnfold": (70, 4.6), "xnnfold-llm": (72, 3.6), "optimum": (160, 4.0),
                        "llama.cpp": (126, 5.0)}),
            _speed_row({"xnnfold": (70, 4.6), "optimum": (160, 4.0)})]
    table = runner_real_table.speed_table(rows, ARGS).splitlines()
    assert "xnnfold / xnnfold --llm-kernels / optimum / llama.cpp" in table[0]
    assert ("| xnnfold / optimum, prefill / decode | xnnfold --llm-kernels / optimum, prefill "
            "/ decode | xnnfold / llama.cpp, prefill / decode |") in table[2]
    assert table[3].count("|") == table[2].count("|")
    assert table[4].startswith("| m | 8da4w (llama.cpp q4_0) | 2 | 70 / 72 / 160 / 126 | "
                               "4.60 / 3.60 / 4.00 / 5.00 | 0.44 / 1.15 | 0.45 / 0.90 | "
                               "0.56 / 0.92 | 2.00 ms (33.6) | 2.30 / 1.80 / 2.00 / 2.50 |")
    assert "| 70 / — / 160 / — | 4.60 / — / 4.00 / — | 0.44 / 1.15 | — / — | — / — |" \
        in table[5]


def test_the_export_table_has_the_llm_kernels_pte_where_made(tmp_path):
    (tmp_path / "a.pte").write_bytes(b"12345")
    made = {("m", "fp32"): {"xnnfold": _export("xnnfold", tmp_path / "a.pte")}}
    assert "--llm-kernels" not in runner_real_table.export_table(made)
    made[("m", "fp32")]["xnnfold-llm"] = _export("xnnfold-llm", tmp_path / "a.pte")
    lines = runner_real_table.export_table(made).splitlines()
    assert lines[0] == ("| model | precision | xnnfold .pte bytes | xnnfold --llm-kernels .pte "
                        "bytes | optimum .pte bytes | GGUF bytes | xnnfold export: wall, peak "
                        "RSS | xnnfold --llm-kernels export | optimum export | llama.cpp "
                        "convert / quantize |")
    assert lines[2].startswith("| m | fp32 | 5 | 5 | — | — |")
    assert lines[1].count("|") == lines[0].count("|") == lines[2].count("|")


def test_the_llm_kernels_export_is_a_file_of_its_own(tmp_path, monkeypatch):
    commands = []

    def run_timed(command, log):
        commands.append([str(c) for c in command])
        Path(command[command.index("-o") + 1]).write_bytes(b"pte")
        return 0

    monkeypatch.setattr(runner_exports.timed_command, "run_timed", run_timed)
    args = NS(kernel_list=["default", "llm"], optimum_cli=None, cache=1024, llama_cpp=None)
    made = runner_exports.exports(tmp_path / "folder", tmp_path, "8da4w", args)
    assert {t: e.path.name for t, e in made.items()} == {
        "xnnfold": "xnnfold-8da4w.pte", "xnnfold-llm": "xnnfold-llm-8da4w.pte"}
    assert "--llm-kernels" not in commands[0] and commands[0][-2:] == ["--quantize", "8da4w"]
    assert "--llm-kernels" in commands[1] and commands[1][-2:] == ["--quantize", "8da4w"]
    args.kernel_list = ["llm"]
    assert list(runner_exports.exports(tmp_path / "folder", tmp_path, "8da4w", args)) == \
        ["xnnfold-llm"] and len(commands) == 2                     # kept: only measured again


def test_the_kernels_option(tmp_path, capsys):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "tokenizer.json").write_text("{}")
    base = ["--folder", str(tmp_path), "--keep", str(tmp_path)]
    assert llm_runner.parse_args(base).kernel_list == ["default"]
    args = llm_runner.parse_args(base + ["--xnnfold-kernels", "default,llm", "--profile"])
    assert args.kernel_list == ["default", "llm"] and args.profile
    with pytest.raises(SystemExit) as exit_:
        llm_runner.parse_args(base + ["--xnnfold-kernels", "default,custom"])
    assert exit_.value.code == 2
    assert "--xnnfold-kernels default,custom: comma-separated, of default and llm" in \
        capsys.readouterr().err
