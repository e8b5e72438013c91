"""The search loop (Predoo's, generalised). It sees candidates and numbers only.

    corpus <- seeds
    until the budget is spent:
        candidate <- fresh draw (exploration, or every time for ``random`` guidance)
                     or mutate(pick(corpus)) with a mutator chosen by the scheduler
        score <- evaluate(candidate)
        keep the candidate if it beats its parent; remember the best

Deterministic for a given seed and an evaluation budget.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .score import fitness
from .inputs import Candidate
from .evaluation import CRASH, INVALID, UNSUPPORTED, Evaluation

GUIDANCES = ("linf", "l1", "random", "spread")  # spread: NaN/Inf search (gate.oracles.nansearch)


class UniformScheduler:
    """Chooses mutators uniformly at random (the control arm; see gate.search.schedule)."""

    def __init__(self, names: Sequence[str]):
        self.names = list(names)

    def choose(self, rng: np.random.Generator) -> str:
        return self.names[int(rng.integers(len(self.names)))]

    def update(self, name: str, reward: float) -> None:
        pass


@dataclass
class CrashRecord:
    signature: str
    message: str
    count: int = 0
    first_eval: int = 0
    candidate: Optional[Candidate] = None


@dataclass
class SearchResult:
    best: Optional[Candidate] = None
    best_eval: Optional[Evaluation] = None
    best_fitness: float = -math.inf
    #: the worst input with a finite fitness (a precision error rather than NaN/Inf): the search
    #: goes on after a NaN/Inf, which nothing can beat, so a precision error is not hidden by it
    best_finite: Optional[Candidate] = None
    best_finite_eval: Optional[Evaluation] = None
    best_finite_fitness: float = -math.inf
    evals: int = 0
    seconds: float = 0.0
    #: seconds of the first evaluation, which the time budget does not count: a worker's first
    #: call pays what later calls do not (a Triton or CUDA kernel compiled, a CUDA context made,
    #: the autograd engine's threads started, lazy imports), up to seconds on a GPU runner
    warmup: float = 0.0
    invalid: int = 0
    invalid_example: Optional[str] = None
    unsupported: Optional[str] = None
    crashes: Dict[str, CrashRecord] = field(default_factory=dict)
    trajectory: List[Tuple[int, float]] = field(default_factory=list)
    corpus: List[Tuple[float, Candidate]] = field(default_factory=list)
    mutator_stats: Dict[str, List[int]] = field(default_factory=dict)  # name -> [tries, improvements]
    mutator_errors: Optional[str] = None  # the first exception a mutator raised (the step was skipped)


def search(
    evaluate: Callable[[Candidate], Tuple[Candidate, Evaluation]],
    fresh: Callable[[np.random.Generator], Candidate],
    mutators: Dict[str, Callable],
    rng: np.random.Generator,
    *,
    seconds: Optional[float] = None,
    evals: Optional[int] = None,
    min_evals: Optional[int] = None,
    max_seconds: Optional[float] = None,
    guidance: str = "linf",
    seeds: Sequence[Candidate] = (),
    n_seeds: int = 4,
    explore: float = 0.1,
    corpus_size: int = 32,
    scheduler=None,
    progress: Optional[Callable[[int, float], None]] = None,
    stop_on_inf: bool = False,
    evaluate_many: Optional[Callable[[List[Candidate]], List[Tuple[Candidate, Evaluation]]]] = None,
    batch: int = 1,
    novelty: Optional[Callable[[Candidate, Evaluation], float]] = None,
    on_best: Optional[Callable[[Candidate, Evaluation, float], None]] = None,
) -> SearchResult:
    """Search for the candidate with the largest fitness.

    ``evaluate_many`` + ``batch`` > 1: a mutation step makes ``batch`` children of the same
    parent and evaluates them in one call (see :mod:`gate.oracles.batch`); they are then taken in
    order exactly as if they had been evaluated one by one. ``novelty(q, ev)`` returns a bonus
    in [0, 1] (new coverage) added to the scheduler's reward. ``on_best(q, ev, fitness)`` is
    called on every new best. A NaN/Inf (infinite fitness) becomes the best but never a parent:
    the search goes on with the finite corpus and keeps the worst finite input too
    (``best_finite``); ``stop_on_inf`` ends it at the first one instead."""
    if guidance not in GUIDANCES:
        raise ValueError(f"unknown guidance {guidance!r} (use {', '.join(GUIDANCES)})")
    if seconds is None and evals is None:
        evals = 100
    loop = _Loop(evaluate, fresh, mutators, rng, seconds=seconds, evals=evals, guidance=guidance, seeds=seeds,
                 min_evals=min_evals, max_seconds=max_seconds,
                 n_seeds=n_seeds, explore=explore, corpus_size=corpus_size,
                 scheduler=scheduler or UniformScheduler(list(mutators)), progress=progress, stop_on_inf=stop_on_inf,
                 evaluate_many=evaluate_many, batch=batch, novelty=novelty, on_best=on_best)
    return loop.run()


class _Loop:
    """The state of one :func:`search`: the queue of seeds, the corpus, the batch taken ahead."""

    def __init__(self, evaluate, fresh, mutators, rng, *, seconds, evals, guidance, seeds, n_seeds, explore,
                 corpus_size, scheduler, progress, stop_on_inf, evaluate_many, batch, novelty, on_best,
                 min_evals=None, max_seconds=None):
        self.evaluate, self.fresh, self.mutators, self.rng = evaluate, fresh, mutators, rng
        self.seconds, self.evals, self.guidance = seconds, evals, guidance
        self.min_evals, self.max_seconds = min_evals, max_seconds
        self.explore, self.corpus_size, self.scheduler = explore, corpus_size, scheduler
        self.progress, self.stop_on_inf, self.on_best = progress, stop_on_inf, on_best
        self.evaluate_many, self.batch, self.novelty = evaluate_many, batch, novelty
        self.res = SearchResult()
        self.t0 = time.perf_counter()
        self.clock0 = self.t0  # the budget's clock: starts again once the first evaluation is in
        self.queue: List[Candidate] = list(seeds)
        self.n_fresh_seeds = max(0, n_seeds - len(self.queue)) if guidance != "random" else 0
        self.consecutive_unsupported = 0
        self.prefetched: List[tuple] = []  # (mut_name, parent_fit, q, ev) evaluated in a batch, not yet taken

    def run(self) -> SearchResult:
        while not self.spent():
            mut_name, parent_fit, q, ev = self.step()
            self.res.evals += 1
            if self.res.evals == 1:  # a one-off warm-up must not be the variant's whole share
                self.clock0 = time.perf_counter()
                self.res.warmup = self.clock0 - self.t0
            if self.take(mut_name, parent_fit, q, ev):
                break
        self.res.seconds = time.perf_counter() - self.t0
        return self.res

    def spent(self) -> bool:
        if self.evals is not None and self.res.evals >= self.evals:
            return True
        if self.seconds is not None:
            took = time.perf_counter() - self.clock0
            if took < self.seconds:
                return False
            # past its share: a search short of its minimum goes on within the hard limit
            short = self.min_evals is not None and self.res.evals < self.min_evals
            return not (short and (self.max_seconds is None or took < self.max_seconds))
        return False

    # -- one step: the next candidate, evaluated -------------------------------------------------
    def step(self) -> tuple:
        """(mutator or None, parent's fitness, quantised candidate, evaluation)."""
        if self.prefetched:
            return self.prefetched.pop(0)
        mut_name, parent_fit, parent, cand = self.next_candidate()
        res, rng = self.res, self.rng
        width = min(self.batch, (self.evals - res.evals) if self.evals is not None else self.batch)
        if self.evaluate_many is not None and mut_name is not None and width > 1:
            items = [(mut_name, cand)]
            for _ in range(width - 1):
                name = self.scheduler.choose(rng)
                child = _apply(self.mutators[name], parent, rng, res)
                if child is None:
                    self.scheduler.update(name, 0.0)
                else:
                    items.append((name, child))
            results = self.evaluate_many([c for _, c in items])
            self.prefetched = [(n, parent_fit, rq, rev) for (n, _), (rq, rev) in zip(items, results)]
            return self.prefetched.pop(0)
        q, ev = self.evaluate(cand)
        return mut_name, parent_fit, q, ev

    def next_candidate(self) -> tuple:
        """(mutator or None, parent's fitness, parent or None, candidate): a seed, a fresh draw or a mutant."""
        res, rng = self.res, self.rng
        parent_fit, parent, mut_name = -math.inf, None, None
        if self.queue:
            cand = self.queue.pop(0)
        elif self.n_fresh_seeds > 0 or self.guidance == "random" or not res.corpus or rng.random() < self.explore:
            self.n_fresh_seeds = max(0, self.n_fresh_seeds - 1)
            cand = self.fresh(rng)
        else:
            parent_fit, parent = _pick(res.corpus, rng)
            mut_name = self.scheduler.choose(rng)
            cand = _apply(self.mutators[mut_name], parent, rng, res)
            if cand is None:
                self.scheduler.update(mut_name, 0.0)
                cand = self.fresh(rng)
                mut_name = None
        return mut_name, parent_fit, parent, cand

    # -- taking the result -----------------------------------------------------------------------
    def take(self, mut_name, parent_fit: float, q: Candidate, ev: Evaluation) -> bool:
        """Book one evaluation; True ends the search."""
        bonus = self.novelty(q, ev) if self.novelty is not None else 0.0
        if mut_name is not None:
            st = self.res.mutator_stats.setdefault(mut_name, [0, 0])
            st[0] += 1
        if ev.status == UNSUPPORTED:
            return self.unsupported(mut_name, ev)
        self.consecutive_unsupported = 0
        if ev.status == INVALID:
            return self.invalid(mut_name, ev)
        if ev.status == CRASH:
            self.crash(mut_name, q, ev, bonus)
            return False
        return self.scored(mut_name, parent_fit, q, ev, bonus)

    def unsupported(self, mut_name, ev: Evaluation) -> bool:
        if mut_name is not None:
            self.scheduler.update(mut_name, 0.0)
        self.consecutive_unsupported += 1
        if self.consecutive_unsupported >= 3 and self.res.best_eval is None:
            self.res.unsupported = ev.error
            return True
        return False

    def invalid(self, mut_name, ev: Evaluation) -> bool:
        res = self.res
        res.invalid += 1
        res.invalid_example = res.invalid_example or ev.error
        if mut_name is not None:
            self.scheduler.update(mut_name, 0.0)
        return res.invalid >= 50 and res.best_eval is None and not res.crashes

    def crash(self, mut_name, q: Candidate, ev: Evaluation, bonus: float) -> None:
        res = self.res
        rec = res.crashes.get(ev.signature or "")
        if rec is None:
            rec = res.crashes[ev.signature or ""] = CrashRecord(
                signature=ev.signature or "", message=ev.error or "", first_eval=res.evals, candidate=q)
            if mut_name is not None:
                self.scheduler.update(mut_name, 1.0)
        elif mut_name is not None:
            self.scheduler.update(mut_name, min(1.0, bonus))
        rec.count += 1

    def scored(self, mut_name, parent_fit: float, q: Candidate, ev: Evaluation, bonus: float) -> bool:
        res, guidance = self.res, self.guidance
        if "fitness" in ev.extra:  # the runner scored it itself (e.g. against base: gate.judge.contrast)
            fit = float(ev.extra["fitness"])
        else:
            fit = fitness(ev.metrics, guidance) if guidance != "random" else fitness(ev.metrics, "linf")
        improved = fit > res.best_fitness
        if mut_name is not None:
            gain = 0.0
            if fit > parent_fit:
                gain = 1.0 if math.isinf(fit) else min(1.0, (fit - max(parent_fit, 0.0)) / (abs(fit) + 1e-12))
                res.mutator_stats[mut_name][1] += 1
            self.scheduler.update(mut_name, min(1.0, gain + bonus))
        if not math.isinf(fit) and fit > res.best_finite_fitness:
            res.best_finite, res.best_finite_eval, res.best_finite_fitness = q, ev, fit
        if guidance != "random" and (fit > parent_fit or not res.corpus) and (not math.isinf(fit) or not res.corpus):
            res.corpus.append((fit, q))
            res.corpus.sort(key=lambda x: -x[0] if not math.isnan(x[0]) else math.inf)
            del res.corpus[self.corpus_size:]
        if improved:
            res.best, res.best_eval, res.best_fitness = q, ev, fit
            res.trajectory.append((res.evals, fit))
            if self.on_best is not None:
                self.on_best(q, ev, fit)
            if self.progress:
                self.progress(res.evals, fit)
            if self.stop_on_inf and math.isinf(fit):
                return True
        elif self.progress and res.evals % 10 == 0:
            self.progress(res.evals, res.best_fitness)
        return False


def _apply(mutator, parent: Candidate, rng: np.random.Generator, res: SearchResult) -> Optional[Candidate]:
    """A mutator that fails on an unusual parent (a seed from a library's own tests) does not
    end the search: the step counts as "not applicable" and the failure is remembered."""
    try:
        return mutator(parent, rng)
    except Exception as exc:
        res.mutator_errors = res.mutator_errors or f"{type(exc).__name__}: {exc}"[:300]
        return None


def _pick(corpus: List[Tuple[float, Candidate]], rng: np.random.Generator) -> Tuple[float, Candidate]:
    """Tournament of two, biased to the best (the corpus is kept sorted, best first)."""
    i = int(min(rng.integers(len(corpus)), rng.integers(len(corpus))))
    return corpus[i]
