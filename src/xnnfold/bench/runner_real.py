"""Generation at a real model's dims (``xnnfold bench llm-runner --folder``): xnnfold's .pte
(and with ``--xnnfold-kernels ...,llm`` its ``--llm-kernels`` one) and optimum-executorch's of
the same folder in executorch's ``TextLLMRunner``, and llama.cpp's ``llama-bench`` on its GGUF
of it, per precision and thread count, in interleaved rounds (medians), beside the memory
floor of a decode step. The exports: :mod:`runner_exports`; with ``--profile``, each .pte's
decode step by part: :mod:`runner_real_profile`.

The prompt is ``--prompt`` tokens of the folder's tokenizer; each round generates ``--new``
tokens. llama-bench runs ``-p PROMPT -n NEW -d 0,PROMPT -t T -r 1``: its prefill is the
``pp`` test at depth 0, its decode the ``tg`` test at depth ``PROMPT`` (after as many cache rows
as the runner's decode; the two other tests of the grid are not read).
"""

from __future__ import annotations

import json
import random
import statistics
import subprocess
import time
from pathlib import Path

from ..models.decoder_lm import WEIGHT_BYTES
from .runner_exports import exports
from .runner_real_table import TOOLS


def decode_bytes(config: dict, precision: str, rows: int) -> int:
    """Bytes one decode step reads at ``rows`` cache rows: every linear's weight as xnnfold
    stores it for ``precision`` (the head included, a tied one read once), the norms, the
    biases, one fp32 embedding row, and the fp32 K and V rows of every layer."""
    d, layers = config["hidden_size"], config["num_hidden_layers"]
    head_dim = config.get("head_dim") or d // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim
    linears = layers * (2 * d * q + 2 * d * kv + 3 * d * config["intermediate_size"])
    linears += config["vocab_size"] * d
    biases = layers * (q + 2 * kv) if config.get("model_type") == "qwen2" else 0
    vectors = layers * 2 * d + d + biases + (0 if config.get("tie_word_embeddings") else d)
    quant = "none" if precision == "fp32" else precision
    return int(WEIGHT_BYTES[quant] * linears) + 4 * vectors + 4 * layers * 2 * kv * rows


def prompt_for(tokenizer_path: Path, tokens: int) -> str:
    """A text the folder's tokenizer encodes as exactly ``tokens`` tokens."""
    from tokenizers import Tokenizer

    tokenizer, rng, text = Tokenizer.from_file(str(tokenizer_path)), random.Random(0), ""
    while len(tokenizer.encode(text, add_special_tokens=False).ids) < tokens:
        text += rng.choice("abcdefghijklmnopqrstuvwxyz ")
    return text


class Runner:
    """A .pte in executorch's ``TextLLMRunner``: (prefill ms, decode ms per token, tokens in the
    prompt) from its Stats."""

    def __init__(self, pte: Path, tokenizer: Path):
        from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401  (llama::)
        from executorch.extension.llm.runner import TextLLMRunner

        self.runner = TextLLMRunner(str(pte), str(tokenizer))

    def run(self, text: str, new: int, threads: int) -> tuple:
        from executorch.extension.llm.runner import GenerationConfig

        stats = []
        self.runner.reset()
        self.runner.generate(text, GenerationConfig(echo=False, max_new_tokens=new,
                                                    temperature=0.0, warming=True),
                             lambda piece: None, stats.append)
        s = stats[0]
        decode = (s.inference_end_ms - s.prompt_eval_end_ms) / max(1, s.num_generated_tokens)
        return s.prompt_eval_end_ms - s.inference_start_ms, decode, s.num_prompt_tokens


class LlamaBench:
    """llama.cpp's ``llama-bench`` on a GGUF, one repetition per call."""

    def __init__(self, binaries: Path, gguf: Path, prompt: int):
        self.command = [str(binaries / "llama-bench"), "-m", str(gguf), "-p", str(prompt),
                        "-r", "1", "-d", f"0,{prompt}", "-o", "json"]
        self.prompt = prompt

    def run(self, text: str, new: int, threads: int) -> tuple:
        done = subprocess.run(self.command + ["-n", str(new), "-t", str(threads)],
                              capture_output=True, text=True, check=True)
        tests = json.loads(done.stdout)
        self.build = {k: tests[0].get(k) for k in ("build_commit", "build_number", "cpu_info",
                                                   "backends", "type_k")}
        pick = {(t["n_prompt"], t["n_gen"], t["n_depth"]): t["avg_ns"] / 1e6 for t in tests}
        return pick[(self.prompt, 0, 0)], pick[(0, new, self.prompt)] / new, self.prompt


def _load() -> str:
    import os

    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def measure(folder: Path, keep: Path, precision: str, threads: int, made: dict,
            args) -> dict:
    """One row: every tool's prefill and decode medians over ``--rounds`` interleaved rounds
    (one untimed first), the copy bandwidth and the load."""
    from ..export.llm.runtime import set_threads
    from .decode import copy_bandwidth

    set_threads(threads)                    # before the programs are loaded, never during
    bandwidth = copy_bandwidth()
    text, tokenizer = prompt_for(folder / "tokenizer.json", args.prompt), folder / \
        "tokenizer.json"
    tools = {}
    for tool, export in made.items():
        if export.path is None:
            continue
        tools[tool] = (LlamaBench(Path(args.llama_cpp), export.path, args.prompt)
                       if tool == "llama.cpp" else Runner(export.path, tokenizer))
    times = {tool: ([], [], set()) for tool in tools}
    order, rng, loads = list(tools), random.Random(threads), [_load()]
    for index in range(args.rounds + 1):
        rng.shuffle(order)
        for tool in order:
            prefill, decode, count = tools[tool].run(text, args.new, threads)
            if index:
                times[tool][0].append(prefill)
                times[tool][1].append(decode)
                times[tool][2].add(count)
        loads.append(_load())
    config = json.loads((folder / "config.json").read_text())
    row = {"model": folder.name, "precision": precision, "threads": threads,
           "rounds": args.rounds, "copy_GBps": bandwidth / 1e9, "load": loads,
           "floor_ms": decode_bytes(config, precision, args.prompt + args.new // 2) /
           bandwidth * 1e3, "time": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    if "llama.cpp" in tools:
        row["llama.cpp build"] = tools["llama.cpp"].build
    for tool, (prefills, decodes, counts) in times.items():
        row[tool] = {"prefill_ms": statistics.median(prefills),
                     "decode_ms": statistics.median(decodes), "prompt_tokens": sorted(counts),
                     "bytes": made[tool].bytes}
    with open(keep.parent / "results.jsonl", "a") as results:
        results.write(json.dumps(row) + "\n")
    print(f"{folder.name} {precision} {threads} thread(s): " + "; ".join(
        f"{tool} {r['prefill_ms']:.0f} / {r['decode_ms']:.2f} ms" for tool, r in row.items()
        if tool in TOOLS) + f"; floor {row['floor_ms']:.2f} ms; load {loads[0]} -> "
        f"{loads[-1]}", flush=True)
    return row


def run(args) -> None:
    from . import runner_real_profile
    from .decode import machine_line

    keep_root = Path(args.keep)
    rows, made_all, profiles = [], {}, []
    print(f"machine: {machine_line()}", flush=True)
    for folder in map(Path, args.folder):
        for precision in args.precision_list:
            keep = keep_root / folder.name
            made = made_all[(folder.name, precision)] = exports(folder, keep, precision, args)
            if args.export_only:
                continue
            for threads in args.thread_list:
                rows.append(measure(folder, keep, precision, threads, made, args))
                if args.profile:
                    profiles += runner_real_profile.profile(folder.name, precision, threads,
                                                            made, args)
    from .runner_real_table import export_table, speed_table

    if profiles:
        (keep_root / "profile.md").write_text(runner_real_profile.table(profiles) + "\n")
    text = ""
    if rows:
        text += speed_table(rows, args) + "\n\n"
    text += export_table(made_all)
    print("\n" + text)
    (keep_root / "table.md").write_text(text + "\n")
