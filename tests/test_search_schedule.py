"""The UCT scheduler (deterministic under a seed, learns, two levels), its plumbing through
the engine, and the cross-task budget allocation."""
import numpy as np
import pytest

from gate.fuzz import fuzz_task
from gate.search.engine import UniformScheduler, search
from gate.oracles.runner import OK, Evaluation
from gate.search.schedule import UCTScheduler, allocate, estimate_cost, make_scheduler
from gate.oracles.precision import Metrics
from gate.ops.catalog import Catalog, load_builtin
from gate.plan import Budget, Task, Variant

ARMS = ["a", "b", "c", "d"]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Small tensors: one intra-op thread avoids oversubscribing the shared CI cores."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def play(seed, rounds=200, rewards=None):
    rewards = rewards or {"a": 0.1, "b": 0.9, "c": 0.3, "d": 0.0}
    sch = UCTScheduler(ARMS)
    rng = np.random.default_rng(seed)
    noise = np.random.default_rng(seed + 100)
    seq = []
    for _ in range(rounds):
        arm = sch.choose(rng)
        seq.append(arm)
        sch.update(arm, float(noise.random() < rewards[arm]))
    return seq, sch


def test_deterministic_under_a_seed():
    a, sa = play(3)
    b, sb = play(3)
    assert a == b and sa.stats() == sb.stats()
    others = {tuple(play(s)[0]) for s in range(4, 9)}
    assert len(others) > 1  # the seed matters (ties are broken with the search's RNG)


def test_tries_every_arm_first_then_exploits_the_best():
    seq, sch = play(0, rounds=300)
    assert sorted(seq[:4]) == sorted(ARMS)
    counts = {a: seq.count(a) for a in ARMS}
    assert counts["b"] > 0.6 * len(seq)
    assert counts["b"] == max(counts.values())
    assert sch.stats()["mutators"]["b"][0] == counts["b"]


def test_second_level_rewards_the_class_that_was_aimed_at():
    sch = UCTScheduler(["param", "noise"])
    rng = np.random.default_rng(0)
    for _ in range(200):
        name = sch.choose(rng)
        if name == "param":
            pick = sch.sub("param", ["k=0", "k=1", "k>=2"], rng)
            sch.update(name, 1.0 if pick == "k>=2" else 0.0)
        else:
            sch.update(name, 0.2)
    tries = sch.stats()["targets"]["param"]
    assert tries["k>=2"][1] == 1.0 and tries["k=0"][1] == 0.0
    assert tries["k>=2"][0] > tries["k=0"][0] + tries["k=1"][0]
    assert not sch.pending


def test_pending_choices_are_rewarded_in_order():
    sch = UCTScheduler(["x", "y"])
    rng = np.random.default_rng(0)
    first = sch.choose(rng)
    sch.sub(first, ["p", "q"], rng)
    picked = sch.pending[0][1]
    second = sch.choose(rng)
    sch.update(first, 1.0)
    assert sch.children[first].n[picked] == 1
    sch.update(second, 0.0)
    assert not sch.pending


class CountingScheduler(UniformScheduler):
    def __init__(self, names):
        super().__init__(names)
        self.chosen, self.updates = 0, 0

    def choose(self, rng):
        self.chosen += 1
        return super().choose(rng)

    def update(self, name, reward):
        assert 0.0 <= reward <= 1.0
        self.updates += 1


@pytest.mark.parametrize("batch", [1, 4])
def test_engine_rewards_every_choice_once(batch):
    """Every mutator choice gets exactly one reward (the bandit's books balance), batched or not."""
    def evaluate(c):
        v = float(np.abs(c.arrays["x"]).max())
        return c, Evaluation(OK, metrics=Metrics(ulp=v))

    def many(cs):
        return [evaluate(c) for c in cs]

    def fresh(r):
        from gate.search.inputs import Candidate
        return Candidate(dims={}, params={}, arrays={"x": r.standard_normal(4)})

    def grow(c, r):
        n = c.copy()
        n.arrays["x"] = n.arrays["x"] * 1.1
        return n

    sch = CountingScheduler(["grow", "none"])
    search(evaluate, fresh, {"grow": grow, "none": lambda c, r: None}, np.random.default_rng(0), evals=300,
           scheduler=sch, evaluate_many=many, batch=batch)
    assert sch.chosen > 100
    assert sch.updates == sch.chosen


def test_fuzz_task_is_deterministic_with_the_uct_scheduler():
    spec = Catalog(load_builtin(("torch",))).get("torch.softmax")
    task = Task(op=spec, variant=Variant("float32"), budget=Budget(evals=150), seed=7)
    a = fuzz_task(task)
    b = fuzz_task(task)
    assert a.trajectory == b.trajectory
    assert a.metrics == b.metrics
    assert a.coverage["schedule"] == b.coverage["schedule"]
    assert a.coverage["classes"] == b.coverage["classes"]
    assert a.coverage["schedule"]["mutators"]  # the bandit was used (default for guided search)
    c = fuzz_task(task, scheduler="uniform")
    assert "schedule" not in c.coverage


def test_make_scheduler_names():
    assert isinstance(make_scheduler("uct", ["a"]), UCTScheduler)
    assert isinstance(make_scheduler("uniform", ["a"]), UniformScheduler)
    with pytest.raises(ValueError):
        make_scheduler("mcts-please", ["a"])


def _tasks(names):
    cat = Catalog(load_builtin(("torch",)))
    return [Task(op=cat.get(n), variant=Variant("float32"), budget=Budget(seconds=1.0), seed=0) for n in names]


def test_allocate_spends_the_total_and_reports_what_did_not_fit():
    tasks = _tasks(["torch.relu", "torch.tanh", "torch.conv2d", "torch.softmax"])
    alloc = allocate(tasks, 10.0, min_seconds=1.0)
    assert not alloc.not_covered
    assert sum(t.budget.seconds for t in alloc.tasks) == pytest.approx(10.0)
    assert all(t.budget.seconds >= 1.0 for t in alloc.tasks)
    small = allocate(tasks, 2.5, min_seconds=1.0)
    assert len(small.tasks) == 2 and len(small.not_covered) == 2
    assert sum(t.budget.seconds for t in small.tasks) <= 2.5 + 1e-9
    d = small.to_dict()
    assert {r["task"] for r in d["not_covered"]} | {r["task"] for r in d["tasks"]} == {t.id for t in tasks}


def test_allocate_prefers_coverage_gaps_and_bad_history():
    tasks = _tasks(["torch.relu", "torch.tanh", "torch.sigmoid"])
    alloc = allocate(tasks, 2.0, min_seconds=1.0, coverage={"torch.relu": 1.0, "torch.tanh": 1.0},
                     cost={t.id: 1e-3 for t in tasks})
    assert alloc.tasks[0].op.name == "torch.sigmoid"  # nothing covered yet
    alloc = allocate(tasks, 2.0, min_seconds=1.0, history={"torch.relu": 3.0}, cost={t.id: 1e-3 for t in tasks})
    assert alloc.tasks[0].op.name == "torch.relu"  # came close to its gate last time
    assert [n["task"] for n in alloc.not_covered] == [alloc_id for alloc_id in [t.id for t in tasks]
                                                       if alloc_id not in {t.id for t in alloc.tasks}]


def test_an_operator_too_slow_for_its_minimum_is_searched_with_its_share_not_left_out():
    """An evaluation of a second (an attention at a sequence of 2048): 200 evaluations "needed"
    200 s of a 120-s total, so no variant was searched and the run ended "the budget covered
    none". Each operator's best variant gets its even share of the total instead."""
    tasks = _tasks(["torch.relu", "torch.tanh"]) + [
        Task(op=t.op, variant=Variant("float16"), budget=Budget(seconds=1.0), seed=0)
        for t in _tasks(["torch.relu", "torch.tanh"])]
    alloc = allocate(tasks, 120.0, min_seconds=1.0, cost={t.id: 1.0 for t in tasks})
    assert sorted(t.op.name for t in alloc.tasks) == ["torch.relu", "torch.tanh"]  # one variant each
    assert [t.budget.seconds for t in alloc.tasks] == [pytest.approx(60.0)] * 2
    assert len(alloc.not_covered) == 2
    cheap = allocate(tasks, 120.0, min_seconds=1.0, cost={t.id: 1e-3 for t in tasks})
    assert len(cheap.tasks) == 4 and not cheap.not_covered  # 0.2 s each: all of them, as before


def test_cost_estimate_orders_cheap_before_expensive():
    relu, conv = _tasks(["torch.relu", "torch.conv2d"])
    assert estimate_cost(conv) > estimate_cost(relu) > 0


def test_allocate_covers_every_operator_before_a_second_variant_of_any():
    cat = Catalog(load_builtin(("torch",)))
    tasks = [Task(op=cat.get(n), variant=Variant(d), budget=Budget(seconds=1.0), seed=0)
             for n in ("torch.relu", "torch.tanh", "torch.sigmoid") for d in ("float16", "bfloat16", "float32")]
    alloc = allocate(tasks, 3.0, min_seconds=1.0, cost={t.id: 1e-3 for t in tasks},
                     history={"torch.relu[float16/cpu/input]": 5.0, "torch.relu[bfloat16/cpu/input]": 4.0})
    # relu's variants came close last time, but three seconds go to three operators first
    assert sorted(t.op.name for t in alloc.tasks) == ["torch.relu", "torch.sigmoid", "torch.tanh"]
    assert alloc.tasks[0].id == "torch.relu[float16/cpu/input]"


def test_a_dims_reach_does_not_make_the_static_cost_estimate_larger():
    """Three dims reaching 4096 made an operator of small inputs look like 0.7 s an evaluation
    (torchfields' get_vote_shape): a run covered one variant of each operator and left 73 of its
    120 s unspent. The few candidates aimed at a reach are capped in size; the drawn ranges set
    the estimate."""
    from gate.ops.catalog import builtin_defaults
    from gate.ops.spec import OpSpec

    def task(dims):
        row = {"name": "m.f", "callable": "torch:tanh", "dims": dims, "inputs": [{"name": "x", "shape": ["N", "C", "D"]}]}
        return Task(op=OpSpec.from_dict(row, builtin_defaults("torch"), origin="user"), variant=Variant("float32"),
                    budget=Budget(seconds=1.0), seed=0)

    drawn = {"N": [1, 2], "C": [1, 16], "D": [1, 4]}
    reached = {k: v + [4096] for k, v in drawn.items()}
    assert estimate_cost(task(reached)) == estimate_cost(task(drawn))
    wider = {"N": [1, 2], "C": [1, 4096], "D": [1, 4]}  # a drawn range of that size does count
    assert estimate_cost(task(wider)) > estimate_cost(task(drawn))


def test_the_run_allocates_by_the_cost_its_baselines_measured():
    """A PR run's allocation takes each variant's seconds per evaluation from base's stored row
    (its search's seconds over its evaluations), the static estimate only where there is none."""
    from types import SimpleNamespace

    from gate.judge.baselines import BaselineRow
    from gate.pipeline import _allocate

    tasks = _tasks(["torch.relu", "torch.tanh"]) + [
        Task(op=t.op, variant=Variant("float16"), budget=Budget(seconds=60.0), seed=0)
        for t in _tasks(["torch.relu", "torch.tanh"])]
    planned = [{"task": t, "spec": t.op, "row": BaselineRow(op=t.op.name, variant=t.variant.key, env={},
                                                             evals=evals, seconds=secs)}
               for t, (evals, secs) in zip(tasks, [(40, 10.0), (40, 10.0), (1000, 1.0), (1000, 1.0)])]
    ctx = SimpleNamespace(settings=SimpleNamespace(floor=lambda spec, variant: 1.0))
    report = SimpleNamespace(env={})
    run, skipped = _allocate(SimpleNamespace(evals=None), ctx, planned, 120.0, report)
    costs = {r["task"]: r["cost"] for r in report.env["allocation"]["tasks"]}
    assert costs[tasks[0].id] == pytest.approx(0.25) and costs[tasks[2].id] == pytest.approx(1e-3)
    assert len(run) == 4 and not skipped  # the slow pair with their share, the fast pair beside them
    # a row of 2 evaluations measured its first call's costs more than its evaluations': not used
    planned[0]["row"].evals, planned[0]["row"].seconds = 2, 2.6
    _allocate(SimpleNamespace(evals=None), ctx, planned, 120.0, report)
    costs = {r["task"]: r["cost"] for r in report.env["allocation"]["tasks"]}
    assert costs[tasks[0].id] == pytest.approx(estimate_cost(tasks[0]), abs=1e-6)
