"""The LLM benches' tables, without lowering: the families table (``xnnfold bench
llm-families``) from fabricated rows, each column read from its row, failures in place of the
numbers, the family list importable without torch; the weights a mixture-of-experts decode step
reads (``xnnfold bench moe-decode``), by count, on a tiny Mixtral: routed = the active
parameters, every expert on every token = all of them, transformers' batched_mm = its gathered
experts read three times. The families command itself, fast mode, on one family: a slow test."""

import subprocess
import sys

import pytest

from xnnfold.bench import families as bench
from xnnfold.bench import moe
from xnnfold.models import families
from xnnfold.models.families import FAST


def test_a_measured_row():
    row = {"family": "gemma", "class": "GemmaForCausalLM", "exports": "yes", "lowers": "yes",
           "step": "kv_cache", "portable": 1.234,
           "checks": {"xnnfold": {"matched": 300, "of": 300, "relative": 7e-7, "ok": True,
                                  "margin": None},
                      "stock": {"matched": 12, "of": 300, "relative": 2.2e-4, "ok": False,
                                "margin": 0.5}},
           "decode_ms": {"xnnfold": 2.0, "stock": 4.0}}
    assert bench.cells(row) == ["gemma", "GemmaForCausalLM", "yes", "yes", "300/300",
                                "7.0e-07 / 2.2e-04 WRONG", "2.00 / 4.00", "0.50x", "1.2",
                                "kv_cache"]


def test_a_row_that_stops_early_and_a_tie():
    failed = {"family": "opt", "class": "OPTForCausalLM", "exports": "no: UserError: guard"}
    assert bench.cells(failed)[:4] == ["opt", "OPTForCausalLM", "no: UserError: guard", ""]
    assert set(bench.cells(failed)[4:]) == {""}
    tie = {"matched": 40, "of": 300, "relative": 1e-6, "ok": True, "margin": 2e-7}
    assert bench._tokens_cell(tie) == "40/300 (eager's top-2 margin there 2.0e-07)"
    table = bench.markdown([failed], "heading")
    assert table.splitlines()[2] == "| " + " | ".join(bench.COLUMNS) + " |"


def test_the_family_list_imports_without_torch():
    code = ("import sys; import xnnfold.models.families as f; "
            "assert 'torch' not in sys.modules, 'torch'; print(len(f.FAMILIES))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout) == len(families.FAMILIES) >= 30
    assert set(families.MIXTURES) <= set(families.FAMILIES)


@pytest.mark.slow
def test_fast_mode_on_one_family(capsys):
    from xnnfold.bench.scripts import llm_families

    llm_families.main(["--fast", "--families", "llama"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| llama")]
    cells = [c.strip() for c in rows[-1].strip("|").split("|")]
    assert cells[2:5] == ["yes", "yes", "12/12"] and cells[-1] == "kv_cache", cells


def test_bytes_per_variant():
    model = moe.build(FAST, intermediate=96)         # 4 experts, top-2, 2 layers, hidden 64
    expert = 3 * 64 * 96 * 4                         # gate, up, down; fp32
    routed = moe.weight_bytes(model, "routed", 2)
    assert routed["experts"] == 2 * expert * 2 and routed["total"] == routed["active"]
    everything = moe.weight_bytes(model, "all-experts", 2)
    assert everything["experts"] == 4 * expert * 2
    assert everything["total"] - routed["total"] == 2 * expert * 2
    gathered = moe.weight_bytes(model, "batched-mm", 2)
    assert gathered["experts"] == pytest.approx(3 * routed["experts"])
    # the rest: attention, norms, router, head and one row of the (untied) embedding table
    table = model.get_input_embeddings().weight
    params = sum(p.numel() * 4 for p in model.parameters())
    assert routed["rest"] == params - 4 * expert * 2 - table.numel() * 4 + table.shape[1] * 4
