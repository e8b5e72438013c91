"""init's probe gives each evaluation a limit in CPU time, with a wall-clock backstop: a heavy
call on a loaded runner (memory-efficient attention at its tests' sizes, 3-5 s of CPU an
evaluation, was left out beside the library's own test processes as "no answer within 10s") is given the
CPU it needs however long it waits for it; a spin is still stopped at the limit, and a call that
waits forever at the backstop."""
from __future__ import annotations

import signal
import textwrap

import pytest

from gate.init import worker
from gate.plan import Variant

from tests.oracle_support import user_ops

OPS = '''
import time

import torch


def waits(x):
    time.sleep(0.6)  # off the CPU, as a call is on a loaded machine while others run
    return x * 2


def spins(x):
    while True:
        pass


def sleeps(x):
    time.sleep(1000)
    return x


def busy(x):
    t = time.process_time()
    while time.process_time() - t < 0.05:  # 50 ms of CPU a call, whatever the load
        pass
    return x * 2
'''


@pytest.fixture
def specs(tmp_path, monkeypatch):
    (tmp_path / "slowlib.py").write_text(OPS)
    monkeypatch.syspath_prepend(str(tmp_path))
    rows = "".join(textwrap.dedent(f'''
        - name: slowlib.{n}
          callable: slowlib.{n}
          inputs: [{{name: x, shape: [N]}}]
          dims: {{N: [4, 16]}}
          grad: false
        ''') for n in ("waits", "spins", "sleeps"))
    ops = user_ops(tmp_path, rows)

    saved = worker.deadline_signals()
    yield ops
    for s, h in saved.items():
        signal.signal(s, h)


def test_a_call_that_waits_longer_than_the_limit_but_computes_less_runs(specs):
    # 1.2 s of wall time an evaluation (the reference's call and the variant's) under a 1 s limit, a
    # few ms of CPU: the backstop (6 s) leaves room for a loaded machine's slower CPU work
    assert worker._evaluate(specs["slowlib.waits"], Variant("float32"), 1, 1.0) == ("ok", None)


def test_a_spin_is_stopped_at_the_cpu_limit(specs):
    status, why = worker._evaluate(specs["slowlib.spins"], Variant("float32"), 1, 0.5)
    assert (status, why) == ("timeout", "no answer within 0.5s of CPU time")


def test_a_call_that_never_answers_nor_computes_is_stopped_at_the_backstop(specs):
    status, why = worker._evaluate(specs["slowlib.sleeps"], Variant("float32"), 1, 0.5)
    assert status == "timeout" and why.startswith(f"no answer within {0.5 * worker.WALL_FACTOR:g}s "), why


def test_the_probe_says_what_one_evaluation_costs_and_init_what_the_rows_variants_need(specs, monkeypatch):
    """The probe records one evaluation's CPU seconds (the reference's call and the variant's);
    a row whose variants need more than a run's default budget for the evaluations a pass needs
    gets a note saying so (a 10 s operator with 6 variants: every pull request under-searched)."""
    import json

    from gate.init import _too_slow_for_the_default_budget

    said = []
    monkeypatch.setattr(worker, "_emit", said.append)  # the worker's answers (its stdout)
    worker.probe({"timeout": 5, "ops": [{"name": "slowlib.busy", "recorded": 0, "candidates": [
        {"name": "slowlib.busy", "callable": "slowlib.busy", "inputs": [{"name": "x", "shape": ["N"]}],
         "dims": {"N": [4, 16]}, "grad": False}]}]})
    answer = json.loads(json.dumps(said[-1]))
    assert answer["chosen"] == 0 and answer["seconds"] >= 0.1, answer  # two calls of 50 ms of CPU
    assert _too_slow_for_the_default_budget(answer) is None  # 0.1 s x 20 x its variants: within 120 s
    slow = dict(answer, seconds=10.0, variants={"float32/cpu/input": ["ok", None], "float16/cpu/input": ["ok", None],
                                                "bfloat16/cpu/input": ["timeout", "no answer within 10s of CPU time"]})
    note = _too_slow_for_the_default_budget(slow)
    assert note.startswith("~10s of CPU an evaluation: its 2 variant(s) need ~7 min for the 20 evaluations"), note
