"""A pytest plugin that shares a test run's time budget among its test files (``dl-gate init``).

init records how a library's tests call its operators within one time limit (``--tests-timeout``,
600 s by default). Run in their own order, a slow test module spends that whole limit and the
files after it never run: geoopt's tests, under the recorder on a 2-core machine, stopped in the
8th of 24 files, and ``test_spd_norm.py`` - the one test that called ``SPD.norm`` at a zero
tangent vector, the input of the revert's regression - was never reached. Here:

* each test file gets an equal share of what is left of the budget when it starts (what a fast
  file leaves goes to the files after it); once its share is spent, the file's remaining tests
  are skipped (the first test of a file always runs);
* within a file, the tests are taken round-robin over its test functions (one parameter set of
  each function before the second of any), so a cut file still calls each function once; the
  tests of one class stay together (round robin among themselves), so that its setup runs once.

The recorder is about how tests call the library, not whether they pass: skipping is sampling.
Progress is written to ``budget.json`` beside the recorder's configuration at each new file and
at the end (a run killed at its limit keeps it): the files, those started, the tests skipped per
file. Standalone (stdlib and pytest only): ``dl-gate harvest`` copies it beside its generated
``sitecustomize`` and names it in ``PYTEST_PLUGINS``; ``DL_GATE_HARVEST_DEADLINE`` (seconds since
the epoch) switches it on, and is taken out of the environment at import so that a test's own
pytest subprocess is not budgeted too.
"""
from __future__ import annotations

import json
import os
import time

import pytest

DEADLINE_ENV = "DL_GATE_HARVEST_DEADLINE"
_deadline = os.environ.pop(DEADLINE_ENV, None)
_deadline = float(_deadline) if _deadline else None


class Shares:
    """The budget's bookkeeping, with the clock given by the caller (held by unit tests)."""

    def __init__(self, files, deadline):
        self.files = list(files)  # test files in run order
        self.deadline = deadline
        self.started = []
        self.skipped = {}
        self._file = None
        self._until = None
        self._ran = 0

    def allows(self, file, now):
        """True when the next test, in ``file``, should run at ``now``."""
        if file != self._file:
            self._file, self._ran = file, 0
            self.started.append(file)
            left = max(1, len(self.files) - self.files.index(file)) if file in self.files else 1
            self._until = now + max(0.0, self.deadline - now) / left
        if self._ran and now > self._until:
            self.skipped[file] = self.skipped.get(file, 0) + 1
            return False
        self._ran += 1
        return True

    def summary(self):
        return {"files": self.files, "started": self.started, "skipped": self.skipped}


def round_robin(items, key_file, key_function, key_scope=None):
    """``items`` grouped by file (files in their first order) and, within a file, one item of
    each function in turn. ``key_scope`` (a test class): the items of one scope stay together,
    taken round robin among themselves, so that a class's setup (``setUpClass``, class-scoped
    fixtures: often a model built once) runs once, as in the tests' own order."""
    key_scope = key_scope or key_file
    files = {}
    for it in items:
        scopes = files.setdefault(key_file(it), {})
        scopes.setdefault(key_scope(it), {}).setdefault(key_function(it), []).append(it)
    out = []
    for scopes in files.values():
        for funcs in scopes.values():
            queues = list(funcs.values())
            depth = max(len(q) for q in queues)
            for i in range(depth):
                out.extend(q[i] for q in queues if i < len(q))
    return out


_state = {"config": None, "shares": None}


def _file_of(item):
    return item.nodeid.split("::", 1)[0]


def _function_of(item):
    return item.nodeid.split("[", 1)[0]


def _scope_of(item):
    """The test class an item belongs to (its node id up to the class), else its file."""
    cls = getattr(item, "cls", None)
    if cls is None:
        return _file_of(item)
    return _function_of(item).rsplit("::", 1)[0]


def _write():
    cfg = os.environ.get("DL_GATE_HARVEST")
    sh = _state["shares"]
    if not cfg or sh is None:
        return
    path = os.path.join(os.path.dirname(cfg), "budget.json")
    tmp = path + ".part"
    try:
        with open(tmp, "w") as f:
            json.dump(sh.summary(), f)
        os.replace(tmp, path)
    except OSError:
        pass


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    if _deadline is None or _state["config"] not in (None, config):
        return
    _state["config"] = config
    items[:] = round_robin(items, _file_of, _function_of, _scope_of)
    files = list(dict.fromkeys(_file_of(it) for it in items))
    _state["shares"] = Shares(files, _deadline)
    _write()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    sh = _state["shares"]
    if sh is None or item.config is not _state["config"]:
        return
    new_file = _file_of(item) != sh._file
    ok = sh.allows(_file_of(item), time.time())
    if new_file:
        _write()
    if not ok:
        pytest.skip("dl-gate init: this test file's share of the test budget is spent (--tests-timeout)")


def pytest_sessionfinish(session):
    if session.config is _state["config"]:
        _write()
