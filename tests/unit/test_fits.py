"""A causal LM whose export cannot fit the machine's memory is refused before any work, in one
line with the estimate, the memory available and what to try (:mod:`xnnfold.export.hf.fits`);
the parameters are counted from safetensors headers (no tensor read) or config.json's dims."""

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from xnnfold.export.hf import fits
from xnnfold.export.hf.plan import plan
from xnnfold.usage import OptionError

SRC = str(Path(__file__).resolve().parents[2] / "src")
GB = 1e9
LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_act": "silu",
         "max_position_embeddings": 4096}
# Llama-3.1-8B's dims: 8.03 B parameters
LLAMA_8B = {**LLAMA, "hidden_size": 4096, "num_hidden_layers": 32, "intermediate_size": 14336,
            "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
            "tie_word_embeddings": False}
SMALL = {**LLAMA, "hidden_size": 16, "num_hidden_layers": 2, "intermediate_size": 32,
         "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 64}


def safetensors_header(path: Path, shapes: dict) -> None:
    """A safetensors file's header alone (its data left out: the estimate reads no data)."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in shapes.items():
        size = 2
        for dim in shape:
            size *= dim
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text)


def folder_of(tmp_path, name: str, config: dict, shapes: dict = None) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    if shapes is not None:
        safetensors_header(folder / "model.safetensors", shapes)
    return folder


def test_the_config_s_dims_count_a_llama_s_parameters():
    assert abs(fits.config_parameters(LLAMA_8B) - 8.03e9) < 0.01e9
    # SmolLM2-135M (tied): 134.5 M with its norms, which the count leaves out
    smol = {**LLAMA, "hidden_size": 576, "num_hidden_layers": 30, "intermediate_size": 1536,
            "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152}
    assert 134.4e6 < fits.config_parameters(smol) < 134.6e6
    assert fits.config_parameters({"model_type": "llama"}) is None


def test_the_safetensors_headers_count_the_stored_tensors(tmp_path):
    folder = folder_of(tmp_path, "m", SMALL, {"embed": [64, 16], "layer.0.q": [16, 16]})
    safetensors_header(folder / "model-2.safetensors", {"layer.1.q": [16, 16], "norm": [16]})
    assert fits.checkpoint_parameters(folder) == (64 * 16 + 2 * 256 + 16,
                                                  "2 safetensors header(s)")
    (folder / "model-2.safetensors").write_text("version https://git-lfs.github.com/spec/v1")
    assert fits.checkpoint_parameters(folder) is None      # unreadable: not guessed


def test_the_peak_is_the_measured_factor_of_the_fp32_weights_and_the_cache(tmp_path):
    found = fits.estimate(folder_of(tmp_path, "m", LLAMA_8B), LLAMA_8B, cache_rows=1024)
    assert found.source == "config.json's dims"
    assert found.cache_bytes == 2 * 32 * 8 * 128 * 1024 * 4
    assert found.peak() == pytest.approx(0.3e9 + 3.0 * 4 * found.parameters +
                                         2 * found.cache_bytes)
    assert found.peak("8da4w") < found.peak()


def test_cgroup_and_meminfo_the_least_of_them(monkeypatch):
    files = {"/proc/meminfo": "MemTotal: 25165824 kB\nMemAvailable: 20971520 kB\n",
             "/sys/fs/cgroup/memory.max": "8000000000\n",
             "/sys/fs/cgroup/memory.stat": "anon 1000000000\nfile 5000000000\n"}
    monkeypatch.setattr(fits, "_read", files.get)
    assert fits.available_memory() == (7e9, "the cgroup's limit of 8.0 GB "
                                       "(/sys/fs/cgroup/memory.max)")
    files["/sys/fs/cgroup/memory.max"] = "max\n"
    assert fits.available_memory() == (20971520 * 1024, "MemAvailable in /proc/meminfo")
    files.clear()
    assert fits.available_memory() is None


def test_a_checkpoint_that_cannot_fit_is_refused_with_the_numbers(tmp_path):
    folder = folder_of(tmp_path, "llama8b", LLAMA_8B)
    with pytest.raises(OptionError) as refused:
        fits.check_fits(folder, LLAMA_8B, None, 1024, available=(24 * GB, "MemAvailable"))
    said = str(refused.value)
    assert "\n" not in said and said.startswith(
        f"{folder}: its export in fp32 needs about 97.2 GB at its peak (8,030 M parameters, "
        "from config.json's dims;") and "this machine has 24.0 GB available (MemAvailable)" in said
    assert said.endswith("try quantize=8da4w (about 18.5 GB); or force=True to export anyway")


def test_what_to_try_is_what_fits(tmp_path):
    folder = folder_of(tmp_path, "llama8b", LLAMA_8B)
    with pytest.raises(OptionError) as refused:
        fits.check_fits(folder, LLAMA_8B, None, 1024, available=(90 * GB, "MemAvailable"))
    assert str(refused.value).endswith("try quantize=8da4w (about 18.5 GB); or force=True to "
                                       "export anyway")
    # the weights fit, the cache of 4,096 rows does not: a cache that fits
    small = fits.estimate(folder, LLAMA_8B, 0).peak("8da4w")
    with pytest.raises(OptionError) as refused:
        fits.check_fits(folder, LLAMA_8B, "8da4w", 4096, available=(small + 0.2 * GB, "here"))
    # 2 x 32 layers x 8 heads x 128 x 4 bytes, twice: 524,288 bytes a row
    assert str(refused.value).endswith("try max_cache=381; or force=True to export anyway")


def test_llama_3b_dims_in_8da4w_fit_a_24_gib_machine_and_fp32_does_not(tmp_path):
    # its 8da4w export ran here (10.4 GB of anonymous memory at its peak): 2.0x the fp32
    # weights (26 GB) refused it
    llama_3b = {**LLAMA, "hidden_size": 3072, "num_hidden_layers": 28, "intermediate_size": 8192,
                "num_attention_heads": 24, "num_key_value_heads": 8, "vocab_size": 128256,
                "tie_word_embeddings": True}
    folder = folder_of(tmp_path, "llama3b", llama_3b)
    here = (22 * GB, "MemAvailable")
    fits.check_fits(folder, llama_3b, "8da4w", 1024, available=here)
    assert fits.estimate(folder, llama_3b, 1024).peak("8da4w") < 10.4 * GB
    with pytest.raises(OptionError, match=r"try quantize=8da4w \(about 7.8 GB\)"):
        fits.check_fits(folder, llama_3b, None, 1024, available=here)


def test_a_folder_that_fits_or_is_unknown_is_not_refused(tmp_path):
    folder = folder_of(tmp_path, "small", SMALL, {"embed": [64, 16]})
    fits.check_fits(folder, SMALL, None, 1024, available=(1 * GB, "MemAvailable"))
    fits.check_fits(folder_of(tmp_path, "bare", {"model_type": "x"}), {}, None, 0,
                    available=(1, "MemAvailable"))               # no weights, no dims
    fits.check_fits(folder, SMALL, None, 1024)                   # this machine's memory


def test_check_plan_is_for_causal_lms_with_the_export_s_cache(tmp_path, monkeypatch):
    asked = []
    monkeypatch.setattr(fits, "check_fits", lambda *a: asked.append(a[2:]))
    fits.check_plan(plan(str(folder_of(tmp_path, "llama", LLAMA_8B))), "8da4w", True, 300)
    fits.check_plan(plan(str(tmp_path / "llama")), None, False)
    vit = {"model_type": "vit", "architectures": ["ViTForImageClassification"],
           "image_size": 16, "num_channels": 3}
    fits.check_plan(plan(str(folder_of(tmp_path, "vit", vit))))
    assert asked == [("8da4w", 300), (None, 0)]


_HF = """
import io, contextlib
from xnnfold.cli import main
err = io.StringIO()
with contextlib.redirect_stderr(err):
    code = main(sys.argv[1:])
print(json.dumps([code, err.getvalue(), 'torch' in sys.modules]))
"""


def _hf(folder: Path, *argv: str) -> list:
    """[exit code, stderr, torch imported] of ``xnnfold hf`` run in ``folder``."""
    done = subprocess.run([sys.executable, "-c", "import json, sys\n" + _HF, *argv],
                          capture_output=True, text=True, cwd=folder, timeout=120,
                          env={**os.environ, "PYTHONPATH": SRC})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_hf_refuses_a_checkpoint_that_cannot_fit_in_one_line_before_torch(tmp_path):
    # 10^15 parameters declared by a safetensors header: no machine holds them
    folder_of(tmp_path, "huge", SMALL, {"embed": [10 ** 8, 10 ** 7]})
    code, err, torch_imported = _hf(tmp_path, "hf", "huge", "-o", "huge.pte")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and not torch_imported, err
    assert lines[0].startswith("xnnfold: error: huge: its export in fp32 needs about ") and \
        "1,000,000,000 M parameters, from 1 safetensors header(s)" in lines[0] and \
        lines[0].endswith("a machine with more memory, or --force to export anyway")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["huge"]


def test_export_folder_refuses_before_loading_unless_forced(tmp_path, monkeypatch):
    from xnnfold.export import hf
    from xnnfold.export.hf import parts

    class Loaded(Exception):
        pass

    def load(plan, attention, quantize=None):
        raise Loaded

    monkeypatch.setattr(parts, "load", load)
    huge = plan(str(folder_of(tmp_path, "huge", SMALL, {"embed": [10 ** 8, 10 ** 7]})))
    with pytest.raises(OptionError, match="needs about"):
        hf.export_folder(huge, str(tmp_path / "huge.pte"))
    with pytest.raises(Loaded):
        hf.export_folder(huge, str(tmp_path / "huge.pte"), force=True)


def test_a_file_the_safetensors_package_wrote_is_counted(tmp_path):
    import torch
    save_file = pytest.importorskip("safetensors.torch").save_file    # transformers' own

    save_file({"embed": torch.zeros(64, 16, dtype=torch.bfloat16), "norm": torch.ones(16)},
              str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    assert fits.checkpoint_parameters(tmp_path) == (64 * 16 + 16, "1 safetensors header(s)")
