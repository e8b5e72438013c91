"""init gives a size the tests never varied a reach, as it does a dim's range: a test calls an
operator at one shape, and precision defects grow with sizes it never used.
lucidrains/hyper-connections' ``sinkhorn_knopps`` was tested only on ``[..., 4, 1]``, where a
normalisation over one element gives 1 exactly: its revert (072bc2f, float16 arithmetic in place
of float32) measured 0 ulp on every draw and passed. Here each literal size that runs at the
reach becomes a dim ``S<n>`` of range ``[n, n]`` (draws stay the tests'), which the search's size
mutation aims past; a size the operator is built for (a quaternion's 4 components) stays."""
from __future__ import annotations

import json

import pytest

from gate.fuzz import fuzz_task
from gate.init import _finish, worker
from tests.helpers.init_worker import worker_answers
from gate.init.infer import Operator
from gate.ops.catalog import builtin_defaults
from gate.ops.spec import OpSpec
from gate.plan import Budget, Task, Variant

OPS = '''
import torch


def sinkhorn(log_alpha, iters=5):
    """Sinkhorn-Knopp in float32 whatever the input's dtype (the fix)."""
    a = (log_alpha.float() - log_alpha.float().amax(dim=-2, keepdim=True)).exp()
    for _ in range(iters):
        a = a / a.sum(dim=-2, keepdim=True)
        a = a / a.sum(dim=-1, keepdim=True)
    return a.to(log_alpha.dtype)


def sinkhorn_low(log_alpha, iters=5):
    """The same in the input's dtype (the revert)."""
    a = (log_alpha - log_alpha.amax(dim=-2, keepdim=True)).exp()
    for _ in range(iters):
        a = a / a.sum(dim=-2, keepdim=True)
        a = a / a.sum(dim=-1, keepdim=True)
    return a


def skew_exp(x):
    """An [n, k] input made an n x n skew matrix and exponentiated (geotorch's Stiefel): a cost
    of n^3 in one native call."""
    n, k = x.shape[-2], x.shape[-1]
    if k > n:
        raise ValueError("k > n")
    a = torch.zeros(n, n, dtype=x.dtype)
    a[:, :k] = x
    return torch.matrix_exp(a - a.T)[:, :k]


def quat_norm(q):
    if q.shape[-1] != 4:
        raise ValueError("a quaternion has 4 components")
    return q / q.norm(dim=-1, keepdim=True)
'''

SINKHORN = {"name": "reachlib.sinkhorn", "callable": "reachlib:sinkhorn",
            "inputs": [{"name": "log_alpha", "shape": [2, 4, 1]}]}
QUAT = {"name": "reachlib.quat_norm", "callable": "reachlib:quat_norm", "inputs": [{"name": "q", "shape": [4, 4]}]}


@pytest.fixture
def said(tmp_path, monkeypatch):
    with worker_answers(tmp_path, monkeypatch, "reachlib", OPS) as out:
        yield out


def _probe(said, row: dict, recorded: int = 1, timeout: float = 10) -> dict:
    worker.probe({"timeout": timeout, "ops": [{"name": row["name"], "recorded": recorded, "reach": 4096,
                                          "candidates": [row]}]})
    return json.loads(json.dumps(said[-1]))


def _op(row: dict) -> Operator:
    module, name = row["callable"].split(":")
    return Operator(name=row["name"], module=module, qualname=name, kind="function", file=f"{module}.py", line=1)


def test_each_size_the_tests_never_varied_reaches_where_the_operator_runs_there(said):
    answer = _probe(said, SINKHORN)
    assert answer["candidate"]["inputs"][0]["shape"] == ["S2", "S4", "S1"]
    assert answer["candidate"]["dims"] == {"S1": [1, 1], "S2": [2, 2], "S4": [4, 4]}
    assert answer["reach"] == {"S1": 4096, "S2": 4096, "S4": 4096}
    spec, note = _finish(_op(SINKHORN), answer, [SINKHORN], "from 1 test call(s)", 1)
    assert spec["dims"] == {"S1": [1, 1, 4096], "S2": [2, 2, 4096], "S4": [4, 4, 4096]}
    assert "S1, S2, S4: the tests' sizes, reaching 4096" in note, note


def test_a_size_the_operator_is_built_for_stays_and_its_other_place_reaches(said):
    # [4, 4]: four quaternions of 4 components; together the 4s do not run past 4, the count alone does
    answer = _probe(said, QUAT)
    assert answer["candidate"]["inputs"][0]["shape"] == ["S4_1", 4]
    assert answer["reach"] == {"S4_1": 4096}


def test_a_size_whose_cost_grows_fast_reaches_only_where_an_evaluation_stays_cheap(said):
    # geotorch's Stiefel on [n, k]: an n x n matrix exponential. At the reach, 4096, one float64
    # call ran for minutes (a native call the probe's time limit cannot interrupt) and init with
    # it; the size grows four times at a step and stops where an evaluation costs 1/64 of the
    # timeout; the 3 (k <= n) stays literal
    row = {"name": "reachlib.skew_exp", "callable": "reachlib:skew_exp", "inputs": [{"name": "x", "shape": [8, 3]}]}
    answer = _probe(said, row, timeout=2)
    assert answer["candidate"]["inputs"][0]["shape"] == ["S8", 3], answer
    assert 32 <= answer["reach"]["S8"] < 4096, answer["reach"]


def test_a_guessed_shape_gets_no_reach_for_its_literal_sizes(said):
    answer = _probe(said, QUAT, recorded=0)  # the probe's own shape, not the tests'
    assert "candidate" not in answer and not answer.get("reach"), answer


def test_the_reach_shows_a_float16_revert_the_tests_shape_reads_as_exact(said):
    # the search on the row as the tests pin it vs as init writes it now, at one budget
    def worst(fn: str, shape, dims=None) -> float:
        row = {"name": f"reachlib.{fn}", "callable": f"reachlib:{fn}", "grad": False,
               "inputs": [{"name": "log_alpha", "shape": shape}], **({"dims": dims} if dims else {})}
        spec = OpSpec.from_dict(row, builtin_defaults("torch"), origin="user")
        f = fuzz_task(Task(op=spec, variant=Variant("float16"), budget=Budget(evals=100), seed=0))
        return f.metrics.ulp

    wide = {"S1": [1, 1, 4096], "S2": [2, 2, 4096], "S4": [4, 4, 4096]}
    assert worst("sinkhorn_low", [2, 4, 1]) == 0.0  # one element per row: every output is 1 exactly
    assert worst("sinkhorn_low", ["S2", "S4", "S1"], wide) > 8.0
    assert worst("sinkhorn", ["S2", "S4", "S1"], wide) <= 1.0
