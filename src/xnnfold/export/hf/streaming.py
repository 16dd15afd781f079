"""A causal LM's weights quantized as they are read (``xnnfold hf --quantize``): the model built
on the meta device (no memory for its weights), then module by module its tensors read from
the folder's safetensors files (mapped, a tensor at a time), made float32, and each linear the
scheme takes quantized at once, its float32 weight dropped. The float32 weights are never all in
memory: the peak is the quantized model and one module's float32 tensors, where loading the
model whole and then quantizing it held every float32 weight first (1.0x the float32 weights;
SmolLM2-135M's dims: 538 MB).

The model is the one ``from_pretrained`` and then :func:`~xnnfold.export.llm.quantize.
quantize_linears` give, bit for bit (the same tensors read, the same quantization of each
linear, the buffers computed by transformers' own initialization): a test compares them. A
folder this cannot read as that (a checkpoint's names that are not the model's, tensors in
several files under one name, a buffer transformers' initialization leaves unset) returns None
with the reason, and the caller loads the model whole.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
import torch
from torch import nn


class NotStreamable(Exception):
    """Why a folder's weights cannot be read module by module (one line)."""


def checkpoint_names(folder) -> dict:
    """{tensor name: its safetensors file} of every tensor in ``folder``'s safetensors files
    (their headers only)."""
    from safetensors import safe_open

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise NotStreamable("no safetensors file")
    names: dict = {}
    for path in files:
        with safe_open(str(path), framework="pt") as opened:
            for name in opened.keys():
                if name in names:
                    raise NotStreamable(f"{name} is in {names[name].name} and {path.name}")
                names[name] = path
    return names


def read_float32(opened, name: str) -> torch.Tensor:
    """Tensor ``name`` of an open safetensors file, as float32 (a bfloat16 one upcast alone)."""
    tensor = opened.get_tensor(name)
    return tensor.to(torch.float32) if tensor.is_floating_point() else tensor


def load_quantized(cls, folder, config, implementation: str, scheme: str) -> nn.Module:
    """``cls`` with ``folder``'s weights as float32 and its linears quantized by ``scheme`` as
    they are read, in eval mode; :class:`NotStreamable` when the folder cannot be read so."""
    from ..llm.quantize import linear_quantization, quantize_linear

    quantization, takes = linear_quantization(scheme)
    names = checkpoint_names(folder)
    with torch.device("meta"):
        model = cls._from_config(config, attn_implementation=implementation,
                                 dtype=torch.float32)
    stored = {name for name, _ in model.named_parameters()}   # a tied one under one name
    stored |= _persistent_buffers(model)
    unknown = sorted(stored ^ set(names))
    if unknown:
        raise NotStreamable(f"the checkpoint's names are not the model's ({unknown[0]} is in "
                            f"{'the model' if unknown[0] in stored else 'the checkpoint'} only)")
    _initialize_buffers(model, stored)
    # id of a meta tensor: its checkpoint name and the tensor (kept: its id stays its own),
    # and under how many names the model has it
    sources, aliases = {}, {}
    for key, tensor in _tensors(model):
        aliases[id(tensor)] = aliases.get(id(tensor), 0) + 1
        if key in names:
            sources.setdefault(id(tensor), (key, tensor))
    shared: dict = {}                # what was read for a tensor under several names (tied)
    with contextlib.ExitStack() as files:
        opened = _Opener(files)
        for prefix, module in model.named_modules():
            for name, tensor in _tensors(module, recurse=False):
                if id(tensor) not in sources:
                    continue                             # a buffer initialized above
                value = shared.get(id(tensor))
                if value is None:
                    key = sources[id(tensor)][0]
                    value = read_float32(opened(names[key]), key)
                    if isinstance(tensor, nn.Parameter):
                        value = nn.Parameter(value, requires_grad=tensor.requires_grad)
                    if aliases[id(tensor)] > 1:
                        shared[id(tensor)] = value
                where = module._parameters if name in module._parameters else module._buffers
                where[name] = value
            if takes(module):
                quantize_linear(module, quantization)   # its float32 weight dropped here
    _read_generation_config(model, folder)
    return model.eval()


class _Opener:
    """Each safetensors file opened once (mapped), closed with ``files``."""

    def __init__(self, files: contextlib.ExitStack):
        self.files, self.opened = files, {}

    def __call__(self, path: Path):
        from safetensors import safe_open

        if path not in self.opened:
            self.opened[path] = self.files.enter_context(safe_open(str(path), framework="pt"))
        return self.opened[path]


def _tensors(module: nn.Module, recurse: bool = True):
    """(name, tensor) of every parameter and buffer of ``module``, a tied one under each of its
    names."""
    yield from module.named_parameters(recurse=recurse, remove_duplicate=False)
    yield from ((name, buffer) for name, buffer in
                module.named_buffers(recurse=recurse, remove_duplicate=False)
                if buffer is not None)


def _persistent_buffers(model: nn.Module) -> set:
    """The names of the buffers ``model``'s state dict holds (what a checkpoint stores)."""
    kept = set()
    for prefix, module in model.named_modules():
        for name, buffer in module.named_buffers(recurse=False):
            if buffer is not None and name not in module._non_persistent_buffers_set:
                kept.add(f"{prefix}.{name}" if prefix else name)
    return kept


def _initialize_buffers(model: nn.Module, stored: set) -> None:
    """The buffers the checkpoint does not hold (rotary frequencies...) computed as
    ``from_pretrained`` computes them: made real, then transformers' ``_init_weights`` of their
    module. Filled with NaN first (or -1), so that one it leaves unset is seen
    (:class:`NotStreamable`), not used."""
    for prefix, module in model.named_modules():
        names = [name for name, buffer in module.named_buffers(recurse=False)
                 if buffer is not None and (f"{prefix}.{name}" if prefix else name) not in stored]
        if not names:
            continue
        for name in names:
            meta = module._buffers[name]
            module._buffers[name] = torch.full(meta.shape, _UNSET[meta.is_floating_point()],
                                               dtype=meta.dtype)
        with torch.no_grad():
            model._init_weights(module)
        for name in names:
            buffer = module._buffers[name]
            unset = buffer.isnan() if buffer.is_floating_point() else buffer == _UNSET[False]
            if buffer.is_meta or bool(unset.any()):
                raise NotStreamable(f"transformers' initialization leaves buffer "
                                    f"{prefix}.{name} unset")


_UNSET = {True: float("nan"), False: -1}


def _read_generation_config(model: nn.Module, folder) -> None:
    """The folder's generation_config.json, as ``from_pretrained`` reads it (else the one the
    model's config implies, set when the model was built)."""
    if (Path(folder) / "generation_config.json").exists() and \
            getattr(model, "generation_config", None) is not None:
        model.generation_config = type(model.generation_config).from_pretrained(
            folder, local_files_only=True)
