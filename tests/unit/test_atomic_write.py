"""A .pte or .ptd is written whole or not at all (:mod:`xnnfold.pte.files`): an interrupted
write leaves nothing under the output name (or its old contents) and no temporary; every write
site of the command line and the export goes through it."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from xnnfold.pte import files
from xnnfold.pte.files import partial_path, write_all_atomically, write_atomically

SRC = Path(__file__).resolve().parents[2] / "src" / "xnnfold"


def interrupted_after(count: int):
    """A writer that writes ``count`` bytes, then is interrupted (Ctrl-C)."""
    def writer(file):
        file.write(b"x" * count)
        file.flush()
        raise KeyboardInterrupt
    return writer


class ProgramManager:
    """executorch's ExecutorchProgramManager as the helper uses it: write_to_file(file)."""

    def __init__(self, data: bytes):
        self.data = data

    def write_to_file(self, file) -> None:
        file.write(self.data[:3])
        file.write(self.data[3:])


def test_an_interrupted_write_leaves_no_file_and_no_temporary(tmp_path):
    output = tmp_path / "model.pte"
    with pytest.raises(KeyboardInterrupt):
        write_atomically(output, interrupted_after(1000))
    assert list(tmp_path.iterdir()) == []


def test_an_interrupted_write_leaves_the_old_file_as_it_was(tmp_path):
    output = tmp_path / "model.pte"
    output.write_bytes(b"old program")
    os.chmod(output, 0o640)
    with pytest.raises(KeyboardInterrupt):
        write_atomically(output, interrupted_after(1000))
    assert output.read_bytes() == b"old program"
    assert [p.name for p in tmp_path.iterdir()] == ["model.pte"]
    write_atomically(output, b"new program")          # the old file's mode kept
    assert output.read_bytes() == b"new program" and output.stat().st_mode & 0o777 == 0o640


def test_bytes_a_program_manager_and_a_writer_are_written_whole(tmp_path):
    write_atomically(tmp_path / "a.pte", b"\x00\x01abc")
    write_atomically(tmp_path / "b.pte", ProgramManager(b"streamed program"))
    write_atomically(str(tmp_path / "c.ptd"), lambda file: file.write(b"table"))
    assert [(p.name, p.read_bytes()) for p in sorted(tmp_path.iterdir())] == [
        ("a.pte", b"\x00\x01abc"), ("b.pte", b"streamed program"), ("c.ptd", b"table")]


def test_a_pte_and_its_ptd_take_their_names_only_once_both_are_whole(tmp_path):
    pte, ptd = tmp_path / "whisper.pte", tmp_path / "whisper.ptd"
    pte.write_bytes(b"old pte")
    with pytest.raises(OSError):
        write_all_atomically({pte: b"new pte", ptd: lambda file: _disk_full(file)})
    assert pte.read_bytes() == b"old pte" and not ptd.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["whisper.pte"]


def _disk_full(file):
    file.write(b"half a table")
    raise OSError(28, "No space left on device")


def test_a_symbolic_link_keeps_pointing_at_the_written_file(tmp_path):
    target, link = tmp_path / "real.pte", tmp_path / "link.pte"
    target.write_bytes(b"old")
    link.symlink_to(target)
    write_atomically(link, b"new")
    assert link.is_symlink() and target.read_bytes() == b"new"


@pytest.mark.skipif(os.name != "posix", reason="a process asked whether it runs: POSIX")
def test_a_killed_process_s_temporary_is_removed_by_the_next_write(tmp_path):
    output = tmp_path / "model.pte"
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    abandoned = partial_path(output, int(gone.stdout))
    running = partial_path(output, os.getppid())      # another export of the same name
    other = partial_path(tmp_path / "other.pte", int(gone.stdout))
    for path in (abandoned, running, other):
        path.write_bytes(b"half")
    write_atomically(output, b"program")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["model.pte", running.name, other.name])


def test_what_is_not_data_is_refused_and_leaves_nothing(tmp_path):
    with pytest.raises(TypeError, match="not int"):
        write_atomically(tmp_path / "x.pte", 5)
    assert list(tmp_path.iterdir()) == []


# the command line's and the export's own writes of a file the user named
_WRITE = re.compile(r"\.write_bytes\(|open\([^)]*['\"]w|\.write_to_file\(|shutil\.copy")
_NOT_OUTPUTS = {  # writes to a temporary or a copy of the tokenizer, not a .pte/.ptd
    "export/llm/export.py": "tempfile.TemporaryFile",
    "export/llm/text.py": "shutil.copyfile(source, destination / source.name)",
    "export/hf/audio.py": "shutil.copyfile(source, target)",   # Voxtral's tekken.json
}


def test_every_pte_write_of_the_command_line_and_the_export_goes_through_the_helper():
    found = []
    for folder in ("cli", "export"):
        for path in sorted((SRC / folder).rglob("*.py")):
            text = path.read_text()
            relative = path.relative_to(SRC).as_posix()
            if _WRITE.search(text) and _NOT_OUTPUTS.get(relative, "\0") not in text:
                found.append(relative)
    assert found == []


def test_lower_interrupted_while_writing_leaves_no_pte(tmp_path, monkeypatch):
    """``xnnfold lower`` through the helper: interrupted half-way through the .pte's bytes,
    the name holds nothing (written with write_bytes, it would hold the whole .pte)."""
    from xnnfold.cli import main

    (tmp_path / "tinymodel.py").write_text(
        "import torch\n\ndef build():\n    torch.manual_seed(0)\n"
        "    return torch.nn.Linear(4, 3), (torch.randn(2, 4),)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))

    def half_then_interrupted(file, data):
        file.write(bytes(data)[:len(data) // 2])
        raise KeyboardInterrupt

    monkeypatch.setattr(files, "_write", half_then_interrupted)
    assert main(["lower", "tinymodel:build", "-o", "out.pte"]) == 130
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "__pycache__") == [
        "tinymodel.py"]
