"""Where to spend a budget.

Inside one task, :class:`UCTScheduler` picks the next mutation: a two-level UCT tree (the
MCTS selection rule ``v/n + c·sqrt(ln N / n)``, c = 1/√2) whose first level is the mutator and
whose second level, for mutators that aim at something, is the class aimed at (a parameter
class, a size class, a value regime). Rewards in [0, 1] come from the engine: the relative
error improvement over the parent (1 for a new NaN/Inf or a new crash) plus a bonus for new
value-class coverage. Untried arms are tried first (so every class is tried once), ties are
broken with the search's own RNG: the schedule is deterministic for a seed.
:class:`gate.search.engine.UniformScheduler` is the control arm.

Across tasks, :func:`allocate` splits a total budget: every task first gets a minimum useful
share in priority order (coverage gaps x history, per unit of cost), what is left is spread in
proportion to priority, and the tasks that did not fit are reported as not covered.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Deque, Dict, Iterable, List, Mapping, Optional, Sequence

import numpy as np

from ..plan import Budget, Task
from .engine import UniformScheduler

C_UCT = 1 / math.sqrt(2)
SCHEDULERS = ("uct", "uniform")


class _Node:
    __slots__ = ("n", "w", "arms")

    def __init__(self) -> None:
        self.n: Dict[str, int] = {}
        self.w: Dict[str, float] = {}
        self.arms: List[str] = []

    def add(self, arms: Iterable[str]) -> None:
        for a in arms:
            if a not in self.n:
                self.n[a] = 0
                self.w[a] = 0.0
                self.arms.append(a)

    def select(self, arms: Sequence[str], rng: np.random.Generator, c: float) -> str:
        self.add(arms)
        untried = [a for a in arms if self.n[a] == 0]
        if untried:
            return untried[int(rng.integers(len(untried)))]
        total = sum(self.n[a] for a in arms)
        log_n = math.log(max(total, 1))
        scores = [self.w[a] / self.n[a] + c * math.sqrt(log_n / self.n[a]) for a in arms]
        best = max(scores)
        ties = [a for a, s in zip(arms, scores) if s >= best - 1e-12]
        return ties[int(rng.integers(len(ties)))] if len(ties) > 1 else ties[0]

    def record(self, arm: str, reward: float) -> None:
        self.add([arm])
        self.n[arm] += 1
        self.w[arm] += float(reward)


class UCTScheduler:
    """UCT over mutators (level 1) and the class each mutator aims at (level 2)."""

    def __init__(self, names: Sequence[str] = (), c: float = C_UCT):
        self.names = list(names)
        self.c = c
        self.root = _Node()
        self.root.add(self.names)
        self.children: Dict[str, _Node] = {}
        # choices made but not yet rewarded, in order: [mutator, sub-choice or None]
        self.pending: Deque[list] = deque()

    def bind(self, names: Sequence[str]) -> "UCTScheduler":
        return UCTScheduler(names, self.c)

    def choose(self, rng: np.random.Generator) -> str:
        name = self.root.select(self.names, rng, self.c)
        self.pending.append([name, None])
        return name

    def sub(self, name: str, options: Sequence[str], rng: np.random.Generator) -> Optional[str]:
        """Second level: which of ``options`` mutator ``name`` should aim at now."""
        options = list(options)
        if not options:
            return None
        pick = self.children.setdefault(name, _Node()).select(options, rng, self.c)
        for entry in reversed(self.pending):
            if entry[0] == name and entry[1] is None:
                entry[1] = pick
                break
        return pick

    def update(self, name: str, reward: float) -> None:
        reward = min(1.0, max(0.0, float(reward)))
        self.root.record(name, reward)
        for i, entry in enumerate(self.pending):
            if entry[0] == name:
                del self.pending[i]
                if entry[1] is not None:
                    self.children[name].record(entry[1], reward)
                break

    def stats(self) -> Dict[str, Any]:
        """Tries and mean reward per arm (for ``Finding.coverage['schedule']``)."""
        def node(nd: _Node) -> dict:
            return {a: [nd.n[a], round(nd.w[a] / nd.n[a], 4) if nd.n[a] else 0.0] for a in nd.arms if nd.n[a]}

        out = {"mutators": node(self.root)}
        subs = {k: node(v) for k, v in self.children.items() if any(v.n.values())}
        if subs:
            out["targets"] = subs
        return out


def make_scheduler(kind: str, names: Sequence[str]):
    if kind == "uct":
        return UCTScheduler(names)
    if kind == "uniform":
        return UniformScheduler(names)
    raise ValueError(f"unknown scheduler {kind!r} (use {', '.join(SCHEDULERS)})")


# ---------------------------------------------------------------------------------------
# across tasks
# ---------------------------------------------------------------------------------------
@dataclass
class Allocation:
    """Budgeted tasks in the order to run them, and what the budget could not cover."""

    tasks: List[Task]
    priority: Dict[str, float] = field(default_factory=dict)  # task id -> priority
    cost: Dict[str, float] = field(default_factory=dict)  # task id -> estimated seconds / evaluation
    gaps: Dict[str, float] = field(default_factory=dict)  # task id -> uncovered share of classes
    not_covered: List[Dict[str, str]] = field(default_factory=list)  # [{task, reason}]
    total_seconds: float = 0.0

    def to_dict(self) -> dict:
        return {
            "total_seconds": self.total_seconds,
            "tasks": [{"task": t.id, "seconds": round(t.budget.seconds or 0.0, 3),
                       "priority": round(self.priority.get(t.id, 0.0), 4),
                       "cost": self.cost.get(t.id), "gap": round(self.gaps.get(t.id, 0.0), 4)} for t in self.tasks],
            "not_covered": list(self.not_covered),
        }

    @classmethod
    def from_dict(cls, raw: dict, tasks: Sequence[Task]) -> "Allocation":  # pragma: no cover - convenience
        by_id = {t.id: t for t in tasks}
        out = []
        for row in raw.get("tasks", []):
            t = by_id[row["task"]]
            out.append(Task(op=t.op, variant=t.variant, budget=Budget(seconds=row["seconds"]), seed=t.seed,
                            strategy=t.strategy))
        return cls(tasks=out, priority={r["task"]: r["priority"] for r in raw.get("tasks", [])},
                   not_covered=list(raw.get("not_covered", [])), total_seconds=raw.get("total_seconds", 0.0))


def estimate_cost(task: Task) -> float:
    """Seconds per evaluation, estimated from the spec alone: a fixed overhead plus a term in
    the number of input elements at the dims' typical size (geometric mean of the drawn ranges;
    a dim's reach is left out: the few candidates aimed at it are capped at
    :data:`gate.search.inputs.MAX_ELEMENTS`, and counting it made three dims reaching 4096 look
    like 0.7 s an evaluation, so a run covered one variant of each operator and left 73 of its
    120 s unspent)."""
    from .coverage import dim_envelope

    env = dim_envelope(task.op, reach=False)
    typical = {k: max(1.0, math.sqrt(max(lo, 1.0) * (hi if math.isfinite(hi) else max(lo, 1.0) * 16)))
               for k, (lo, hi) in env.items()}
    numel = 0.0
    for t in task.op.inputs:
        n = 1.0
        for e in t.shape:
            n *= float(e) if isinstance(e, (int, float)) else typical.get(e, 8.0) if isinstance(e, str) else 8.0
        numel += n
    per_elem = {"conv": 40.0, "linear": 20.0, "attention": 40.0}.get(task.op.kind, 1.0)
    overhead = 4e-4 if task.variant.mode == "input" else 6e-4
    return overhead + 2e-8 * numel * per_elem


def allocate(
    tasks: Sequence[Task],
    total_seconds: float,
    *,
    min_seconds: float = 1.0,
    min_evals: int = 200,
    coverage: Optional[Mapping[str, float]] = None,
    history: Optional[Mapping[str, float]] = None,
    cost: Optional[Mapping[str, float]] = None,
) -> Allocation:
    """Order ``tasks`` and split ``total_seconds`` among them.

    ``coverage``: task id (or op name) -> share of value classes already covered (e.g. by
    stored seeds or an earlier run's ``Finding.coverage['classes']['ratio']``); default 0.
    ``history``: task id (or op name) -> last error over its gate threshold (>= 1 means it
    failed or came close); default 0. ``cost``: seconds per evaluation, measured; default
    :func:`estimate_cost`. A task needs ``max(min_seconds, min_evals x cost)`` to be worth
    running, at most its operator's even share of the total; priority is ``(1 + gap) x (1 + history)``, per unit of that need, taken round-robin
    over operators (each operator's best variant first)."""
    if total_seconds <= 0:
        raise ValueError("total budget must be positive")
    coverage, history, cost = dict(coverage or {}), dict(history or {}), dict(cost or {})

    def look(table: Mapping[str, float], t: Task, default: float) -> float:
        return float(table.get(t.id, table.get(t.op.name, default)))

    alloc = Allocation(tasks=[], total_seconds=total_seconds)
    by_op: Dict[str, List[Task]] = {}
    for t in tasks:
        by_op.setdefault(t.op.name, []).append(t)
    # no variant needs more than its operator's even share of the total: an operator whose
    # evaluations take a second each (an attention at a sequence of 2048, lucidrains'
    # memory-efficient-attention) is searched with fewer of them, never left out altogether
    # (its 200 evaluations "needed" 200 s of a 120-s total: the run searched nothing, exit 2)
    fair = max(min_seconds, total_seconds / max(1, len(by_op)))
    need: Dict[str, float] = {}
    for t in tasks:
        c = look(cost, t, estimate_cost(t))
        gap = 1.0 - min(1.0, max(0.0, look(coverage, t, 0.0)))
        hist = max(0.0, look(history, t, 0.0))
        alloc.cost[t.id] = round(c, 6)
        alloc.gaps[t.id] = gap
        need[t.id] = max(min_seconds, min(min_evals * c, fair))
        alloc.priority[t.id] = (1.0 + gap) * (1.0 + min(hist, 10.0))
    # round-robin over operators: every operator's most promising variant before any
    # operator's second one (a budget that covers a few variants covers a few operators)
    value = {t.id: alloc.priority[t.id] / need[t.id] for t in tasks}
    rank: Dict[str, int] = {}
    for group in by_op.values():
        for i, t in enumerate(sorted(group, key=lambda t: (-value[t.id], t.id))):
            rank[t.id] = i
    order = sorted(tasks, key=lambda t: (rank[t.id], -value[t.id], t.id))
    left = total_seconds
    chosen: List[Task] = []
    for t in order:
        if need[t.id] <= left + 1e-9:
            chosen.append(t)
            left -= need[t.id]
        else:
            alloc.not_covered.append({"task": t.id, "reason": f"needs {need[t.id]:.2g}s, {max(left, 0):.2g}s left"})
    weight = sum(alloc.priority[t.id] for t in chosen) or 1.0
    for t in sorted(chosen, key=lambda t: (-alloc.priority[t.id], t.id)):
        seconds = need[t.id] + left * alloc.priority[t.id] / weight
        alloc.tasks.append(Task(op=t.op, variant=t.variant, budget=Budget(seconds=seconds, evals=t.budget.evals),
                                seed=t.seed, strategy=t.strategy))
    return alloc


__all__ = ["UCTScheduler", "make_scheduler", "allocate", "Allocation", "estimate_cost", "SCHEDULERS", "C_UCT"]
