"""make test's two workers: tests that share a module-scoped fixture run on one worker.

A module fixture is mostly a lowering (5-60 s here). With tests dealt one by one, a module
whose tests land on both workers builds it twice: LLaVA's was built in both (27 s and 39 s of
one run). pytest-xdist's ``--dist loadgroup`` would keep marked tests together, but with
pytest 9.2 it cannot: it renames the tests through ``Item._nodeid``, which pytest no longer
reads. So the workers (which collect) write the groups to a file, and the scheduler (which
does not) reads it: xdist's own scope scheduling, with our groups as the scopes."""

from __future__ import annotations

import json
import os
import tempfile

GROUPS_ENV = "XNNFOLD_TEST_GROUPS"


def shared_fixture_groups(items) -> dict:
    """{nodeid: group} for the tests that use a module-scoped fixture: two tests that share
    one (the same fixture with the same parameter) are in one group, directly or through a
    third."""
    parent = {}

    def root(key):
        while parent.setdefault(key, key) != key:
            key = parent[key]
        return key

    uses = {}
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        callspec = getattr(item, "callspec", None)
        keys = []
        for name, defs in sorted(getattr(info, "name2fixturedefs", {}).items()):
            if defs[-1].scope == "module":
                index = callspec.indices.get(name) if callspec is not None else None
                keys.append(f"{item.module.__name__}:{name}"
                            + ("" if index is None else f"[{index}]"))
        for key in keys[1:]:
            parent[root(key)] = root(keys[0])
        if keys:
            uses[item.nodeid] = keys[0]
    return {nodeid: root(key) for nodeid, key in uses.items()}


def start(config) -> None:
    """On the controller, before the workers start: where they will write the groups."""
    if not hasattr(config, "workerinput") and config.getvalue("dist") == "loadgroup":
        os.environ[GROUPS_ENV] = os.path.join(tempfile.mkdtemp(prefix="xnnfold-groups-"),
                                              "groups.json")


def write(items) -> None:
    """On a worker, once collected (both workers collect the same tests: same file)."""
    path = os.environ.get(GROUPS_ENV)
    if path and os.environ.get("PYTEST_XDIST_WORKER"):
        fd, temporary = tempfile.mkstemp(dir=os.path.dirname(path))
        with os.fdopen(fd, "w") as out:
            json.dump(shared_fixture_groups(items), out)
        os.replace(temporary, path)


def make_scheduler(config, log):
    """xdist's scope scheduling (whole scopes to a worker, the largest first) whose scopes are
    the groups; a test in no group is a scope of its own."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedFixtureScheduling(LoadScopeScheduling):
        _groups = None

        def _split_scope(self, nodeid: str) -> str:
            if self._groups is None:                   # written once all workers collected
                with open(os.environ[GROUPS_ENV]) as groups:
                    self._groups = json.load(groups)
            return self._groups.get(nodeid, nodeid)

    return SharedFixtureScheduling(config, log)
