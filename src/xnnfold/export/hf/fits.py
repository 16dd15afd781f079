"""Whether a causal LM's export fits this machine's memory, asked before any work
(:func:`check_fits`): the export's peak estimated from the folder alone (the parameters counted
from its safetensors headers, without loading a tensor; else from config.json's dims) against
the memory available here (``/proc/meminfo``, a cgroup's limit). A folder that cannot fit is
refused in one line with both figures and what to try, rather than killed by the kernel after
minutes; ``force`` exports anyway. Causal LMs only: the figures are theirs.

The peak is measured, not derived: ``xnnfold hf`` loads the weights in fp32 whatever the
checkpoint's dtype, and its peak resident set was 9.68 GB (fp32) and 6.80 GB (8da4w) at
Qwen2.5-0.5B's dims (494 M parameters, 1.98 GB in fp32), 3.85 / 2.95 GB at SmolLM2-135M's
(0.54 GB): 4.7-6.6x the fp32 weights above the libraries' 0.3 GB in fp32, 3.3-5.0x quantized.
The factors below are the low ends, rounded down: a refusal means the export cannot fit.
Quantized, the linears are now quantized as they are read (:mod:`.streaming`): the fp32 linears
that stayed alive beside the quantized copy (Qwen2.5-0.5B: 358 M parameters, 1.43 GB, 0.72x)
are gone for the whole export, so Qwen's 3.3x is at most 2.6x; SmolLM2-135M's measured again:
2.91 GB, 4.8x. Quantized, the factor falls with the model's size: the graphs' own memory
(about 1-2 GB) is most of the peak at SmolLM2's dims, the weights at Llama-3.2-3B's (3,213 M
parameters, 12.85 GB fp32), whose 8da4w export here held 10.4 GB of anonymous memory at the
end of its load (0.79x: the quantized linears 1.125 bytes a weight, the fp32 embedding, the
tied head's scale search, 4.4 GB; the resident set 14.25 GB with the checkpoint's mapped pages,
which the kernel reclaims) and 13.4 GB in the check's eager forwards (1.02x). At Llama-3.1-8B's
dims the same parts of the load make about 0.56x (a smaller embedding and head against the
linears), so 8da4w's factor is 0.55: the factor of 2.0 refused the 3B export on this 24 GiB
machine (26 GB estimated). In fp32, since the lowering's delegates are released before the
check and large blocks are mapped on their own (:mod:`xnnfold.export.llm.release`), the peak is
the lowering's (executorch copies every delegated weight before XNNPACK serializes them: the
weights three times at once; torch.export traced over fake weights and the tied table given to
the head under a placeholder of its own, neither is copied once more): 6.86 GB at
Qwen2.5-0.5B's dims (3.29x above the libraries and the cache), 15.72 GB at Llama-3.2-1B's
(1,236 M parameters, 4.94 GB: 3.09x), so fp32's factor is 3.0 (it was 4.5, which refused the
1B export here: 22.7 GB estimated).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ...usage import OptionError

LIBRARIES = 0.3e9                 # torch, executorch, transformers imported: resident bytes
PEAK_PER_FP32_BYTE = {None: 3.0, "8da4w": 0.55, "int8": 0.55}  # int8: unmeasured, as 8da4w
_GB = 1e9
_FEWEST_ROWS = 16               # a cache worth suggesting


@dataclass(frozen=True)
class Estimate:
    """The export's peak in bytes, from ``parameters`` (counted from ``source``) and the KV
    cache's bytes (the model's buffers and the runtime's arena: counted twice)."""

    parameters: int
    source: str
    cache_bytes: int = 0

    def peak(self, quantize: Optional[str] = None) -> float:
        return (LIBRARIES + PEAK_PER_FP32_BYTE[quantize] * 4 * self.parameters +
                2 * self.cache_bytes)


def checkpoint_parameters(folder) -> Optional[tuple]:
    """(parameters, what they were counted from) of ``folder``'s weights: the safetensors
    files' headers (a JSON table at the start of each file: shapes, no data read), else the
    size of its PyTorch weight files at the config's dtype; None if it has neither."""
    folder = Path(folder)
    tensors = sorted(folder.glob("*.safetensors"))
    if tensors:
        counts = [_safetensors_elements(path) for path in tensors]
        return None if None in counts else (sum(counts), f"{len(tensors)} safetensors "
                                            "header(s)")
    pickles = sorted(folder.glob("pytorch_model*.bin"))
    if pickles:
        config = _config(folder)
        dtype = str(config.get("dtype") or config.get("torch_dtype") or "float32")
        size = 2 if dtype in ("float16", "bfloat16") else 4
        return sum(p.stat().st_size for p in pickles) // size, f"{len(pickles)} .bin file(s)"
    return None


def _safetensors_elements(path: Path) -> Optional[int]:
    """The elements of every tensor a safetensors file declares, from its header: 8 bytes
    (little-endian length), then that many bytes of JSON; None if it is not one (what is
    wrong with it is the loader's to say)."""
    try:
        with open(path, "rb") as file:
            head = file.read(8)
            (length,) = struct.unpack("<Q", head) if len(head) == 8 else (0,)
            header = json.loads(file.read(length)) if 0 < length < 100_000_000 else None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(header, dict):
        return None
    total = 0
    for name, entry in header.items():
        if name != "__metadata__" and isinstance(entry, dict):
            count = 1
            for size in entry.get("shape", []):
                count *= size if isinstance(size, int) else 0
            total += count
    return total


def _config(folder: Path) -> dict:
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def _first(config: dict, *keys: str, default=None):
    return next((config[k] for k in keys if isinstance(config.get(k), int)), default)


def config_parameters(config: dict) -> Optional[int]:
    """A decoder LM's parameters from its dims (embeddings, attention, MLP; norms and biases
    left out: a count from below), or None where the dims are not there."""
    config = config.get("text_config") or config
    hidden = _first(config, "hidden_size", "n_embd", "d_model")
    layers = _first(config, "num_hidden_layers", "n_layer", "num_layers")
    vocab = _first(config, "vocab_size")
    if not (hidden and layers and vocab):
        return None
    heads = _first(config, "num_attention_heads", "n_head", default=1)
    head_dim = _first(config, "head_dim", default=hidden // max(heads, 1))
    kv_heads = _first(config, "num_key_value_heads", default=heads)
    experts = _first(config, "num_local_experts", "num_experts", default=1)
    inner = _first(config, "moe_intermediate_size" if experts > 1 else "intermediate_size",
                   "intermediate_size", "n_inner", "ffn_dim", default=4 * hidden)
    gated = config.get("hidden_act") in ("silu", "swish")        # gate, up and down
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    mlp = (3 if gated else 2) * hidden * inner * experts
    tied = config.get("tie_word_embeddings", True) is not False
    return vocab * hidden * (1 if tied else 2) + layers * (attention + mlp)


def cache_bytes(config: dict, rows: int) -> int:
    """The fp32 bytes of a static KV cache of ``rows`` rows (keys and values, every layer)."""
    config = config.get("text_config") or config
    hidden = _first(config, "hidden_size", "n_embd", "d_model", default=0)
    layers = _first(config, "num_hidden_layers", "n_layer", "num_layers", default=0)
    heads = _first(config, "num_attention_heads", "n_head", default=1)
    head_dim = _first(config, "head_dim", default=hidden // max(heads, 1))
    kv_heads = _first(config, "num_key_value_heads", default=heads)
    return 2 * layers * kv_heads * head_dim * rows * 4


def estimate(folder, config: dict, cache_rows: int = 0) -> Optional[Estimate]:
    """The export's :class:`Estimate` for ``folder`` (``cache_rows``: its KV cache), or None
    where neither its weights nor its config give the parameters."""
    counted = checkpoint_parameters(folder)
    if counted is None:
        parameters = config_parameters(config)
        counted = None if parameters is None else (parameters, "config.json's dims")
    if counted is None:
        return None
    return Estimate(counted[0], counted[1], cache_bytes(config, cache_rows))


def available_memory() -> Optional[tuple]:
    """(bytes available to this process, where that was read), or None where unknown: the
    kernel's MemAvailable, or less where a cgroup (v2 or v1) limits this process."""
    found = []
    meminfo = _read("/proc/meminfo")
    for line in (meminfo or "").splitlines():
        if line.startswith("MemAvailable:"):
            found.append((int(line.split()[1]) * 1024, "MemAvailable in /proc/meminfo"))
    for limit_file, stat_file, used_key in (
            ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.stat", "anon"),
            ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
             "/sys/fs/cgroup/memory/memory.stat", "rss")):
        limit = (_read(limit_file) or "").strip()
        if limit.isdigit() and int(limit) < 2 ** 60:
            used = _stat_value(_read(stat_file) or "", used_key)
            found.append((int(limit) - used, f"the cgroup's limit of "
                          f"{int(limit) / _GB:.1f} GB ({limit_file})"))
    return min(found) if found else None


def _read(path: str) -> Optional[str]:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def _stat_value(text: str, key: str) -> int:
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


def check_fits(folder, config: dict, quantize: Optional[str], cache_rows: int,
               available: Optional[tuple] = None) -> None:
    """:class:`~xnnfold.usage.OptionError` (one line: the estimate, the memory available, what to try) where
    the export of ``folder`` cannot fit; nothing where it may, or where either is unknown.
    ``available``: (bytes, where read), default :func:`available_memory`."""
    found = estimate(folder, config, cache_rows)
    available = available_memory() if available is None else available
    if found is None or available is None:
        return
    peak, (have, where) = found.peak(quantize), available
    if peak <= have:
        return
    per_row = 2 * cache_bytes(config, 1)         # the peak's bytes per row of the cache
    rows = int((have - peak + 2 * found.cache_bytes) // per_row) if per_row else 0
    trials = [f"`max_cache={rows}`"] if cache_rows and _FEWEST_ROWS <= rows else []
    if quantize != "8da4w" and found.peak("8da4w") <= have:
        trials.append(f"`quantize=8da4w` (about {found.peak('8da4w') / _GB:.1f} GB)")
    trials.append("`force=True` to export anyway" if trials else
                  "a machine with more memory, or `force=True` to export anyway")
    scheme = f" with `quantize={quantize}`" if quantize else " in fp32"
    raise OptionError(
        f"{folder}: its export{scheme} needs about {peak / _GB:.1f} GB at its peak "
        f"({found.parameters / 1e6:,.0f} M parameters, from {found.source}; "
        f"{PEAK_PER_FP32_BYTE[quantize]}x their fp32 bytes as measured, + libraries and KV "
        f"cache), this machine has {have / _GB:.1f} GB available ({where}): try "
        f"{'; or '.join(trials)}")


def check_plan(plan, quantize: Optional[str] = None, cache: bool = True,
               max_cache: Optional[int] = None, max_prefill: Optional[int] = None) -> None:
    """:func:`check_fits` for ``plan`` (:class:`~xnnfold.export.hf.plan.Plan`) with the
    export's options: a causal LM's, its KV cache the one the export would give it."""
    from ..llm.sizes import cache_sizes
    from .plan import CAUSAL_LM

    if plan.kind != CAUSAL_LM:
        return
    rows = cache_sizes(plan.positions, max_cache, max_prefill)[0] if cache else 0
    check_fits(plan.folder, plan.config, quantize, rows)
