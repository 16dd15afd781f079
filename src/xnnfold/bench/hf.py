"""``xnnfold hf DIR -o OUT.pte [--compare]``: a transformers model saved in a local folder
(``model.save_pretrained(DIR)``; no hub access) to .pte files through xnnfold.

What is exported, by the folder's config:
- Whisper (``model_type == "whisper"``): two programs, the encoder on a full window
  (``num_mel_bins`` x ``2 * max_source_positions`` frames, 30 s at whisper's dims) and one
  decoder step (``--tokens`` tokens over ``max_source_positions`` encoder states, logits out),
  written as ``OUT.encoder.pte`` and ``OUT.decoder.pte``;
- a causal LM (an architecture named ``...ForCausalLM`` or ``...LMHeadModel``): logits of
  ``--tokens`` tokens, no cache;
- a vision model with ``image_size`` and ``num_channels`` (ViT, DeiT, ...): the last hidden
  state of one image.

Random example inputs (seeded). With ``--compare``, each program is also lowered with stock
executorch, both .pte files run on the ExecuTorch runtime (interleaved rounds) and a table
prints stock beside xnnfold. Why not optimum-executorch's own export: see the README
(*Hugging Face models*).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from .sources import UsageError


@dataclass
class Part:
    """One program to export: its name (the .pte's suffix), module and example inputs."""

    name: str
    module: nn.Module
    inputs: tuple


class _Logits(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, tokens):
        return self.model(input_ids=tokens, use_cache=False, return_dict=True).logits


def parts(folder: str, tokens: int = 8, attention: str = "sdpa") -> list:
    """The programs of the model saved in ``folder``, built from its config and weights."""
    from .zoo import _FirstOutput, _transformers, _WhisperDecoderStep

    tf = _transformers()
    path = Path(folder)
    if not (path / "config.json").is_file():
        raise UsageError(f"{folder}: no config.json (save the model with save_pretrained)")
    config = tf.AutoConfig.from_pretrained(folder, local_files_only=True)
    load = dict(local_files_only=True, attn_implementation=attention)
    architectures = config.architectures or []
    torch.manual_seed(0)
    if config.model_type == "whisper":
        model = tf.WhisperForConditionalGeneration.from_pretrained(folder, **load).eval()
        frames = 2 * config.max_source_positions
        encoder = _FirstOutput(model.model.encoder, "last_hidden_state")
        return [Part("encoder", encoder.eval(),
                     (torch.randn(1, config.num_mel_bins, frames),)),
                Part("decoder", _WhisperDecoderStep(model).eval(),
                     (torch.randint(0, config.vocab_size, (1, tokens)),
                      torch.randn(1, config.max_source_positions, config.d_model)))]
    if any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in architectures):
        model = tf.AutoModelForCausalLM.from_pretrained(folder, **load).eval()
        return [Part("", _Logits(model).eval(),
                     (torch.randint(0, config.vocab_size, (1, tokens)),))]
    if hasattr(config, "image_size") and hasattr(config, "num_channels"):
        model = tf.AutoModel.from_pretrained(folder, **load).eval()
        image = config.image_size
        return [Part("", _FirstOutput(model, "last_hidden_state").eval(),
                     (torch.randn(1, config.num_channels, image, image),))]
    raise UsageError(f"{folder}: model type {config.model_type!r} ({', '.join(architectures)})"
                     " is not one xnnfold hf exports: Whisper, a causal LM, or a vision model")


def _pte_path(output: Path, part: Part) -> Path:
    return output if not part.name else output.with_suffix(f".{part.name}{output.suffix}")


def export_folder(folder: str, output: str, compare: bool = False, tokens: int = 8,
                  attention: str = "sdpa", reps: int = 10, prefer: str = "speed") -> list:
    """Write the .pte of every part; return the table's rows (stock beside xnnfold when
    ``compare``). ``prefer``: xnnfold's (``XnnpackPartitioner(prefer=...)``)."""
    from .side_by_side import time_interleaved
    from .compare import compare_outputs
    from .measure import STOCK, XNNFOLD, PteRunner, lower

    output_path = Path(output)
    if not output_path.parent.exists():
        raise UsageError(f"{output}: folder {output_path.parent} does not exist")
    rows = []
    for part in parts(folder, tokens, attention):
        with torch.no_grad():
            expected = part.module(*part.inputs)
        program = torch.export.export(part.module, part.inputs)
        variants = [STOCK, XNNFOLD] if compare else [XNNFOLD]
        lowered = {variant: lower(program, variant,
                                  {"prefer": prefer} if variant == XNNFOLD else None)
                   for variant in variants}
        destination = _pte_path(output_path, part)
        destination.write_bytes(lowered[XNNFOLD].pte)
        runners = {v: PteRunner(low.pte) for v, low in lowered.items()}
        times = time_interleaved(runners, part.inputs, reps) if compare else {}
        for variant, low in lowered.items():
            median = sorted(times[variant])[len(times[variant]) // 2] if times else None
            rows.append({"part": part.name or "model", "variant": variant,
                         "gemms_outside": len(low.gemms_outside),
                         "delegate_calls": low.delegate_calls, "pte_bytes": low.pte_bytes,
                         "outputs": str(compare_outputs(runners[variant].run(part.inputs),
                                                        expected)),
                         "lower_seconds": low.lower_seconds, "median_ms": median,
                         "written": str(destination) if variant == XNNFOLD else ""})
    for row in rows:
        stock = next((r for r in rows if r["part"] == row["part"] and r["variant"] == STOCK),
                     None)
        row["vs_stock"] = (row["median_ms"] / stock["median_ms"]
                           if stock and stock["median_ms"] and row["median_ms"] else None)
    return rows


def table(rows: list) -> str:
    from tabulate import tabulate

    body = [[r["part"], r["variant"], r["gemms_outside"], r["delegate_calls"],
             f"{r['pte_bytes']:,}", r["outputs"], f"{r['lower_seconds']:.1f}",
             "" if r["median_ms"] is None else f"{r['median_ms']:.3f}",
             "" if r["vs_stock"] is None else f"{r['vs_stock']:.3f}", r["written"]]
            for r in rows]
    return tabulate(body, headers=["part", "variant", "GEMMs outside", "delegate calls",
                                   ".pte bytes", "outputs vs eager", "lower s", "latency ms (median)",
                                   "vs stock", "written"], disable_numparse=True)
