"""make test's grouping of the tests that share a module fixture (tests/worker_groups.py)."""

from types import SimpleNamespace

import worker_groups


def _item(nodeid, module="m", callspec=None, **scopes):
    defs = {name: [SimpleNamespace(scope=scope)] for name, scope in scopes.items()}
    return SimpleNamespace(nodeid=nodeid, module=SimpleNamespace(__name__=module),
                           _fixtureinfo=SimpleNamespace(name2fixturedefs=defs),
                           callspec=callspec)


def test_tests_sharing_a_module_fixture_are_one_group_directly_or_through_a_third():
    items = [_item("a", lowered="module", tmp_path="function"),
             _item("b", lowered="module", folder="module"),
             _item("c", folder="module"),
             _item("d", tmp_path="function"),
             _item("e", module="other", lowered="module")]
    groups = worker_groups.shared_fixture_groups(items)
    assert groups["a"] == groups["b"] == groups["c"]
    assert "d" not in groups                                   # no module fixture: dealt alone
    assert groups["e"] != groups["a"]                          # another module's fixture


def test_a_parametrized_module_fixture_is_a_group_per_parameter():
    first = SimpleNamespace(indices={"pte": 0})
    second = SimpleNamespace(indices={"pte": 1})
    groups = worker_groups.shared_fixture_groups(
        [_item("a", callspec=first, pte="module"), _item("b", callspec=second, pte="module"),
         _item("c", callspec=first, pte="module")])
    assert groups["a"] == groups["c"] != groups["b"]
