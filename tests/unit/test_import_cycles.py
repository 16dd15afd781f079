"""The pass's modules (``src/xnnfold`` but the bench), and the whole package, import each other
without a cycle (and the test files do not shadow each other).

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

# Not the pass: the bench (and the command line's entry point, which runs the bench's cli).
OUTSIDE = ("xnnfold.bench", "xnnfold.__main__")


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


def test_the_pass_does_not_import_the_bench():
    for name, path in PASS.items():
        bench = sorted(m for m in imports_of(name, path) if m.startswith("xnnfold.bench"))
        assert not bench, f"{name} imports {bench}"


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
