"""init leaves out helpers that compute nothing to measure: a function that returns one of its
arguments unchanged (lucidrains' `identity`, `default(v, d)`, an `nn.Identity`) or a Python bool
(`exists(v)`), which were half the rows init wrote for lucidrains/hyper-connections (32 rows, a
refresh of 8-15 minutes). An in-place operator returns its argument too, with new values: it
stays, as do operators whose result equals their input on some draws (relu, nan_to_num)."""
from __future__ import annotations

import json

import pytest

from gate.init import _finish, worker
from tests.helpers.init_worker import worker_answers
from gate.init.infer import Operator

OPS = '''
import torch


def identity(t, *args, **kwargs):
    return t


def default(v, d):
    return v if v is not None else d


def exists(v):
    return v is not None


def double_(x):
    return x.mul_(2)


def relu(x):
    return torch.relu(x)


def finite(x):
    return torch.nan_to_num(x)


class Passthrough(torch.nn.Identity):
    pass
'''


@pytest.fixture
def said(tmp_path, monkeypatch):
    with worker_answers(tmp_path, monkeypatch, "helperlib", OPS) as out:
        yield out


def _probe(said, name: str, inputs) -> dict:
    row = {"name": f"helperlib.{name}", "callable": f"helperlib:{name}", "inputs": inputs}
    worker.probe({"timeout": 10, "ops": [{"name": row["name"], "recorded": 1, "candidates": [row]}]})
    return json.loads(json.dumps(said[-1]))


X = [{"name": "x", "shape": [3, 4]}]


@pytest.mark.parametrize("name,inputs,says", [
    ("identity", [{"name": "t", "shape": [3, 4]}], "its argument t unchanged"),
    ("default", [{"name": "v", "shape": [3, 4]}, {"name": "d", "shape": [3, 4]}], "its argument v unchanged"),
    ("exists", [{"name": "v", "shape": [3, 4]}], "a Python bool or None"),
    ("Passthrough", [{"name": "input", "shape": [3, 4]}], "its argument input unchanged"),
])
def test_a_helper_that_computes_nothing_is_left_out_with_why(said, name, inputs, says):
    answer = _probe(said, name, inputs)
    assert says in (answer.get("trivial") or ""), answer
    op = Operator(name=f"helperlib.{name}", module="helperlib", qualname=name, kind="function",
                  file="helperlib.py", line=1)
    spec, why = _finish(op, answer, [], "probed", 1)
    assert spec is None and why.startswith("computes nothing to measure"), why


@pytest.mark.parametrize("name", ["double_", "relu", "finite"])
def test_an_operator_that_computes_stays(said, name):
    answer = _probe(said, name, X)
    assert "trivial" not in answer and answer["chosen"] == 0, answer
