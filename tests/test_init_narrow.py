"""init narrows a row whose evaluation at the tests' sizes is too slow for a run's default
budget (lucidrains' memory-efficient attention, tested at a sequence of 2048: 2.9-5.2 s of CPU
an evaluation, every pull request under-searched): its largest sizes are halved, the entries of
one size together (q, k, v and the mask keep one sequence length), while the operator still
runs, until an evaluation fits; a size the operator is built for (a layer of 128 features)
stays. The operator here spends CPU time in proportion to the square of its sequence length,
whatever the machine's load, so the sizes it ends at do not depend on the machine."""
from __future__ import annotations

import json

import pytest

from gate.init import _finish, worker
from tests.helpers.init_worker import worker_answers
from gate.init.infer import Operator

OPS = '''
import time


def attend(x, mask=None):
    """Attention-like cost: L^2 work for a sequence of L; built for 128 features."""
    if x.shape[-1] != 128:
        raise ValueError(f"expected 128 features, got {x.shape[-1]}")
    if mask is not None and mask.shape[-1] != x.shape[1]:
        raise ValueError("mask and sequence differ")
    n = x.shape[1]
    t = time.process_time()
    while time.process_time() - t < 4e-6 * n * n:  # 0.26 s of CPU a call at 256, 16 ms at 64
        pass
    return x * 2
'''

ROW = {"name": "slowattn.attend", "callable": "slowattn.attend", "grad": False,
       "inputs": [{"name": "x", "shape": [2, 256, 128]}, {"name": "mask", "shape": [2, 256], "kind": "bool"}]}


@pytest.fixture
def said(tmp_path, monkeypatch):
    with worker_answers(tmp_path, monkeypatch, "slowattn", OPS) as out:
        yield out


def _probe(said, narrow: float, recorded: int = 1, row: dict = ROW) -> dict:
    worker.probe({"timeout": 10, "ops": [{"name": row["name"], "recorded": recorded, "narrow": narrow,
                                          "candidates": [row]}]})
    return json.loads(json.dumps(said[-1]))


def test_a_row_too_slow_at_the_tests_sizes_is_narrowed_and_keeps_the_size_it_is_built_for(said):
    # an evaluation is the variant's call and the reference's: ~0.52 s of CPU at 256, 0.13 at 128,
    # 0.033 at 64; under a target of 0.08 s the sequence ends at 64
    answer = _probe(said, narrow=0.08)
    assert answer["chosen"] == 0
    narrowed = answer["narrowed"]
    assert narrowed["sizes"] == {"256": [256, 64]}, narrowed
    was, now = narrowed["seconds"]
    assert was > 0.4 and now <= 0.08, narrowed
    shapes = [t["shape"] for t in answer["candidate"]["inputs"]]
    assert shapes == [[2, 64, 128], [2, 64]]  # one sequence length for both; the features as built
    assert all(st[0] == "ok" for st in answer["variants"].values()), answer["variants"]

    op = Operator(name=ROW["name"], module="slowattn", qualname="attend", kind="function", file="slowattn.py", line=1)
    spec, note = _finish(op, answer, [ROW], "from 1 test call(s)", 1)
    assert [t["shape"] for t in spec["inputs"]] == [[2, 64, 128], [2, 64]]
    assert "sizes narrowed from the tests' (256 -> 64)" in note and "--keep-sizes" in note, note


def test_a_row_within_the_target_a_guessed_shape_and_keep_sizes_are_left_as_they_are(said):
    row = dict(ROW, inputs=[{"name": "x", "shape": [2, 128, 128]}, {"name": "mask", "shape": [2, 128], "kind": "bool"}])
    assert "narrowed" not in _probe(said, narrow=5.0, row=row)  # cheap enough (0.13 s): the tests' sizes
    assert "narrowed" not in _probe(said, narrow=0.0, row=row)  # --keep-sizes
    assert "narrowed" not in _probe(said, narrow=0.05, recorded=0, row=row)  # a guessed shape, not the tests' call
    # from the tests, narrowed: the sequence and the features are both 128; halved together the
    # layer refuses them, so the first place of 128 in each tensor (the sequence) is halved alone
    answer = _probe(said, narrow=0.05, row=row)
    assert answer["narrowed"]["sizes"] == {"128 (place 1)": [128, 64]}, answer["narrowed"]
    assert [t["shape"] for t in answer["candidate"]["inputs"]] == [[2, 64, 128], [2, 64]]


def test_a_dim_range_is_narrowed_and_not_aimed_past_the_tests_sizes(said):
    row = dict(ROW, dims={"L": [200, 256]}, inputs=[{"name": "x", "shape": [2, "L", 128]},
                                                    {"name": "mask", "shape": [2, "L"], "kind": "bool"}])
    worker.probe({"timeout": 10, "ops": [{"name": row["name"], "recorded": 1, "narrow": 0.08, "reach": 4096,
                                          "candidates": [row]}]})
    answer = json.loads(json.dumps(said[-1]))
    assert answer["narrowed"]["sizes"] == {"L": [256, 64]}, answer["narrowed"]
    assert answer["candidate"]["dims"]["L"] == [64, 64]
    assert "L" not in answer.get("reach", {})  # a size mutation to 4096 would cost 256x the tests' own
    # the sizes not narrowed reach where the operator runs there: the batch of 2, not the 128 features
    assert answer["candidate"]["inputs"][0]["shape"] == ["S2", "L", 128], answer["candidate"]["inputs"]


def test_a_wide_dim_range_is_costed_at_its_top_where_the_search_draws(said):
    # hyper-connections' sinkhorn_knopps: C drawn in [1, 1024] from the tests' calls; the probe's
    # own small draws cost little and the row was never narrowed, while refresh drew C up to 1024
    # at 1 s of CPU an evaluation. At L = 256 an evaluation here is ~0.52 s, at a quarter of the
    # range ~0.05 s: costed at the top, the range is narrowed to 64
    row = dict(ROW, dims={"L": [16, 256]}, inputs=[{"name": "x", "shape": [2, "L", 128]},
                                                   {"name": "mask", "shape": [2, "L"], "kind": "bool"}])
    answer = _probe(said, narrow=0.08, row=row)
    assert answer["narrowed"]["sizes"] == {"L": [256, 64]}, answer.get("narrowed")
    assert answer["candidate"]["dims"] == {"L": [16, 64]}
    was, now = answer["narrowed"]["seconds"]
    assert was > 0.3 and now <= 0.08, answer["narrowed"]


def test_an_operator_slow_whatever_its_sizes_keeps_the_tests_sizes(said, tmp_path):
    (tmp_path / "constcost.py").write_text(
        "import time\n\n\ndef slow(x):\n    t = time.process_time()\n"
        "    while time.process_time() - t < 0.1:  # 0.1 s of CPU a call, whatever the size\n        pass\n"
        "    return x * 2\n")
    row = {"name": "constcost.slow", "callable": "constcost.slow", "grad": False,
           "inputs": [{"name": "x", "shape": [4, 256]}]}
    worker.probe({"timeout": 10, "ops": [{"name": row["name"], "recorded": 1, "narrow": 0.08, "candidates": [row]}]})
    answer = json.loads(json.dumps(said[-1]))
    assert answer["chosen"] == 0 and "narrowed" not in answer, answer.get("narrowed")


def test_a_size_narrowed_for_cost_is_not_aimed_past_the_tests(said):
    worker.probe({"timeout": 10, "ops": [{"name": ROW["name"], "recorded": 1, "narrow": 0.08, "reach": 4096,
                                          "candidates": [ROW]}]})
    answer = json.loads(json.dumps(said[-1]))
    assert answer["narrowed"]["sizes"] == {"256": [256, 64]}, answer["narrowed"]
    # the sequence (narrowed) and the features (built for 128) stay literal; the batch reaches
    assert [t["shape"] for t in answer["candidate"]["inputs"]] == [["S2", 64, 128], ["S2", 64]]
    assert answer["reach"] == {"S2": 4096}
