"""Where a model comes from: a built-in or zoo name, the user's factory, or a saved .pt2.

``xnnfold report``, ``lower`` and ``explain`` take any of the three. The report lowers each
variant in a process of its own (:mod:`xnnfold.pte.isolated`), which must rebuild the model
there: a :class:`ModelSource` is what crosses the process boundary (a few strings), and
:meth:`ModelSource.build` rebuilds the :class:`~xnnfold.models.Case` on either side.

- ``package.module:function``: the function returns ``(module, example_inputs)`` or
  ``(module, example_inputs, dynamic_shapes)``; the caller's folder is importable, as with
  ``python -m``.
- ``model.pt2``: a program saved with ``torch.export.save``; its saved example inputs are the
  report's inputs.
- ``quantize="dynamic"|"static"``: the XNNPACK PT2E quantizer (per channel) runs on the model
  first, calibrated on the example inputs; the converted module is the model.

Bad input raises :class:`UsageError`: one line naming the problem.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import logging
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..usage import UsageError, first_line

QUANTIZE = ("dynamic", "static")
FACTORY_SPEC = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def is_user_spec(spec: str) -> bool:
    """A factory (``package.module:function``) or a ``.pt2`` path, not a built-in name."""
    return bool(FACTORY_SPEC.match(spec)) or spec.endswith(".pt2") or os.sep in spec


@dataclass(frozen=True)
class ModelSource:
    """A model by name, factory spec or .pt2 path; picklable, so a child process rebuilds it."""

    spec: str
    quantize: Optional[str] = None
    cwd: Optional[str] = None        # the caller's folder: where a factory's module is found

    @classmethod
    def of(cls, spec: str, quantize: Optional[str] = None) -> "ModelSource":
        if quantize not in (None, *QUANTIZE):
            raise UsageError(f"--quantize {quantize}: expected one of {', '.join(QUANTIZE)}")
        if spec.endswith(".pt2") or (not FACTORY_SPEC.match(spec) and Path(spec).exists()):
            spec = str(Path(spec).resolve())
        return cls(spec, quantize, os.getcwd())

    @property
    def user(self) -> bool:
        return is_user_spec(self.spec)

    @property
    def name(self) -> str:
        """How the report names it: the spec as given (a .pt2 by its file name)."""
        base = Path(self.spec).name if self.spec.endswith(".pt2") else self.spec
        return f"{base} int8-{self.quantize}" if self.quantize else base

    def build(self):
        """The :class:`~xnnfold.models.Case` (seeded for a built-in model)."""
        if not self.user:
            case = build_named(self.spec)
            return _quantized(case, self.quantize, self.name) if self.quantize else case
        if FACTORY_SPEC.match(self.spec) and not Path(self.spec).exists():
            case = _from_factory(self.spec, self.cwd)
        else:
            case = _from_pt2(self.spec)
        return _quantized(case, self.quantize, self.name) if self.quantize else case


def build_named(name: str):
    """The built-in or zoo model ``name`` (a zoo model may raise ``TransformersUnavailable``)."""
    from .builtin import ALL
    from .zoo import ZOO

    factory = ALL.get(name) or ZOO.get(name)
    if factory is None:
        raise KeyError(f"unknown model {name!r}; known: {', '.join([*ALL, *ZOO])}")
    case = factory()
    case.name = name
    return case


def export(case, module=None):
    """``case``'s exported program: the saved one of a .pt2, else ``torch.export.export`` of
    ``module`` (default: the model) with the case's inputs and dynamic shapes."""
    import torch

    if module is None and case.program is not None:
        return case.program
    printed = io.StringIO()   # a failing export prints the graph it traced; keep that out
    try:
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            return torch.export.export(_in_eval_mode(module or case.model), case.inputs,
                                       dynamic_shapes=case.dynamic_shapes)
    except Exception as error:  # noqa: BLE001 - the user's model: say what failed
        raise UsageError(f"{case.name}: torch.export failed ({first_line(error)})")


def _in_eval_mode(module):
    """``module.eval()``; a module that comes from torch.export (``ExportedProgram.module()``,
    ``convert_pt2e``'s) refuses train()/eval() (NotImplementedError): its mode is fixed in its
    graph, the module's own mode when it was exported, and it is taken as it is."""
    try:
        return module.eval()
    except NotImplementedError:
        return module


def missing_module(spec: str, folder: str) -> Optional[str]:
    """Why the module of factory ``spec`` cannot be imported, told before anything is imported
    (the factory's own import comes after torch's, 30 s later), or None when it is there:
    each package of its dotted name looked up from ``folder`` (first on ``sys.path``, as the
    factory's import puts it) and the installed packages without running their code. A
    submodule not where its package's spec says is looked up again with its package imported
    (``os.path``; a package that extends its ``__path__`` when imported)."""
    import importlib.machinery
    import importlib.util

    parts = spec.split(":")[0].split(".")
    top = parts[0]
    found = importlib.machinery.PathFinder.find_spec(top, [folder, *sys.path])
    if found is None:
        try:          # a top-level name: the meta path finders run, no module's code
            found = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            found = None
    if found is None:
        return f"no module {top} in {folder} nor among the installed packages"
    for index in range(1, len(parts)):
        name, locations = ".".join(parts[:index + 1]), found.submodule_search_locations
        found = None if locations is None else \
            importlib.machinery.PathFinder.find_spec(name, list(locations))
        if found is None:
            if folder not in sys.path:
                sys.path.insert(0, folder)           # as the factory's import will
            try:
                found = importlib.util.find_spec(name)
            except ModuleNotFoundError:
                found = None
            except Exception:  # noqa: BLE001 - the factory's import will say what fails
                return None
        if found is None:
            parent = ".".join(parts[:index])
            return f"{parent} is a module, not a package" if locations is None else \
                f"no module {name} in package {parent}"
    return None


def _from_factory(spec: str, cwd: Optional[str]):
    import torch

    from .case import Case

    module_name, function_name = spec.split(":")
    folder = cwd or str(Path.cwd())
    if folder not in sys.path:
        sys.path.insert(0, folder)    # as ``python -m`` does: the user's own modules
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # noqa: BLE001 - the user's module: say what failed
        raise UsageError(f"{spec}: cannot import {module_name} ({first_line(error)})")
    factory = getattr(module, function_name, None)
    if not callable(factory):
        raise UsageError(f"{spec}: {module_name} has no function {function_name}")
    try:
        made = factory()
    except Exception as error:  # noqa: BLE001
        raise UsageError(f"{spec}: the factory raised {first_line(error)}")
    wrong = _not_a_factory_result(made, torch.nn.Module)
    if wrong:
        raise UsageError(f"{spec}: the factory must return (torch.nn.Module, tuple of example "
                         f"inputs[, dynamic_shapes]); {wrong}")
    return Case(spec, _in_eval_mode(made[0]), made[1],
                dynamic_shapes=made[2] if len(made) == 3 else None)


def _not_a_factory_result(made, module_class) -> Optional[str]:
    """What is wrong with what a factory returned, naming the element and its type; None if
    it is ``(module, tuple of inputs[, dynamic_shapes])``."""
    def kind(value) -> str:
        return type(value).__name__

    if not isinstance(made, tuple):
        return f"it returned a {kind(made)}"
    if len(made) not in (2, 3):
        return f"it returned a tuple of {len(made)} element(s): " + \
            ", ".join(kind(v) for v in made)
    if not isinstance(made[0], module_class):
        return f"element 0 of the tuple it returned is a {kind(made[0])}, not a module"
    if not isinstance(made[1], tuple):
        return (f"element 1 of the tuple it returned is a {kind(made[1])}, not a tuple of "
                "inputs" + (" (one input x: (x,))" if hasattr(made[1], "shape") else ""))
    return None


def pt2_file(path: str) -> None:
    """``path`` names a .pt2 file that exists (what it holds: :func:`load_program`)."""
    file = Path(path)
    if not file.exists():
        raise UsageError(f"{path}: no such file")
    if file.is_dir():
        raise UsageError(f"{path}: is a directory, expected a .pt2 file")
    if file.suffix != ".pt2":
        raise UsageError(f"{path}: not a .pt2 file (save one with torch.export.save)")


class _Said(logging.Handler):
    """The first line of each warning logged to it (of its exception, if it carries one)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: list = []

    def emit(self, record) -> None:
        error = record.exc_info[1] if record.exc_info else None
        self.lines.append(first_line(error) if error is not None else
                          record.getMessage().strip().splitlines()[0])


@contextlib.contextmanager
def _warnings_said(logger_name: str):
    """The warnings ``logger_name`` logs and Python's warnings, collected while inside (the
    command line hides both from the terminal), in the list it yields."""
    import warnings

    logger, said = logging.getLogger(logger_name), _Said()
    level = logger.level
    logger.addHandler(said)
    if not logger.isEnabledFor(logging.WARNING):         # raised to ERROR by quiet()
        logger.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield said.lines
    finally:
        logger.removeHandler(said)
        logger.setLevel(level)
        said.lines.extend(str(w.message).strip().splitlines()[0] for w in caught
                          if str(w.message).strip())


def load_program(path: str):
    """A program saved with ``torch.export.save``; any problem is the file's, in one line,
    with what torch warned of while loading it (its error says "check the warnings above")."""
    import torch
    from torch.export import ExportedProgram

    pt2_file(path)
    try:
        with _warnings_said("torch.export") as said:
            program = torch.export.load(path)
    except Exception as error:  # noqa: BLE001 - any load failure is the file's problem
        said_line = first_line(error)
        if said:      # the warnings, in place of "Please check the warnings above ..."
            said_line = re.sub(r"\s*Please check the warnings above.*", "", said_line) + \
                f" torch warned: {'; '.join(dict.fromkeys(said))}"
        raise UsageError(f"{path}: cannot load the exported program ({said_line})")
    if not isinstance(program, ExportedProgram):
        raise UsageError(f"{path}: holds a {type(program).__name__}, not an ExportedProgram")
    return program


def _from_pt2(path: str):
    from .case import Case

    program = load_program(path)
    args, kwargs = program.example_inputs or ((), {})
    if not args or kwargs:
        raise UsageError(f"{path}: no positional example inputs saved with the program "
                         "(export it with example inputs, or give a factory)")
    return Case(Path(path).name, program.module(), tuple(args), program=program)


def pt2e_quantized(model, inputs: tuple, mode: str):
    """``model`` quantized by the XNNPACK PT2E quantizer (per channel, ``is_dynamic`` for
    "dynamic"), calibrated on ``inputs``: the converted module."""
    from .case import Case

    return _quantized(Case("model", model, inputs), mode, "model").model


def _quantized(case, mode: str, name: str):
    """``case`` with its model quantized by the XNNPACK PT2E quantizer (per channel), calibrated
    on its example inputs, as docs/quantized.md does by hand."""
    import torch
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer, get_symmetric_quantization_config)
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from .case import Case

    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(
        is_per_channel=True, is_dynamic=mode == "dynamic"))
    try:
        prepared = prepare_pt2e(export(case).module(), quantizer)
        with torch.no_grad():
            prepared(*case.inputs)                        # calibrate
        converted = convert_pt2e(prepared)
    except UsageError:
        raise
    except Exception as error:  # noqa: BLE001
        raise UsageError(f"{case.name}: PT2E quantization failed ({first_line(error)})")
    return Case(name, converted, case.inputs, dynamic_shapes=case.dynamic_shapes)
