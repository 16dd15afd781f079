"""The variants ``xnnfold bench llm-runner`` times (:mod:`xnnfold.bench.runner_timing`): the
model and its tokenizer, the .pte of each variant exported, and each variant's way of generating
(executorch's ``TextLLMRunner`` timed by its Stats, xnnfold's ``Generator``, the two-method
layout as ``xnnfold generate`` ran it)."""


from __future__ import annotations

import itertools
import random
import shutil
import subprocess
import time
from pathlib import Path

import torch

NOTES = {
    "runner": "TextLLMRunner on xnnfold's forward .pte (default kernels), its Stats",
    "runner-llm": "TextLLMRunner on xnnfold's forward .pte with --llm-kernels, its Stats",
    "generate": "xnnfold generate's Generator on the same .pte as runner (perf_counter)",
    "generate-llm": "xnnfold generate's Generator on the same .pte as runner-llm",
    "two-method": "the two-method layout (prefill + static decode, shared arenas) as xnnfold "
                  "generate ran it before (perf_counter)",
    "two-method-llm": "the same with llm_kernels",
    "optimum": "TextLLMRunner on optimum-executorch's --use_custom_sdpa --use_custom_kv_cache "
               ".pte of the same folder, its Stats",
}

ASCII = [chr(288)] + [chr(b) for b in range(33, 127)]     # byte-level characters of 32..126


def write_tokenizer(path: Path, vocab: int) -> None:
    """A byte-level BPE tokenizer.json of exactly ``vocab`` tokens and no merges: each prompt
    character is one token; the other ids are tokens of 2-3 ASCII characters (the runner
    samples among the tokenizer's ids and prints each one's text)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    letters = [chr(b) for b in range(33, 127)]
    fillers = ("".join(c) for n in (2, 3) for c in itertools.product(letters, repeat=n))
    tokens = ASCII + ["<s>", "</s>"]
    tokens += list(itertools.islice(fillers, vocab - len(tokens)))
    tokenizer = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.save(str(path))


def prompt_text(tokens: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(tokens))


def _model(args) -> tuple:
    """(the model, the same quantized as ``--quant`` asks: what xnnfold exports)."""
    from ..export.llm.export import quantized_copy
    from ..models.decoder_lm import Dims, causal_lm

    dims = Dims.for_hidden(args.hidden, args.cache, args.layers, args.vocab)
    model = causal_lm("llama", dims, seed=0)
    model.generation_config.cache_implementation = None
    return model, (model if args.quant == "none" else quantized_copy(model, args.quant))


def _lower(programs: dict, metadata: dict, llm: bool) -> bytes:
    from ..export.llm.export import GenerationPrograms, lower_generation

    # the two-method layout runs on executorch.runtime here, whose methods share arenas
    return lower_generation(GenerationPrograms(dict(programs), dict(metadata)),
                            partitioner_kwargs={"llm_kernels": llm},
                            arenas_shared=len(programs) > 1).pte


def _written(path: Path, make, reuse: bool) -> Path:
    """``path``, written with ``make()`` unless ``reuse`` and it exists (``--keep``)."""
    start = time.perf_counter()
    if reuse and path.is_file():
        print(f"{path.name}: {path.stat().st_size:,} B, reused from {path.parent}", flush=True)
        return path
    path.write_bytes(make())
    print(f"{path.name}: {path.stat().st_size:,} B, lowered in "
          f"{time.perf_counter() - start:.0f} s", flush=True)
    return path


def _two_methods(model, args, metadata: dict, llm: bool) -> bytes:
    """The layout xnnfold wrote before: a dynamic ``prefill`` and a static one-token
    ``decode`` over one cache."""
    from ..export.llm import export_causal_lm
    from ..export.static_cache import with_static_cache

    with torch.no_grad():
        decode = torch.export.export(
            with_static_cache(model, args.cache), (),
            {"input_ids": torch.zeros(1, 1, dtype=torch.long),
             "cache_position": torch.zeros(1, dtype=torch.long)}, strict=True)
    prefill = export_causal_lm(model, args.cache, min(128, args.cache)).programs["forward"]
    return _lower({"prefill": prefill, "decode": decode}, metadata, llm)


def export_variants(args, folder: Path) -> dict:
    """{variant: .pte path} for the variants asked for (the optimum one only with its CLI);
    with ``--keep``, a .pte already in the folder is reused."""
    from ..export.llm import export_causal_lm

    plain, model = _model(args)
    ptes, names, reuse = {}, set(args.variant_list), bool(args.keep)
    generation = export_causal_lm(model, args.cache, min(128, args.cache))
    for suffix, llm in (("", False), ("-llm", True)):
        if {f"runner{suffix}", f"generate{suffix}"} & names:
            path = _written(folder / f"forward{suffix}.pte", lambda: _lower(
                generation.programs, generation.metadata, llm), reuse)
            ptes.update({name: path for name in {f"runner{suffix}", f"generate{suffix}"} &
                         names})
        if f"two-method{suffix}" in names:
            ptes[f"two-method{suffix}"] = _written(
                folder / f"two-method{suffix}.pte",
                lambda: _two_methods(model, args, generation.metadata, llm), reuse)
    if "optimum" in names:
        ptes.update(_optimum(args, plain, folder))      # optimum quantizes it itself
    return ptes


def _optimum(args, model, folder: Path) -> dict:
    if not args.optimum_cli:
        print("optimum: skipped (no --optimum-cli)", flush=True)
        return {}
    if args.keep and (folder / "optimum" / "model.pte").is_file():
        print(f"optimum model.pte: reused from {folder / 'optimum'}", flush=True)
        return {"optimum": folder / "optimum" / "model.pte"}
    saved = folder / "model"
    model.save_pretrained(str(saved))
    shutil.copyfile(folder / "tokenizer.json", saved / "tokenizer.json")
    command = [args.optimum_cli, "export", "executorch", "--model", str(saved), "--task",
               "text-generation", "--recipe", "xnnpack", "--use_custom_sdpa",
               "--use_custom_kv_cache", "--max_seq_len", str(args.cache),
               "--output_dir", str(folder / "optimum")]
    if args.quant != "none":
        command += ["--qlinear", {"8da4w": "8da4w", "int8": "8da8w"}[args.quant]]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    pte = folder / "optimum" / "model.pte"
    if done.returncode != 0 or not pte.is_file():
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        print(f"optimum: export failed (exit {done.returncode}): {tail[0][:300]}", flush=True)
        return {}
    print(f"optimum model.pte: {pte.stat().st_size:,} B, exported in "
          f"{time.perf_counter() - start:.0f} s ({' '.join(command[1:])})", flush=True)
    return {"optimum": pte}


class InRunner:
    """executorch's TextLLMRunner; times from its Stats (ms)."""

    def __init__(self, pte: Path, tokenizer: Path):
        from executorch.extension.llm.runner import TextLLMRunner

        from ..pte.runner import load_llm_kernels

        load_llm_kernels(pte.read_bytes())
        self.runner = TextLLMRunner(str(pte), str(tokenizer))

    def run(self, text: str, ids: list, new: int) -> tuple:
        from executorch.extension.llm.runner import GenerationConfig

        pieces, stats = [], []
        self.runner.reset()
        # warming: the runner prints neither the text nor its report (its Stats still come)
        self.runner.generate(text, GenerationConfig(echo=False, max_new_tokens=new,
                                                    temperature=0.0, warming=True),
                             pieces.append, stats.append)
        s = stats[0]
        if s.num_prompt_tokens != len(ids):
            raise AssertionError(f"the runner's prompt has {s.num_prompt_tokens} tokens, "
                                 f"not {len(ids)}")
        decode = (s.inference_end_ms - s.prompt_eval_end_ms) / max(1, s.num_generated_tokens)
        return s.prompt_eval_end_ms - s.inference_start_ms, decode, "".join(pieces)


class InGenerator:
    """xnnfold's Generator (``xnnfold generate``); perf_counter times."""

    def __init__(self, pte: Path, tokenizer):
        from ..export.llm import Generator

        self.generator, self.tokenizer = Generator(pte), tokenizer

    def run(self, text: str, ids: list, new: int) -> tuple:
        done = self.generator.generate(ids, new, stop_at_eos=False)
        return (done.prefill_seconds * 1e3, done.decode_seconds * 1e3 / done.decode_steps,
                self.tokenizer.decode(done.tokens))


class TwoMethods:
    """The two-method layout as ``xnnfold generate`` ran it before: ``prefill`` chunks, then
    ``decode`` per token, on ``executorch.runtime`` (methods sharing arenas)."""

    def __init__(self, pte: Path, tokenizer):
        from executorch.runtime import Runtime

        from ..pte.runner import load_llm_kernels

        self.data = pte.read_bytes()
        load_llm_kernels(self.data)
        program = Runtime.get().load_program(self.data)
        self.prefill, self.decode = (program.load_method(m) for m in ("prefill", "decode"))
        self.chunk = int(program.load_method("get_max_seq_len").execute(())[0])
        self.tokenizer = tokenizer

    def run(self, text: str, ids: list, new: int) -> tuple:
        start = time.perf_counter()
        for offset in range(0, len(ids), self.chunk):
            part = ids[offset:offset + self.chunk]
            (logits,) = self.prefill.execute((torch.tensor([part]),
                                              torch.arange(offset, offset + len(part))))
        prefill = time.perf_counter() - start
        tokens, decode = [int(logits.reshape(-1).argmax())], 0.0
        for position in range(len(ids), len(ids) + new - 1):
            start = time.perf_counter()
            (logits,) = self.decode.execute((torch.tensor([[tokens[-1]]]),
                                             torch.tensor([position])))
            decode += time.perf_counter() - start
            tokens.append(int(logits.reshape(-1).argmax()))
        return prefill * 1e3, decode * 1e3 / (new - 1), self.tokenizer.decode(tokens)


