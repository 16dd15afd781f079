"""The package's layers import only the layers below them, without a cycle: the pass
(``xnnfold`` but the packages below) imports none of ``pte`` (lowering, running and comparing a
.pte), ``export``, ``models``, ``bench`` and ``cli``; the pass's tests import no ``bench``;
and the test files do not shadow each other.

The graph is read from the sources with ``ast``: every import statement counts, those under
``if TYPE_CHECKING:`` and inside functions included, so that a cycle cannot hide behind a
deferred import. A module's edge goes to the module it names and to that module's packages
(importing ``xnnfold.steps.fold.plan`` runs ``xnnfold/steps/fold/__init__.py`` first), but not
to its own packages: those are imported before it by whoever imports it.
"""

from __future__ import annotations

import ast
import importlib
import pathlib
from typing import Optional

import xnnfold

# The layers above the pass, each importing only itself and the layers before it; the command
# line (and its entry point) may import any of them.
LAYERS = ("xnnfold.pte", "xnnfold.export", "xnnfold.models", "xnnfold.bench")
OUTSIDE = (*LAYERS, "xnnfold.cli", "xnnfold.__main__")
# The test files of the bench and the command line: the only ones that may import the bench.
BENCH_TESTS = ("test_bench.py", "test_cli.py", "test_report_output.py", "test_command_line.py",
               "test_compare.py", "test_bench_llm_tables.py", "test_bench_llm_folder.py",
               "test_transformers_sweep.py", "test_bench_runner_real.py", "test_timed_exports.py")


def modules_under(root: pathlib.Path, package: str, outside=OUTSIDE) -> dict:
    """Module name -> source file, for every module of ``package`` (rooted at ``root``) but
    those ``outside``."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        name = ".".join(parts)
        if not any(name == o or name.startswith(o + ".") for o in outside):
            found[name] = path
    return found


def _ancestors(name: str) -> list:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _named(statement, package: str) -> list:
    """The modules an import statement names (a name it imports may be a module, or not)."""
    if isinstance(statement, ast.Import):
        return [alias.name for alias in statement.names]
    if statement.level:
        base = package.split(".")
        base = base[:len(base) - statement.level + 1]
        base = ".".join(base + ([statement.module] if statement.module else []))
    else:
        base = statement.module
    return [base] + [f"{base}.{alias.name}" for alias in statement.names]


def imports_of(name: str, path: pathlib.Path) -> set:
    """The modules (and their packages) that module ``name``, at ``path``, imports, but its
    own packages."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    own = set(_ancestors(name)) | {name}
    named = set()
    for statement in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(statement, (ast.Import, ast.ImportFrom)):
            for target in _named(statement, package):
                named |= {*_ancestors(target), target}
    return named - own


def import_graph(modules: dict) -> dict:
    """Module name -> the modules of ``modules`` it imports."""
    return {name: imports_of(name, path) & set(modules) for name, path in modules.items()}


def find_cycle(graph: dict) -> Optional[list]:
    """One cycle of ``graph`` as ``[a, b, ..., a]``, or None."""
    done, path = set(), []
    on_path: dict = {}

    def visit(node) -> Optional[list]:
        on_path[node] = len(path)
        path.append(node)
        for following in sorted(graph.get(node, ())):
            if following in on_path:
                return path[on_path[following]:] + [following]
            if following not in done:
                cycle = visit(following)
                if cycle:
                    return cycle
        path.pop()
        del on_path[node]
        done.add(node)
        return None

    for start in sorted(graph):
        if start not in done:
            cycle = visit(start)
            if cycle:
                return cycle
    return None


PASS = modules_under(pathlib.Path(xnnfold.__file__).parent, "xnnfold")


def test_the_pass_has_no_import_cycle():
    assert len(PASS) > 30, sorted(PASS)
    cycle = find_cycle(import_graph(PASS))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_whole_package_has_no_import_cycle():
    """The bench too (it was ``models`` <-> ``zoo`` and ``hf`` <-> ``hf_parts`` /
    ``hf_generation``)."""
    everything = modules_under(pathlib.Path(xnnfold.__file__).parent, "xnnfold", outside=())
    assert len(everything) > len(PASS) + 20, sorted(set(everything) - set(PASS))
    cycle = find_cycle(import_graph(everything))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_every_module_of_the_pass_imports():
    for name in PASS:
        importlib.import_module(name)


def _layer(module: str) -> Optional[str]:
    return next((layer for layer in OUTSIDE if module == layer or
                 module.startswith(layer + ".")), None)


def test_each_layer_imports_only_the_layers_below_it():
    """The pass imports no layer; ``pte`` the pass only; ``export`` the pass and ``pte``; ...;
    ``cli`` anything."""
    everything = modules_under(pathlib.Path(xnnfold.__file__).parent, "xnnfold", outside=())
    wrong = []
    for name, path in everything.items():
        layer = _layer(name)
        if layer in ("xnnfold.cli", "xnnfold.__main__"):
            continue
        allowed = LAYERS[:LAYERS.index(layer) + 1] if layer else ()
        for target in imports_of(name, path) & set(everything):
            above = _layer(target)
            if above is not None and above not in allowed:
                wrong.append(f"{name} imports {target}")
    assert not wrong, "\n".join(sorted(wrong))


def test_the_pass_tests_do_not_import_the_bench():
    tests = pathlib.Path(__file__).resolve().parents[1]
    wrong = []
    for path in sorted(tests.rglob("*.py")):
        if path.name in BENCH_TESTS:
            continue
        for statement in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(statement, (ast.Import, ast.ImportFrom)):
                named = _named(statement, "")
                if any(n == "xnnfold.bench" or n.startswith("xnnfold.bench.") for n in named):
                    wrong.append(f"{path.relative_to(tests)}:{statement.lineno}")
    assert not wrong, wrong


def _package(tmp_path, files: dict) -> dict:
    root = tmp_path / "pkg"
    for relative, text in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text)
    return modules_under(root, "pkg")


def test_a_cycle_behind_type_checking_is_found(tmp_path):
    """The check can fail: ``rules`` <-> ``steps/fold/plan`` as it was (plan importing
    ``Decline`` for its annotations only)."""
    modules = _package(tmp_path, {
        "__init__.py": "",
        "rules/__init__.py": "from ..steps.fold.plan import Group\n",
        "steps/__init__.py": "",
        "steps/fold/__init__.py": "from .evaluate import run\n",
        "steps/fold/evaluate.py": "",
        "steps/fold/plan.py": "from typing import TYPE_CHECKING\n"
                              "if TYPE_CHECKING:\n    from ...rules import Decline\n",
    })
    assert find_cycle(import_graph(modules)) == ["pkg.rules", "pkg.steps.fold.plan",
                                                 "pkg.rules"]


def test_a_cycle_through_a_package_init_is_found(tmp_path):
    """Importing a submodule runs its package first: ``a`` imports ``b.c``, ``b``'s
    ``__init__`` imports ``a``; a package importing its own submodules is no cycle."""
    modules = _package(tmp_path, {
        "__init__.py": "",
        "a.py": "from .b.c import thing\n",
        "b/__init__.py": "from .c import thing\nfrom .. import a\n",
        "b/c.py": "from . import d\n",
        "b/d.py": "",
    })
    assert find_cycle(import_graph(modules)) == ["pkg.a", "pkg.b", "pkg.a"]
    del modules["pkg.a"]
    assert find_cycle(import_graph(modules)) is None


def test_no_two_test_files_share_a_name():
    """pytest imports test files by their base name (``rootdir`` mode, no ``__init__.py``): two
    files of one name, ``tests/x.py`` and ``tests/unit/x.py``, fail the whole suite's
    collection ("import file mismatch") while each passes alone."""
    tests = pathlib.Path(__file__).resolve().parents[1]
    seen: dict = {}
    for path in sorted(tests.rglob("test_*.py")):
        seen.setdefault(path.name, []).append(str(path.relative_to(tests)))
    shared = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not shared, shared
