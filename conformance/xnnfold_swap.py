"""pytest plugin: run executorch's own XNNPACK tests with ``xnnfold.XnnpackPartitioner``.

Load it with ``-p xnnfold_swap`` (this directory on PYTHONPATH). Without ``--xnnfold`` (or
``XNNFOLD_SWAP=1``) it only *counts* (stock mode); with it, for this pytest process only, it
puts ``xnnfold.XnnpackPartitioner`` in place of executorch's ``XnnpackPartitioner``:

* in ``executorch.backends.xnnpack.partition.xnnpack_partitioner`` (the defining module) before
  collection, so every test module's ``from ... import XnnpackPartitioner`` binds xnnfold's;
* in every already-imported ``executorch*`` module whose global ``XnnpackPartitioner`` is the
  stock class (``executorch.backends.xnnpack``, the tester module
  ``executorch.backends.xnnpack.test.tester.tester`` whose ``Partition`` and
  ``ToEdgeTransformAndLower`` stages construct the default partitioner, ...), re-checked after
  collection and before every test.

Nothing on disk changes; every attribute is put back at ``pytest_unconfigure``.

Evidence that the swap took effect, written to ``--xnnfold-report`` (JSON) and printed in the
terminal summary:

* how many times ``xnnfold.XnnpackPartitioner.transform_for_pre_decomposition`` ran (per test),
  and what each call folded/declined, and whether xnnfold fell back to stock;
* how many partitioners of each exact class were constructed (per test); in ``--xnnfold`` mode
  an instance of exactly the stock ``XnnpackPartitioner`` means a construction site was missed.

With ``--xnnfold-seed N`` every test starts from a seed of its own (N + crc32(nodeid)): the
tests draw unseeded ``torch.randn`` weights and inputs and random dynamic shapes, and some of
them (the int4 linears, qd8 ``atol=1e-1``) fail on some draws, so without it the two modes see
different draws and fail different tests. The torch RNG state is fingerprinted at the start and
end of each test either way.

In ``--xnnfold`` mode the session fails (exit status 3) if the hook never ran or a stock
``XnnpackPartitioner`` was constructed during a test.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import time
import zlib
from collections import Counter, defaultdict

import pytest

STOCK_MODULE = "executorch.backends.xnnpack.partition.xnnpack_partitioner"
NAME = "XnnpackPartitioner"
SWAP_FAILED_EXIT = 3   # pytest.ExitCode.INTERNAL_ERROR: distinct from "some tests failed" (1)


def pytest_addoption(parser):
    group = parser.getgroup("xnnfold", "xnnfold conformance swap")
    group.addoption("--xnnfold", action="store_true", default=False,
                    help="use xnnfold.XnnpackPartitioner in place of executorch's "
                         "XnnpackPartitioner (also: XNNFOLD_SWAP=1)")
    group.addoption("--xnnfold-report", default=None, metavar="PATH",
                    help="write the swap/hook/construction record to PATH (JSON)")
    group.addoption("--xnnfold-seed", type=int, default=None, metavar="N",
                    help="before each test, seed torch, random and numpy with N + crc32(nodeid): "
                         "each test then draws the same random weights, inputs and dynamic "
                         "shapes in both modes, whatever ran before it")


class _State:
    def __init__(self, swap: bool):
        self.swap = swap
        self.stock = None           # executorch's XnnpackPartitioner
        self.folding = None         # xnnfold.XnnpackPartitioner
        self.patched = []           # (object, attribute, original value)
        self.swapped_modules = []   # module names whose XnnpackPartitioner we replaced
        self.current = None         # nodeid of the running test, or None
        self.hook_calls = Counter()             # nodeid -> calls
        self.hook_records = defaultdict(list)   # nodeid -> [per-call record]
        self.constructed = defaultdict(Counter)  # nodeid -> {exact class: count}
        self.hook_errors = Counter()            # nodeid -> calls that raised
        self.rng = {}                           # nodeid -> torch RNG fingerprint at start/end
        self.started = time.time()

    def patch(self, obj, attr, value):
        self.patched.append((obj, attr, getattr(obj, attr)))
        setattr(obj, attr, value)

    def restore(self):
        for obj, attr, value in reversed(self.patched):
            setattr(obj, attr, value)
        self.patched.clear()


_state: _State | None = None


def _class_name(cls) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _swap_bindings(state: _State) -> list:
    """Replace every ``executorch*`` module global ``XnnpackPartitioner`` that is the stock class."""
    newly = []
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "executorch" or name.startswith("executorch.")):
            continue
        try:
            value = module.__dict__.get(NAME)
        except AttributeError:
            continue
        if value is state.stock:
            state.patch(module, NAME, state.folding)
            state.swapped_modules.append(name)
            newly.append(name)
    return newly


def _instrument(state: _State) -> None:
    import executorch.backends.xnnpack.partition.xnnpack_partitioner as stock_module
    state.stock = stock_module.XnnpackPartitioner

    # Count constructions by exact class, in both modes (transparent wrapper).
    stock_init = state.stock.__init__

    @functools.wraps(stock_init)
    def counting_init(self, *args, **kwargs):
        state.constructed[state.current or "<outside tests>"][_class_name(type(self))] += 1
        return stock_init(self, *args, **kwargs)

    state.patch(state.stock, "__init__", counting_init)

    if not state.swap:
        return

    import xnnfold
    state.folding = xnnfold.XnnpackPartitioner
    if state.folding is state.stock or not issubclass(state.folding, state.stock):
        raise pytest.UsageError("xnnfold.XnnpackPartitioner is not a subclass of executorch's")

    hook = state.folding.__dict__["transform_for_pre_decomposition"]

    @functools.wraps(hook)
    def counting_hook(self, exported_program):
        key = state.current or "<outside tests>"
        state.hook_calls[key] += 1
        try:
            program = hook(self, exported_program)
        except BaseException:
            state.hook_errors[key] += 1
            raise
        result = getattr(self, "last_result", None)
        if result is not None:
            statuses = Counter(o.status for o in result.operands)
            state.hook_records[key].append({
                "operands": len(result.operands),
                "folded": statuses.get("folded", 0),
                "declined": statuses.get("declined", 0),
                "plain": statuses.get("plain", 0),
                "constants": len(result.constants),
                "probe_rounds": result.probe_rounds,
                "fallback": result.fallback,
                "declines": [f"{o.gemm}.{o.role}: {o.rule}: {o.reason}"
                             for o in result.operands if o.status == "declined"],
            })
        return program

    state.patch(state.folding, "transform_for_pre_decomposition", counting_hook)
    _swap_bindings(state)   # the defining module, executorch.backends.xnnpack, ...


def pytest_configure(config):
    global _state
    swap = bool(config.getoption("--xnnfold")) or os.environ.get("XNNFOLD_SWAP", "") not in ("", "0")
    _state = _State(swap)
    _instrument(_state)


def pytest_collection_finish(session):
    if _state is not None and _state.swap:
        _swap_bindings(_state)


def _rng_fingerprint() -> str | None:
    """sha1 of torch's CPU generator state (None before torch is imported)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    return hashlib.sha1(torch.get_rng_state().numpy().tobytes()).hexdigest()[:12]


def _seed_everything(seed: int) -> None:
    import random
    import torch
    torch.manual_seed(seed)
    random.seed(seed)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(seed)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if _state is not None:
        if _state.swap:
            _swap_bindings(_state)   # anything imported since collection
        _state.current = item.nodeid
        seed = item.config.getoption("--xnnfold-seed")
        if seed is not None:
            _seed_everything((seed + zlib.crc32(item.nodeid.encode())) % 2**32)
        _state.rng[item.nodeid] = {"start": _rng_fingerprint()}
    try:
        yield
    finally:
        if _state is not None:
            _state.rng.setdefault(item.nodeid, {})["end"] = _rng_fingerprint()
            _state.current = None


def _bound_modules(state: _State) -> dict:
    """Loaded ``executorch*`` modules whose global ``XnnpackPartitioner`` is xnnfold's / stock."""
    bound = {"xnnfold": [], "stock": []}
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "executorch" or name.startswith("executorch.")):
            continue
        value = getattr(module, "__dict__", {}).get(NAME)
        if value is not None and value is state.folding:
            bound["xnnfold"].append(name)
        elif value is not None and value is state.stock:
            bound["stock"].append(name)
    return {k: sorted(v) for k, v in bound.items()}


def _duplicate_copies(state: _State) -> list:
    """Modules holding an ``XnnpackPartitioner`` class that is neither stock nor xnnfold's.

    That happens when the stock module is imported a second time under another name (pytest's
    rootdir-based import of a test file inside the namespace package ``executorch``, e.g.
    ``backends.xnnpack.partition.xnnpack_partitioner``): its class escapes both the swap and the
    construction counter. The runner avoids it with ``--import-mode=importlib -o
    consider_namespace_packages=true``.
    """
    copies = []
    for name, module in list(sys.modules.items()):
        value = getattr(module, "__dict__", {}).get(NAME) if module is not None else None
        if (isinstance(value, type) and value.__name__ == NAME
                and value is not state.stock and value is not state.folding
                and not issubclass(value, state.stock)):
            copies.append(f"{name} ({_class_name(value)})")
    return sorted(copies)


def _problems(state: _State, session) -> list:
    if not state.swap or session.config.option.collectonly or session.testscollected == 0:
        return []
    problems = []
    total = sum(state.hook_calls.values())
    # A suite may have no test lowering through to_edge_transform_and_lower (quantizer,
    # serialization): the hook never running is a failed swap only where some test built
    # xnnfold's partitioner; conformance/run.py also checks the total over all suites.
    built = sum(c.get(_class_name(state.folding), 0) for c in state.constructed.values())
    if total == 0 and built:
        problems.append("xnnfold's transform_for_pre_decomposition never ran: the swap did not "
                        "take effect")
    stock_name = _class_name(state.stock)
    leaked = {nodeid: counts[stock_name] for nodeid, counts in state.constructed.items()
              if counts.get(stock_name)}
    if leaked:
        problems.append(f"stock {NAME} constructed during tests despite the swap: {leaked}")
    copies = _duplicate_copies(state)
    if copies:
        problems.append(f"a second copy of the stock {NAME} is loaded, out of the swap's reach: "
                        f"{copies}")
    return problems


def _record(state: _State, session) -> dict:
    construct_totals = Counter()
    for counts in state.constructed.values():
        construct_totals.update(counts)
    records = [r for rs in state.hook_records.values() for r in rs]
    return {
        "mode": "xnnfold" if state.swap else "stock",
        "stock_class": _class_name(state.stock),
        "xnnfold_class": _class_name(state.folding) if state.folding else None,
        "swapped_modules": sorted(set(state.swapped_modules)),
        "bound_modules": _bound_modules(state),
        "hook_calls_total": sum(state.hook_calls.values()),
        "hook_errors_total": sum(state.hook_errors.values()),
        "hook_calls": dict(state.hook_calls),
        "hook_errors": dict(state.hook_errors),
        "hook_records": dict(state.hook_records),
        "folded_operands_total": sum(r["folded"] for r in records),
        "declined_operands_total": sum(r["declined"] for r in records),
        "fallbacks": [r["fallback"] for r in records if r["fallback"]],
        "constructed_total": dict(construct_totals),
        "constructed": {k: dict(v) for k, v in state.constructed.items()},
        "tests_collected": session.testscollected,
        "seed": session.config.getoption("--xnnfold-seed"),
        "rng": state.rng,
        "seconds": round(time.time() - state.started, 1),
        "problems": _problems(state, session),
    }


def pytest_sessionfinish(session, exitstatus):
    if _state is None:
        return
    record = _record(_state, session)
    path = session.config.getoption("--xnnfold-report")
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump(record, f, indent=1, sort_keys=True)
    session.config._xnnfold_record = record
    if record["problems"]:
        session.exitstatus = SWAP_FAILED_EXIT


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    record = getattr(config, "_xnnfold_record", None)
    if record is None:
        return
    tr = terminalreporter
    tr.section(f"xnnfold swap ({record['mode']} mode)")
    if record["mode"] == "xnnfold":
        tr.write_line(f"swapped {NAME} in: {', '.join(record['swapped_modules'])}")
        tr.write_line(f"modules binding xnnfold's class at session end: "
                      f"{', '.join(record['bound_modules']['xnnfold'])}")
        tr.write_line(f"xnnfold transform_for_pre_decomposition calls: "
                      f"{record['hook_calls_total']} in {len(record['hook_calls'])} tests "
                      f"(raised: {record['hook_errors_total']}); operands folded: "
                      f"{record['folded_operands_total']}, declined: "
                      f"{record['declined_operands_total']}, fallbacks: {len(record['fallbacks'])}")
    tr.write_line(f"partitioners constructed (exact class): {record['constructed_total']}")
    for problem in record["problems"]:
        tr.write_line(f"XNNFOLD SWAP FAILED: {problem}", red=True, bold=True)


def pytest_unconfigure(config):
    global _state
    if _state is not None:
        _state.restore()
        _state = None
