"""The command line's arguments checked before any work: paths to write and read, model names,
variants, a Hugging Face folder's config. Nothing here imports torch (a leaf of the standard
library, :mod:`xnnfold.models.catalog` and :mod:`xnnfold.pte.variants`), so a bad argument
is one line and exit 2 in a fraction of a second, not after the imports or the lowering.
Each check raises :class:`~xnnfold.models.sources.UsageError`."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from ..models import catalog
from ..models.sources import FACTORY_SPEC, is_user_spec, missing_module, pt2_file
from ..usage import UsageError
from ..pte.variants import VARIANTS


def output_file(path: str, what: str = "the .pte to write") -> None:
    """``path`` can be written: not a folder, in a folder that exists and takes a new file
    (tried: a file created there and removed; an existing file is opened for appending,
    not changed)."""
    file = Path(path)
    if file.is_dir():
        raise UsageError(f"{path}: is a folder; -o takes {what} (e.g. {file / 'model.pte'})")
    folder = file.parent
    if not folder.exists():
        raise UsageError(f"{path}: folder {folder} does not exist")
    if not folder.is_dir():
        raise UsageError(f"{path}: {folder} is not a folder")
    existed = file.exists()
    try:
        with open(file, "ab"):
            pass
    except OSError as error:
        raise UsageError(f"{path}: cannot be written ({error.strerror})")
    finally:
        if not existed:
            file.unlink(missing_ok=True)


def output_folder(path: str) -> None:
    """``path`` is a folder that exists and takes files, or can be made (its nearest existing
    parent takes a new folder)."""
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{path}: is a file, not a folder")
    existing = folder
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"{path}: {existing} is not a folder")
    try:
        tempfile.TemporaryFile(dir=existing).close()
    except OSError as error:
        raise UsageError(f"{path}: cannot write in {existing} ({error.strerror})")


# executorch's extended header (exir/_serialize/_program.py, ``_ExtendedHeader``), after the
# flatbuffer's root offset and identifier: magic, its length, then little-endian uint64s
# program_size, segment_base_offset, segment_data_size; a .pte is at least as long as what
# it says (the segments end the file).
_EXTENDED_HEADER = b"eh00"


def pte_file(path: str) -> None:
    """``path`` is a file that starts as an ExecuTorch program does (its identifier) and is as
    long as its header says: random bytes, another kind of file and a truncated .pte refused
    here, in a few milliseconds, not after the runtime's imports (5 s and more). A corrupt
    program with a sound header is still the runtime's verifier's to refuse."""
    from ..pte.runner import identifier_problem          # a module of the standard library only

    file = Path(path)
    if not file.is_file():
        raise UsageError(f"{path}: " + ("is a folder, not a .pte" if file.is_dir() else
                                              "no such file"))
    try:
        with open(file, "rb") as opened:
            head = opened.read(40)
    except OSError as error:
        raise UsageError(f"{path}: cannot be read ({error.strerror})")
    problem = identifier_problem(head)
    if problem is not None:
        raise UsageError(f"{path}: {problem}")
    if head[8:12] == _EXTENDED_HEADER and len(head) == 40:
        def number(start: int) -> int:
            return int.from_bytes(head[start:start + 8], "little")

        with_data_size = int.from_bytes(head[12:16], "little") >= 32   # the header's length
        size = file.stat().st_size
        said = max(number(16), number(24) + (number(32) if with_data_size else 0))
        if size < said:
            raise UsageError(f"{path}: a truncated ExecuTorch program ({size:,} bytes; "
                             f"its header says {said:,})")


def is_pt2(spec: str) -> bool:
    """``spec`` names a file (to be a .pt2), not a factory nor a built-in model."""
    return not (FACTORY_SPEC.match(spec) and not Path(spec).exists()) and \
        not (spec in catalog.KNOWN and not Path(spec).exists())


def program(spec: str) -> None:
    """``spec`` is a ``package.module:function`` factory whose module is there (its import
    and function are checked when it is built), a built-in model or an existing .pt2 file."""
    _not_a_file_factory(spec)
    if not is_pt2(spec):
        if FACTORY_SPEC.match(spec):
            missing = missing_module(spec, str(Path.cwd()))
            if missing:
                raise UsageError(f"{spec}: {missing}")
        return
    if not Path(spec).exists() and not spec.endswith(".pt2"):
        raise UsageError(f"{spec}: no such file, nor package.module:function, nor a "
                         "built-in model (xnnfold report --help)")
    pt2_file(spec)


def _not_a_file_factory(spec: str) -> None:
    """A factory given by its file (``mymodel.py:build``, ``src/mymodel.py:build``): refused
    with the spelling that works, the module's name from the folder that holds it (Python
    read ``mymodel.py`` as module ``py`` of a package ``mymodel``)."""
    file, _, function = spec.rpartition(":")
    if not file.endswith(".py") or not function.isidentifier():
        return
    path = Path(file)
    spelled = f"{path.stem}:{function}"
    where = "" if path.parent.resolve() == Path.cwd().resolve() else \
        f", run from {path.parent} (the current folder is importable) or with " \
        f"PYTHONPATH={path.parent}"
    absent = "" if path.is_file() else f" (and there is no file {file})"
    raise UsageError(f"{spec}: a factory is module:function, the module by its name, not its "
                     f"file: {spelled}{where}{absent}")


def models(names: list) -> None:
    """Each of ``names`` a built-in or zoo model, a factory or a .pt2 file."""
    for name in names:
        if name in catalog.KNOWN:
            continue
        if not is_user_spec(name):
            raise UsageError(catalog.unknown_model_message(name))
        program(name)


def variants(names: list) -> None:
    unknown = [v for v in names if v not in VARIANTS]
    if unknown or not names:
        raise UsageError(f"unknown variant {(unknown or [''])[0]!r}; known: "
                         f"{', '.join(VARIANTS)}")


def at_least(option: str, value: int, least: int = 1) -> None:
    if value is not None and value < least:
        raise UsageError(f"{option} {value}: must be at least {least}")


# The config keys of a model's longest token sequence: a decoder-only LM's, Whisper's decoder's.
_POSITIONS = ("max_position_embeddings", "n_positions", "n_ctx", "max_target_positions")


def hf_folder(folder: str, tokens: int) -> None:
    """A folder ``save_pretrained`` wrote: its config.json readable, and ``tokens`` within the
    positions the config gives (read from the JSON alone: no transformers import)."""
    path = Path(folder)
    if not path.is_dir():
        raise UsageError(f"{folder}: no such folder" if not path.exists() else
                         f"{folder}: not a folder (give the folder save_pretrained wrote)")
    config_file = path / "config.json"
    if not config_file.is_file():
        raise UsageError(f"{folder}: no config.json (save the model with save_pretrained)")
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as error:
        raise UsageError(f"{config_file}: not readable as JSON ({error})")
    if not isinstance(config, dict):
        raise UsageError(f"{config_file}: not a model config (a JSON object)")
    at_least("--tokens", tokens)
    for key in _POSITIONS:
        positions = config.get(key)
        if isinstance(positions, int) and tokens > positions:
            raise UsageError(f"--tokens {tokens}: the model takes at most {positions} "
                             f"({key} in {config_file})")

