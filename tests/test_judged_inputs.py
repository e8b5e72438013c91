"""The inputs a variant is judged on, when a time-budgeted run cannot replay them all
(gate.pipeline.judged_inputs): a slow operator's fixed inputs (stored, controls, degenerate,
structured, accumulation, the tests' own) are each evaluated on head and on base; an operator of
7-10 s an evaluation (memory-efficient attention beside a test suite) replayed them past the run's deadline, and the run was stopped as an error."""
from __future__ import annotations

from gate.pipeline import JUDGED_ORDER, REPLAY_FLOOR, judged_inputs


def _groups():
    sizes = {"corpus": 2, "found": 2, "neighbours": 4, "control": 1, "controls": 2, "degenerate": 2,
             "structured": 3, "accumulation": 2, "tests": 1}
    return {g: [f"{g}{i}" for i in range(n)] for g, n in sizes.items()}


def test_every_input_is_judged_when_they_fit_the_run_counts_evaluations_or_the_cost_is_unknown():
    groups = _groups()
    every = [c for g in JUDGED_ORDER for c in groups[g]]
    assert judged_inputs(groups, 0.01, 30.0) == (every, None)  # 19 x 0.01 s: well within 30 s
    assert judged_inputs(groups, 20.0, None) == (every, None)  # --evals: bounded by its inputs
    assert judged_inputs(groups, None, 0.0) == (every, None)  # no evaluation of the operator measured
    # a variant whose share was spent before its search still replays a fast operator's every input
    assert judged_inputs(groups, REPLAY_FLOOR / 20, 0.0) == (every, None)


def test_a_slow_operator_keeps_the_searchs_worst_and_a_control_first():
    groups = _groups()
    kept, note = judged_inputs(groups, 10.0, 60.0)  # 19 inputs x 10 s past a 60 s share: room for 6
    assert kept == ["corpus0", "corpus1", "found0", "found1", "control0", "degenerate0"]  # replay order kept
    assert note == {"kept": 6, "of": 19, "cost": 10.0,
                    "left_out": {"neighbours": 4, "controls": 2, "degenerate": 1, "structured": 3,
                                 "accumulation": 2, "tests": 1}}


def test_however_slow_the_search_and_one_control_stay():
    groups = _groups()
    kept, note = judged_inputs(groups, 100.0, 10.0)  # room for none
    assert kept == ["found0", "found1", "control0"] and note["kept"] == 3
    kept, _ = judged_inputs({"found": [], "control": ["c"], "tests": ["t"]}, 100.0, 10.0)
    assert kept == ["c"]
