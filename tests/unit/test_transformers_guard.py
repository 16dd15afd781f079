"""The zoo's torchvision guard hides a broken torchvision only while transformers imports."""

import importlib.util
import sys

import pytest

from xnnfold.export import transformers as guard
@pytest.fixture
def broken_torchvision(tmp_path, monkeypatch):
    package = tmp_path / "torchvision"
    package.mkdir()
    (package / "__init__.py").write_text(
        "raise RuntimeError('operator torchvision::nms does not exist')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [n for n in sys.modules if n.split(".")[0] == "torchvision"]:
        monkeypatch.delitem(sys.modules, name)
    return package


def test_hidden_inside_the_guard_only(broken_torchvision):
    with guard._without_broken_torchvision():
        assert sys.modules["torchvision"] is None
        assert importlib.util.find_spec("torchvision") is None
    # afterwards the process sees torchvision as before: present, and broken
    assert "torchvision" not in sys.modules
    assert importlib.util.find_spec("torchvision") is not None
    with pytest.raises(RuntimeError, match="torchvision::nms"):
        import torchvision  # noqa: F401


def test_restored_when_the_body_raises(broken_torchvision):
    with pytest.raises(KeyError):
        with guard._without_broken_torchvision():
            raise KeyError("x")
    assert "torchvision" not in sys.modules


def test_nothing_hidden_when_torchvision_loads(tmp_path, monkeypatch):
    package = tmp_path / "torchvision"
    package.mkdir()
    (package / "__init__.py").write_text("LOADED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "torchvision", raising=False)
    try:
        with guard._without_broken_torchvision():
            assert sys.modules["torchvision"].LOADED
    finally:
        # not monkeypatch.delitem: its teardown would put the fake module back for the tests
        # that run after this one in the process (transformers then finds a torchvision
        # without its submodules)
        sys.modules.pop("torchvision", None)
