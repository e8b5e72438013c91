"""The test run's time budget shared among test files (gate.search.harvest_budget), with the
clock given: the rules, not the timing (the end-to-end case is in tests/test_init.py)."""
from __future__ import annotations

from gate.search.harvest_budget import Shares, round_robin


def test_each_file_gets_an_equal_share_of_what_is_left_and_a_fast_file_leaves_its_rest():
    sh = Shares(["a.py", "b.py", "c.py"], deadline=90.0)
    assert sh.allows("a.py", 0.0)  # a's share: 90 / 3 = 30 s
    assert sh.allows("a.py", 29.0)
    assert not sh.allows("a.py", 31.0) and not sh.allows("a.py", 40.0)
    assert sh.allows("b.py", 40.0)  # b's share: (90 - 40) / 2 = 25 s
    assert not sh.allows("b.py", 66.0)
    assert sh.allows("c.py", 66.0) and sh.allows("c.py", 89.0)  # the last file: everything left
    assert sh.skipped == {"a.py": 2, "b.py": 1} and sh.started == ["a.py", "b.py", "c.py"]


def test_a_fast_file_gives_its_unspent_share_to_the_files_after_it():
    sh = Shares(["a.py", "b.py", "c.py"], deadline=90.0)
    assert sh.allows("a.py", 0.0)
    assert sh.allows("b.py", 1.0) and sh.allows("b.py", 45.0)  # (90 - 1) / 2 = 44.5: b may run to 45.5
    assert not sh.allows("b.py", 46.0)


def test_the_first_test_of_a_file_always_runs_even_past_the_deadline():
    sh = Shares(["a.py", "b.py"], deadline=10.0)
    assert sh.allows("a.py", 0.0)
    assert sh.allows("b.py", 50.0) and not sh.allows("b.py", 50.5)
    assert sh.summary() == {"files": ["a.py", "b.py"], "started": ["a.py", "b.py"], "skipped": {"b.py": 1}}


def test_tests_are_taken_round_robin_over_functions_within_their_file():
    ids = ["a.py::t[0]", "a.py::t[1]", "a.py::t[2]", "a.py::C::v[x]", "a.py::C::v[y]", "a.py::C::s", "a.py::u",
           "b.py::w[0]", "b.py::w[1]", "b.py::z"]

    def scope(i):  # a class's tests stay together (its setUpClass runs once)
        parts = i.split("[", 1)[0].split("::")
        return "::".join(parts[:2]) if len(parts) == 3 else parts[0]

    got = round_robin(ids, lambda i: i.split("::", 1)[0], lambda i: i.split("[", 1)[0], scope)
    assert got == ["a.py::t[0]", "a.py::u", "a.py::t[1]", "a.py::t[2]", "a.py::C::v[x]", "a.py::C::s", "a.py::C::v[y]",
                   "b.py::w[0]", "b.py::z", "b.py::w[1]"]


def test_init_names_the_files_a_run_killed_at_its_limit_never_reached():
    from gate.init import _budget_words

    budget = {"files": [f"tests/test_{k}.py" for k in range(9)], "started": ["tests/test_0.py", "tests/test_1.py"],
              "skipped": {"tests/test_0.py": 12}}
    words = _budget_words(budget, 600)
    assert "12 tests in 1 of 9 test files skipped once their file's share of the 600s budget was spent" in words
    assert "7 test files never reached (tests/test_2.py, tests/test_3.py, tests/test_4.py, tests/test_5.py, " \
           "tests/test_6.py and 2 more)" in words and words.endswith("(--tests-timeout SECONDS gives them more)")
    assert _budget_words({"files": ["a.py"], "started": ["a.py"], "skipped": {}}, 600) == ""
    assert _budget_words(None, 600) == ""
