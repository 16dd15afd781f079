"""The bench's one-off measurements, run as ``xnnfold bench NAME [ARGS]``.

Each module is a script (``python -m xnnfold.bench.scripts.NAME`` works too); the command runs
it in a process of its own, as its author wrote it to run. A script parses its arguments
before it imports torch (:func:`parser`), so that ``--help`` answers at once; its docstring's
first paragraph is its line in ``xnnfold bench --help`` (read from the file, not imported).
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import re
from pathlib import Path

# command name -> module, in the order ``xnnfold bench --help`` lists them
SCRIPTS = {
    "lowering-time": "lowering_time",
    "decoder-stack-memory": "decoder_stack_memory",
    "tied-head": "tied_head",
    "attention-glue": "attention_glue",
    "tied-models": "tied_models",
    "lowering-isolated": "lowering_isolated",
    "quantized-attention": "quantized_attention",
    "llm-decode": "llm_decode",
    "llm-families": "llm_families",
    "moe-decode": "moe_decode",
    "whisper": "whisper",
    "t5": "t5",
    "hf-text-length": "hf_text_length",
    "llm-runner": "llm_runner",
    "llm-folder": "llm_folder",
    "transformers-sweep": "transformers_sweep",
    "optimum-multimodal": "optimum_multimodal",
}


def summary(name: str) -> str:
    """The first paragraph of script ``name``'s docstring, in one line (its source parsed, not
    imported)."""
    spec = importlib.util.find_spec(f"{__name__}.{SCRIPTS[name]}")
    try:
        with open(spec.origin, encoding="utf-8") as source:
            doc = ast.get_docstring(ast.parse(source.read())) or ""
    except (OSError, SyntaxError):
        return ""
    return re.sub(r"\s+", " ", doc.split("\n\n")[0]).strip()


def parser(file: str, doc: str) -> argparse.ArgumentParser:
    """The argument parser of the script in ``file`` (its ``__file__``): usage ``xnnfold bench
    NAME``, the docstring as description, one-line errors, defaults in the help."""
    from ...usage import Parser

    stem = Path(file).stem
    name = next((n for n, m in SCRIPTS.items() if m == stem), stem)
    return Parser(prog=f"xnnfold bench {name}", description=doc)
