"""The folders and the exports of ``xnnfold bench optimum-multimodal``: random-weight
transformers folders at real per-layer dims (Gemma3-4B's image-text model, Voxtral-Mini-3B,
t5-small), each written with ``save_pretrained`` and a byte-level BPE tokenizer.json of the
model's vocabulary, and each exported by optimum-executorch (its ``optimum-cli export
executorch --recipe xnnpack``) and by ``xnnfold hf``, each export in a process of its own under
``/usr/bin/time -v`` (wall time, peak resident set).

optimum-executorch's multimodal export draws the encoder's example input by running the
folder's processor on an image or an audio file it downloads (its integrations.py:
``VisionExportableModule`` / ``AudioExportableModule.prepare_export_inputs``); offline that
fails before any export. :data:`OPTIMUM_DRIVER` runs optimum's own command line with those two
methods returning a random tensor of the shape the processor gives (the model's image size,
or one 30-second chunk of mel features, batch 2 with its dynamic batch dim as optimum's): the
export itself is optimum's, unchanged.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from . import timed_command

VOCAB = 32_768      # the text models' vocabulary, cut from 262,208 / 131,072 (memory: below)


def _gemma3(transformers, vision_layers: int, text_layers: int):
    """Gemma3-4B-it's dims: SigLIP-400M (1152 wide, 16 heads, ff 4304, 896 px, patch 14: 4096
    patches pooled to 256 tokens), its text model's layer (2560 wide, 8 / 4 heads of 256,
    ff 10240, a sliding layer and a global one)."""
    vision = transformers.SiglipVisionConfig(
        hidden_size=1152, intermediate_size=4304, num_hidden_layers=vision_layers,
        num_attention_heads=16, image_size=896, patch_size=14, vision_use_head=False)
    pattern = ["sliding_attention"] * 5 + ["full_attention"]   # the 4B's: the last layers
    text = transformers.Gemma3TextConfig(
        hidden_size=2560, intermediate_size=10240, num_hidden_layers=text_layers,
        num_attention_heads=8, num_key_value_heads=4, head_dim=256, vocab_size=VOCAB,
        sliding_window=1024, query_pre_attn_scalar=256, max_position_embeddings=131072,
        layer_types=[pattern[(i - text_layers) % 6] for i in range(text_layers)],
        bos_token_id=2, eos_token_id=1, pad_token_id=0)
    config = transformers.Gemma3Config(
        text_config=text.to_dict(), vision_config=vision.to_dict(), mm_tokens_per_image=256,
        boi_token_index=VOCAB - 3, eoi_token_index=VOCAB - 2, image_token_index=VOCAB - 1)
    return transformers.Gemma3ForConditionalGeneration(config)


def _voxtral(transformers, audio_layers: int, text_layers: int):
    """Voxtral-Mini-3B's dims: its audio encoder's layer (Whisper-large-v3's: 1280 wide, 20
    heads, ff 5120, 128 mel bins x 3000 frames, 375 embeddings a chunk), its text model's
    (3072 wide, 32 / 8 heads of 128, ff 8192, an untied head)."""
    audio = transformers.VoxtralEncoderConfig(
        hidden_size=1280, intermediate_size=5120, num_hidden_layers=audio_layers,
        num_attention_heads=20, num_mel_bins=128, max_source_positions=1500)
    text = transformers.LlamaConfig(
        hidden_size=3072, intermediate_size=8192, num_hidden_layers=text_layers,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=VOCAB,
        max_position_embeddings=131072, rope_theta=100_000_000.0, rms_norm_eps=1e-5,
        bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    config = transformers.VoxtralConfig(audio_config=audio.to_dict(), text_config=text.to_dict(),
                                        audio_token_id=24)
    return transformers.VoxtralForConditionalGeneration(config)


def _published_vision_names(path: Path) -> None:
    """Gemma3's SigLIP tensors under the names of the published checkpoints
    (``vision_tower.vision_model.*``): transformers 5.25 saves them as ``vision_tower.*``, which
    it loads back but 5.0.0rc1 (optimum-executorch's) does not (it draws them anew)."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(path)
    renamed = {("vision_tower.vision_model." + k[len("vision_tower."):]
                if k.startswith("vision_tower.") and not k.startswith("vision_tower.vision_model.")
                else k): v for k, v in tensors.items()}
    save_file(renamed, path, metadata={"format": "pt"})


@dataclass
class Folder:
    name: str             # gemma3, voxtral, t5
    path: Path
    task: str             # optimum-cli's --task
    optimum_flags: tuple  # as a user gives them for this task
    parameters: int
    dims: str


def write_folder(name: str, root: Path, encoder_layers: int, text_layers: int,
                 seed: int = 0) -> Folder:
    """Write model ``name``'s folder under ``root`` (once: an existing folder is reused)."""
    import transformers

    from ..models.t5 import save_t5_folder, t5
    from .random_folder import bpe_tokenizer

    path = root / name
    exists = (path / "config.json").is_file()
    # an existing folder is reused: the model then built on the meta device, for its count
    with torch.device("meta" if exists else "cpu"):
        if name == "t5":
            model = t5("small", init_factor=1.0, seed=seed)
            task, flags = "text2text-generation", ()
            dims = "t5-small: d_model 512, 6 + 6 layers, 8 heads, d_ff 2048, vocab 32,128, tied"
        else:
            torch.manual_seed(seed)
            build = _gemma3 if name == "gemma3" else _voxtral
            model = build(transformers, encoder_layers, text_layers).eval()
            task = "image-text-to-text" if name == "gemma3" else "multimodal-text-to-text"
            flags = ("--use_custom_sdpa", "--use_custom_kv_cache")
            dims = (f"{build.__doc__.split(':', 1)[1].strip()} {encoder_layers} encoder "
                    f"layer(s), {text_layers} text layer(s), vocab {VOCAB:,}")
    parameters = sum(p.numel() for p in model.parameters())
    if not exists:
        path.mkdir(parents=True, exist_ok=True)
        if name == "t5":
            save_t5_folder(path, model)
        else:
            model.save_pretrained(path)
            if name == "gemma3":
                _published_vision_names(path / "model.safetensors")
        text = model.config.text_config if name != "t5" else model.config
        bos = getattr(text, "bos_token_id", None)
        bpe_tokenizer(path / "tokenizer.json", text.vocab_size, 2 if bos is None else bos,
                      text.eos_token_id)
    return Folder(name, path, task, flags, parameters, " ".join(dims.split()))


OPTIMUM_DRIVER = '''
import sys, torch
from optimum.exporters.executorch import integrations as i

def _image(self):
    size = self.model.config.vision_config.image_size
    return torch.rand(1, 3, size, size, generator=torch.Generator().manual_seed(0)) * 2 - 1, None

def _audio(self):
    bins = self.model.config.audio_config.num_mel_bins
    frames = 2 * self.model.config.audio_config.max_source_positions
    dim = torch.export.Dim("enc_batch_size_dim", min=1, max=10)
    return (torch.randn(2, bins, frames, generator=torch.Generator().manual_seed(0)),
            {"input_features": {0: dim}})

i.VisionExportableModule.prepare_export_inputs = _image
i.AudioExportableModule.prepare_export_inputs = _audio
from optimum.commands.optimum_cli import main
sys.argv = ["optimum-cli"] + sys.argv[1:]
main()
'''


@dataclass
class Export:
    tool: str
    pte: Path
    seconds: float
    peak_gb: float
    status: str           # "ok" or the failure's last line


def _timed(command: list, log: Path) -> tuple:
    """(exit code, wall seconds, peak RSS GB) of ``command`` under /usr/bin/time -v."""
    return (timed_command.run_timed(command, log), *_measured(log))


def _measured(log: Path) -> tuple:
    """(wall seconds, peak RSS in GB: /usr/bin/time's "kbytes" are KiB, so x 1024 / 1e9) of
    the report at the end of ``log``; nan for what it lacks."""
    seconds, kib = timed_command.time_report(log)
    return (float("nan") if seconds is None else seconds,
            float("nan") if kib is None else kib * 1024 / 1e9)


def _failure(log: Path) -> str:
    """The last line of ``log`` naming an error (else its last line), shortened."""
    lines = [line.strip() for line in log.read_text().splitlines() if line.strip()
             and not line.startswith("\t") and "Command exited" not in line]
    errors = [line for line in lines if re.search(r"Error|error:", line)]
    return (errors or lines or ["no output"])[-1][:300]


def export_optimum(folder: Folder, optimum_cli: str, out: Path, max_seq_len: int) -> Export:
    """optimum-cli's export of ``folder`` into ``out`` (the CLI's venv's python runs the
    driver beside the CLI; an existing model.pte is reused)."""
    pte = out / "model.pte"
    if pte.is_file():
        return Export("optimum", pte, *_measured(out / "export.log"), "ok (reused)")
    out.mkdir(parents=True, exist_ok=True)
    python = str(Path(optimum_cli).with_name("python"))
    driver = out / "optimum_driver.py"
    driver.write_text(OPTIMUM_DRIVER)
    command = [python, str(driver), "export", "executorch", "--model", str(folder.path),
               "--task", folder.task, "--recipe", "xnnpack", *folder.optimum_flags,
               "--output_dir", str(out)]
    if folder.name != "t5":
        command += ["--max_seq_len", str(max_seq_len)]
    code, seconds, peak = _timed(command, out / "export.log")
    return Export("optimum", pte, seconds, peak,
                  "ok" if code == 0 and pte.is_file() else _failure(out / "export.log"))


def export_xnnfold(folder: Folder, out: Path, max_seq_len: int) -> Export:
    """``xnnfold hf`` of ``folder`` (its check on the runtime included), in this Python."""
    pte = out / f"{folder.name}.pte"
    if pte.is_file():
        return Export("xnnfold", pte, *_measured(out / "export.log"), "ok (reused)")
    out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "xnnfold", "hf", str(folder.path), "-o", str(pte)]
    if folder.name != "t5":
        command += ["--max-cache", str(max_seq_len)]
    code, seconds, peak = _timed(command, out / "export.log")
    return Export("xnnfold", pte, seconds, peak,
                  "ok" if code == 0 and pte.is_file() else _failure(out / "export.log"))
