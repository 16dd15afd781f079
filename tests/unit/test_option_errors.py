"""Errors about options: ``xnnfold.export`` names its functions' keyword arguments, the
command line the same errors' flags (:class:`xnnfold.usage.OptionError`)."""

import ast
import json
import re
from pathlib import Path

import pytest

from xnnfold import cli
from xnnfold.cli.main import as_flag
from xnnfold.export.hf import plan as hf_plan
from xnnfold.usage import OptionError

EXPORT = Path(hf_plan.__file__).parents[1]


def _llama_folder(tmp_path) -> str:
    (tmp_path / "config.json").write_text(json.dumps(
        {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 64,
         "max_position_embeddings": 32}))
    return str(tmp_path)


@pytest.mark.parametrize("keyword, flag", [
    ("max_cache", "--max-cache"), ("cache=False", "--no-cache"),
    ("llm_kernels=True", "--llm-kernels"), ("attention=eager", "--attention eager")])
def test_keywords_as_flags(keyword, flag):
    assert as_flag(keyword) == flag
    assert OptionError(f"`{keyword}` 1: bad").spelled(as_flag) == f"{flag} 1: bad"
    assert str(OptionError(f"`{keyword}` 1: bad")) == f"{keyword} 1: bad"


def test_the_api_names_keywords_and_the_command_its_flags(tmp_path, capsys):
    folder = _llama_folder(tmp_path)
    with pytest.raises(OptionError) as raised:
        hf_plan.plan(folder, 8, False, max_prefill=4, llm_kernels=True)
    assert str(raised.value) == ("max_prefill and llm_kernels=True: options of a KV cache; "
                                 "cache=False exports without one")
    with pytest.raises(OptionError) as raised:
        hf_plan.plan(folder, 8, True, max_cache=1)              # cache_sizes' own words
    assert str(raised.value) == "max_cache 1: a cache needs at least 2 rows"

    argv = ["hf", folder, "-o", str(tmp_path / "m.pte")]
    assert cli.main([*argv, "--no-cache", "--max-prefill", "4", "--llm-kernels"]) == 2
    assert capsys.readouterr().err.strip().endswith(
        "--max-prefill and --llm-kernels: options of a KV cache; --no-cache exports without "
        "one")
    assert cli.main([*argv, "--max-cache", "1"]) == 2
    assert capsys.readouterr().err.strip().endswith("--max-cache 1: a cache needs at least 2 "
                                                    "rows")


def _strings(node) -> list:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant)
            and isinstance(n.value, str)]


def test_export_writes_no_flag_into_an_error():
    """Each raise of xnnfold.export, and each step it names for failing_as_usage: no
    ``--flag`` (a whole command quoted, ```xnnfold lower --quantize```, is a command)."""
    leaks = []
    for path in sorted(EXPORT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            said = node.exc if isinstance(node, ast.Raise) else node if isinstance(
                node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) \
                == "failing_as_usage" else None
            if said is None:
                continue
            text = re.sub(r"`xnnfold [^`]*`", "", "".join(_strings(said)))
            if re.search(r"(?<![\w-])--[a-z]", text):
                leaks.append(f"{path.relative_to(EXPORT)}:{node.lineno}: {text[:80]}")
    assert not leaks, leaks
