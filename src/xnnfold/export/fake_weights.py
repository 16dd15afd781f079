"""torch.export with the module's parameters fake while it is traced, the real ones put in the
program afterwards.

Why: a strict torch.export (dynamo) keeps a clone of every tensor it takes as an input, each
parameter included, as its "real value" (``cache_real_value_when_export``), until the trace
ends: a second copy of the weights at the export's peak (Llama-3.2-1B's dims, fp32: 5.55 GB
after the export, 10.65 GB during it). Traced over fake parameters, dynamo clones fake tensors,
which hold no data. The weights are never read while tracing a model whose shapes do not depend
on them; the program's graph is the same, and its state dict then holds the module's own
tensors, as a real-weight export's does (the .pte is the same bytes: tested).

What the swap cannot see falls back to the real-weight export, with a warning naming why, so
the program is always what ``torch.export.export`` gives:

- the trace fails over fake weights (a model that reads a weight's values while traced);
- the program holds a fake tensor that is not one of the swapped parameters' places, or a
  parameter as a constant (a weight the model also reaches outside its module tree, which the
  real trace takes as that parameter);
- a parameter put back has not the shape, dtype or stride its fake had.

The caller's module is changed only while traced: its parameters are put back in ``finally``.
"""

from __future__ import annotations

import warnings
from typing import Any, Optional

import torch
from torch import nn

from ..usage import first_line


class FakeWeightsDeclined(RuntimeError):
    """Why a program traced over fake weights is not used (the real-weight export is)."""


def export_with_fake_weights(module: nn.Module, args: tuple = (), kwargs: Optional[dict] = None,
                             **export_kwargs: Any) -> torch.export.ExportedProgram:
    """``torch.export.export(module, args, kwargs, **export_kwargs)`` traced over fake
    parameters, its state dict the module's real ones. On any doubt (module doc), the
    real-weight export, with a warning; an export that fails with real weights too raises
    that failure, as ``torch.export.export`` would, without the warning."""
    try:
        return _fake_traced(module, args, kwargs, export_kwargs)
    except Exception as error:  # noqa: BLE001 - whatever the fake trace raises: the real one
        why = first_line(error, 240)
    # a model torch.export cannot take fails here with its own error, and no warning
    program = torch.export.export(module, args, kwargs, **export_kwargs)
    warnings.warn(f"{type(module).__name__}: exported with its real weights, not fake ones "
                  f"({why}); the export held a second copy of the weights while it traced",
                  stacklevel=2)
    return program


def _fake_traced(module, args, kwargs, export_kwargs) -> torch.export.ExportedProgram:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    mode = FakeTensorMode(shape_env=ShapeEnv(), allow_non_fake_inputs=True)
    real = dict(module.named_parameters(remove_duplicate=False))
    swapped = _swap_parameters(module, mode)
    try:
        program = torch.export.export(module, args, kwargs, **export_kwargs)
    finally:
        for table, name, tensor in swapped:
            table[name] = tensor
    _put_back(program, real)
    return program


def _swap_parameters(module: nn.Module, mode) -> list:
    """Each parameter of ``module``'s tree replaced by a fake one (a tied parameter by one
    fake, so the trace sees it tied); returns (table, name, real parameter) to put back."""
    fakes: dict = {}
    swapped: list = []
    try:
        for sub in module.modules():
            table = sub._parameters
            for name, tensor in list(table.items()):
                if tensor is None:
                    continue
                if id(tensor) not in fakes:
                    fakes[id(tensor)] = nn.Parameter(mode.from_tensor(tensor, static_shapes=True),
                                                     requires_grad=tensor.requires_grad)
                swapped.append((table, name, tensor))
                table[name] = fakes[id(tensor)]
    except BaseException:
        for table, name, tensor in swapped:
            table[name] = tensor
        raise
    return swapped


def _put_back(program: torch.export.ExportedProgram, real: dict) -> None:
    """The program's fake parameters replaced by ``real`` ({name: parameter}) in place; raises
    :class:`FakeWeightsDeclined` if what is left would not be the real-weight export's."""
    from torch._subclasses.fake_tensor import FakeTensor

    for name in list(program.state_dict):
        fake = program.state_dict[name]
        if name in real:
            _check_same_layout(name, fake, real[name])
            program.state_dict[name] = real[name]
    places = [program.state_dict, program.constants]
    for table in places:
        for name, value in table.items():
            if _holds_fake(value, FakeTensor):
                raise FakeWeightsDeclined(f"{name} is a fake tensor the swap did not put back")
    # a weight the model also reaches outside its module tree: the real trace takes it as
    # the parameter (one input), the fake one as a constant of its own (torch 2.13 raises on
    # it first; this holds if a later one does not)
    parameters = {id(tensor) for tensor in real.values()}
    for name, value in program.constants.items():
        if id(value) in parameters:
            raise FakeWeightsDeclined(f"constant {name} is a parameter reached outside the "
                                      "module tree")


def _check_same_layout(name: str, fake: torch.Tensor, tensor: torch.Tensor) -> None:
    from torch._subclasses.fake_tensor import FakeTensor

    plain = isinstance(fake, FakeTensor)        # else a subclass of fake inner tensors
    if (not plain and type(fake) is not type(tensor)) or fake.shape != tensor.shape or \
            fake.dtype != tensor.dtype or \
            (plain and not _is_subclass(tensor) and fake.stride() != tensor.stride()):
        raise FakeWeightsDeclined(f"{name}: traced as {type(fake).__name__} "
                                  f"{tuple(fake.shape)} {fake.dtype}, the parameter is "
                                  f"{type(tensor).__name__} {tuple(tensor.shape)} {tensor.dtype}")


def _is_subclass(tensor: torch.Tensor) -> bool:
    return type(tensor) not in (torch.Tensor, nn.Parameter)


def _holds_fake(value, fake_type) -> bool:
    """A fake tensor, or a tensor subclass (torchao's quantized weights) one of whose inner
    tensors is fake."""
    if isinstance(value, fake_type):
        return True
    flatten = getattr(value, "__tensor_flatten__", None)
    if isinstance(value, torch.Tensor) and flatten is not None:
        names, _ = flatten()
        return any(_holds_fake(getattr(value, inner), fake_type) for inner in names)
    return False
