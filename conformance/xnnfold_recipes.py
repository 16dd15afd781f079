"""pytest plugin: executorch's own recipe tests with xnnfold's recipe provider in XNNPACK's place.

    PYTHONPATH=src:conformance python -m pytest -p xnnfold_recipes --xnnfold-recipes \\
        .venv/lib/python3.11/site-packages/executorch/backends/xnnpack/test/recipes

``backends/xnnpack/test/recipes/test_xnnpack_recipes.py`` registers ``XNNPACKRecipeProvider()``
in ``executorch.export.recipe_registry`` before each test, and builds it directly in two. With
``--xnnfold-recipes`` this plugin binds, in every loaded ``executorch*`` module (the test module
included) whose global ``XNNPACKRecipeProvider`` is XNNPACK's class, a subclass of
:class:`xnnfold.export.recipes.XnnfoldRecipeProvider` serving the backend name ``"xnnpack"``: every
``ExportRecipe.get_recipe(XNNPackRecipeType...)`` of the tests then lowers with
``xnnfold.XnnpackPartitioner``; the rest of the lowering (the tester, other partitioners) is
stock. Without the option it only counts. Nothing on disk changes; the bindings are put back at
the end, and the registry's ``"xnnpack"`` entry gets XNNPACK's own provider again.

The terminal summary says how many recipes each provider class made and how many lowerings
ran xnnfold's fold (``transform_for_pre_decomposition``); in swap mode the session fails
(exit status 3) if xnnfold's provider made no recipe or its fold never ran.
"""

from __future__ import annotations

import sys
from collections import Counter

NAME = "XNNPACKRecipeProvider"
SWAP_FAILED_EXIT = 3

_patched: list = []                # (module, attribute, original)
_counts: Counter = Counter()


def pytest_addoption(parser):
    parser.getgroup("xnnfold").addoption(
        "--xnnfold-recipes", action="store_true", default=False,
        help="serve executorch's XNNPACK recipe types with xnnfold's recipe provider")


def _swap(stock, replacement) -> None:
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "executorch" or name.startswith("executorch.")):
            continue
        if getattr(module, "__dict__", {}).get(NAME) is stock:
            _patched.append((module, NAME, stock))
            setattr(module, NAME, replacement)


def _count(cls, method: str, key: str) -> None:
    original = cls.__dict__[method]

    def counted(self, *args, **kwargs):
        _counts[key] += 1
        return original(self, *args, **kwargs)

    _patched.append((cls, method, original))
    setattr(cls, method, counted)


def pytest_configure(config):
    from executorch.backends.xnnpack.recipes import xnnpack_recipe_provider

    import xnnfold
    from xnnfold.export.recipes import XnnfoldRecipeProvider

    stock = xnnpack_recipe_provider.XNNPACKRecipeProvider
    config._xnnfold_recipes = {"swap": config.getoption("--xnnfold-recipes"), "stock": stock}
    _count(stock, "create_recipe", "recipes made by XNNPACK's provider class (or a subclass)")
    hook = xnnfold.XnnpackPartitioner.__dict__["transform_for_pre_decomposition"]
    _patched.append((xnnfold.XnnpackPartitioner, "transform_for_pre_decomposition", hook))

    def counting_hook(self, program):
        _counts["lowerings through xnnfold's fold"] += 1
        return hook(self, program)

    xnnfold.XnnpackPartitioner.transform_for_pre_decomposition = counting_hook
    if not config._xnnfold_recipes["swap"]:
        return

    class AsXnnpack(XnnfoldRecipeProvider):
        """xnnfold's provider under XNNPACK's backend name, built as the tests build theirs."""

        def __init__(self):
            super().__init__("xnnpack")

        def create_recipe(self, recipe_type, **kwargs):
            _counts["recipes made by xnnfold's provider"] += 1
            return super().create_recipe(recipe_type, **kwargs)

    config._xnnfold_recipes["swapped"] = AsXnnpack
    _swap(stock, AsXnnpack)


def pytest_collection_finish(session):
    state = getattr(session.config, "_xnnfold_recipes", None)
    if state and state["swap"]:
        _swap(state["stock"], state["swapped"])    # the test module, imported by collection


def pytest_sessionfinish(session, exitstatus):
    state = getattr(session.config, "_xnnfold_recipes", None)
    if state and state["swap"] and session.testscollected and not \
            session.config.option.collectonly and not (
                _counts["recipes made by xnnfold's provider"]
                and _counts["lowerings through xnnfold's fold"]):
        session.exitstatus = SWAP_FAILED_EXIT


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    state = getattr(config, "_xnnfold_recipes", None)
    if state is None:
        return
    terminalreporter.section(f"xnnfold recipes ({'swapped' if state['swap'] else 'stock'})")
    for key, value in sorted(_counts.items()):
        terminalreporter.write_line(f"{key}: {value}")


def pytest_unconfigure(config):
    for obj, attribute, value in reversed(_patched):
        setattr(obj, attribute, value)
    _patched.clear()
    state = getattr(config, "_xnnfold_recipes", None)
    if state is not None:
        from executorch.export import recipe_registry
        recipe_registry.register_backend_recipe_provider(state["stock"]())
