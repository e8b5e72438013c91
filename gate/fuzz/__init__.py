"""Fuzz: Task -> Finding. Seeds, mutations and guidance; the loop itself is framework-blind
(:mod:`gate.search.engine`), the glue to a backend is :mod:`gate.oracles.runner`."""
from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Callable, Optional, Sequence

import numpy as np

from ..plan import Task
from ..search.engine import GUIDANCES, CrashRecord, search
from ..search.finding import Crash, Finding
from ..search.inputs import Candidate, draw
from ..search.mutate import MUTATORS, PREDOO_MUTATORS, bind
from ..oracles.registry import RUNNERS, build_runner
from ..search.evaluation import CRASH, OK


def fuzz_task(
    task: Task,
    *,
    seeds: Sequence[Candidate] = (),
    progress: Optional[Callable[[int, float], None]] = None,
    runner=None,
    mutators: Optional[Sequence[str]] = None,
    scheduler=None,
    seed_store=None,
    coverage: bool = True,
    batch: Optional[int] = None,
    max_seeds: int = 16,
    on_best: Optional[Callable] = None,
    isolate=None,
    stop_on_inf: bool = False,
    exhaustive: bool = True,
) -> Finding:
    """Search ``task``'s variant for the input with the largest error of its oracle
    (``task.variant.oracle``, dispatched through :data:`gate.oracles.registry.RUNNERS`; the
    oracle's runner may impose the candidate spec, the guidance and extra mutators).
    ``isolate`` (True or :class:`gate.backends.isolate.IsolateOptions`) runs every evaluation in a
    worker process that may crash or hang without taking the gate down.

    ``scheduler``: ``"uct"`` (default for guided strategies), ``"uniform"`` (the control arm)
    or an object with ``choose``/``update``. ``seeds`` run first, all of them, in order; then
    the seeds of ``seed_store`` (a :class:`gate.search.seeds.SeedStore`: calls harvested from the
    project's tests, PyTorch OpInfo samples), most novel value classes first, at most
    ``max_seeds``. ``coverage``: draw fresh inputs aimed at uncovered
    value classes and pairs, reward the scheduler for new coverage, report it in
    ``Finding.coverage['classes']``. ``batch``: children evaluated per call for batch-separable
    specs (default 8 when the spec declares ``batch_dim`` and every input is batched; 1 turns
    batching off).
    ``on_best(q, ev, fitness)`` is called on every new best (streaming, benchmarks).
    ``stop_on_inf``: end the search at the first NaN/Inf (nothing can beat it). By default the
    search goes on, so that a precision error elsewhere is found too (``Finding.best_finite``):
    a NaN/Inf the base produces as well must not hide a new precision regression.
    ``exhaustive``: an elementwise row at a 16-bit dtype runs every value of the dtype first
    (:mod:`gate.fuzz.exhaustive`: the exact maximum); the search gets the rest of the budget."""
    own_runner = runner is None
    runner = runner or build_runner(task.op, task.variant, isolate=isolate)
    try:
        return _fuzz(task, runner, seeds=seeds, progress=progress, mutators=mutators, scheduler=scheduler,
                     seed_store=seed_store, coverage=coverage, batch=batch, max_seeds=max_seeds, on_best=on_best,
                     stop_on_inf=stop_on_inf, exhaustive=exhaustive)
    finally:
        if own_runner and hasattr(runner, "close"):
            runner.close()


def _fuzz(task: Task, runner, *, seeds, progress, mutators, scheduler, seed_store, coverage, batch, max_seeds,
          on_best, stop_on_inf, exhaustive=True) -> Finding:
    # the oracle's hooks: the space candidates come from, an imposed guidance, extra mutators
    spec = getattr(runner, "search_spec", None) or task.op
    guidance = getattr(runner, "guidance", None) or task.strategy
    stop_on_inf = getattr(runner, "stop_on_inf", None) or stop_on_inf
    runner.backend.seed(task.seed)
    rng = np.random.default_rng(task.rng_seed())
    dtype = task.variant.dtype
    scheduler, bound = _mutators(runner, spec, dtype, guidance, mutators, scheduler)
    cov, novelty, fresh = _coverage(spec, dtype, guidance, coverage)
    seed_list, seed_info = _seeds(spec, dtype, seeds, seed_store, max_seeds)
    evaluator, width = _batching(runner, batch)
    ex, seconds = _exhaustive(task, runner, exhaustive)
    with np.errstate(all="ignore"), _search_figures(runner, guidance):  # float64 references overflow on edge inputs: that is data, not noise
        res = search(
            runner.evaluate,
            fresh,
            bound,
            rng,
            seconds=seconds,
            evals=task.budget.evals,
            min_evals=task.budget.min_evals,
            max_seconds=(None if task.budget.max_seconds is None or seconds is None
                         else max(seconds, task.budget.max_seconds - (task.budget.seconds - seconds))),
            guidance=guidance,
            seeds=seed_list,
            scheduler=scheduler,
            progress=progress,
            evaluate_many=evaluator.evaluate_many if evaluator is not None and evaluator.enabled and width > 1 else None,
            batch=width,
            novelty=novelty if cov is not None else None,
            on_best=on_best,
            stop_on_inf=stop_on_inf,
        )
    with np.errstate(all="ignore"):
        batched = width > 1 and evaluator is not None and evaluator.enabled
        # report the figures of the best inputs run alone, as the judge will replay them, and with
        # every figure (the search measured only those it is guided by)
        res.best_eval = _alone(runner, res.best, res.best_eval, batched, res)
        res.best_finite_eval = res.best_eval if res.best_finite is res.best else \
            _alone(runner, res.best_finite, res.best_finite_eval, False, res)
    best, best_eval, best_fin, best_fin_eval = _with_exhaustive(ex, res, res.best_eval)
    finding = _finding(task, runner, guidance, res, best, best_eval, best_fin, best_fin_eval)
    _add_exhaustive(finding, ex)
    _add_coverage(finding, res, cov, scheduler, seed_info, evaluator, width)
    return finding


@contextlib.contextmanager
def _search_figures(runner, guidance: str):
    """While the search runs, the runner measures only the figures the search is guided by
    (``figures="search"``: no relative error, no spread; ``"max"`` for a search guided by the
    largest error: no sums either); the NaN search needs the spread."""
    if guidance == "spread" or not hasattr(runner, "figures"):
        yield
        return
    before = runner.figures
    runner.figures = "search" if guidance == "l1" else "max"
    try:
        yield
    finally:
        runner.figures = before


def _alone(runner, cand, ev, batched: bool, res):
    """The figures of ``cand`` as the judge will replay them: a batched evaluation is replaced by
    the input run alone; a search's partial one (``figures="search"``: no ``rel``, no ``spread``;
    ``"max"``: no ``l1``, no ``mean_ulp`` either) keeps its own figures and takes those from the
    run alone. Where that run does not come
    back OK the search's evaluation stands (``rel``/``spread`` NaN: not measured) and a crash is
    booked as the search books one."""
    if cand is None or ev is None or ev.status != OK or ev.metrics is None:
        return ev
    if not batched and not math.isnan(ev.metrics.rel):
        return ev
    _, alone = runner.evaluate(cand, quantized=True)
    if alone.status == CRASH:
        rec = res.crashes.setdefault(alone.signature or "", CrashRecord(
            signature=alone.signature or "", message=alone.error or "", first_eval=res.evals, candidate=cand))
        rec.count += 1
    if alone.status != OK or alone.metrics is None:
        return ev
    if batched:
        return alone
    m = alone.metrics
    ev.metrics = dataclasses.replace(ev.metrics, rel=m.rel, spread=m.spread,
                                     **({"l1": m.l1, "mean_ulp": m.mean_ulp} if math.isnan(ev.metrics.mean_ulp) else {}))
    return ev


def _mutators(runner, spec, dtype: str, guidance: str, mutators, scheduler):
    """(the scheduler, the mutators bound to ``spec``): the engine's table plus the oracle's own."""
    from ..search.schedule import make_scheduler

    extra_mutators = dict(getattr(runner, "extra_mutators", None) or {})
    names = list(mutators or MUTATORS) + [n for n in extra_mutators if not mutators or n not in mutators]
    table = {**MUTATORS, **extra_mutators}
    if scheduler is None:
        scheduler = "uniform" if guidance == "random" else "uct"
    if isinstance(scheduler, str):
        scheduler = make_scheduler(scheduler, names)
    elif hasattr(scheduler, "bind"):
        scheduler = scheduler.bind(names)
    if hasattr(scheduler, "sub"):
        choose = scheduler.sub
    else:
        def choose(name, options, r):
            return options[int(r.integers(len(options)))] if options else None
    return scheduler, {n: bind(table[n], spec, dtype=dtype, choose=choose, name=n) for n in names}


def _coverage(spec, dtype: str, guidance: str, coverage: bool):
    """(the coverage map or None, the novelty reward, the fresh-input drawer)."""
    from ..search.coverage import CoverageMap

    cov = CoverageMap(spec, dtype) if coverage else None

    def novelty(q: Candidate, ev) -> float:
        if cov is None or ev.status not in (OK, CRASH):
            return 0.0
        singles, pairs = cov.observe(q)
        return min(1.0, 0.5 * singles + 0.05 * pairs)

    if cov is not None and guidance != "random":
        fresh = lambda r: cov.draw(r)  # noqa: E731
    else:
        fresh = lambda r: draw(spec, r)  # noqa: E731
    return cov, novelty, fresh


def _seeds(spec, dtype: str, seeds, seed_store, max_seeds: int):
    """(the seeds to run first, where they came from)."""
    seed_list = list(seeds)  # given seeds run first, all of them, in their order
    seed_info = {"given": len(seed_list)}
    if seed_store is not None:
        from ..search.seeds import prioritise

        stored = seed_store.load(spec)
        seed_info.update(seed_store.last_sources)
        seed_list += prioritise(spec, stored, dtype, limit=max_seeds)
    seed_info["used"] = len(seed_list)
    return seed_list, seed_info


def _batching(runner, batch: Optional[int]):
    """(the runner's batch evaluator or None, the batch width)."""
    # batching concatenates candidates into one call: only where the runner offers it (precision)
    make_batch = getattr(runner, "batch_evaluator", None)
    evaluator = make_batch() if make_batch is not None else None
    batchable = evaluator is not None
    width = 1 if not batchable else (batch if batch is not None else (8 if evaluator.pays else 1))
    return evaluator, width


def _exhaustive(task: Task, runner, exhaustive: bool):
    """(the exhaustive run over every value of a 16-bit dtype or None, the seconds left to the search)."""
    from . import exhaustive as EX

    ex = None
    seconds = task.budget.seconds
    if exhaustive and EX.applies(task.op, task.variant):
        with np.errstate(all="ignore"):
            ex = EX.run(runner, task.op, task.variant)  # every value of the dtype: the exact maximum
        if seconds is not None:
            seconds = max(0.0, seconds - ex.seconds)  # the search gets what is left
    return ex, seconds


def _with_exhaustive(ex, res, best_eval):
    """(best, its evaluation, best finite, its evaluation) of the search merged with the exhaustive run."""
    best, best_fin, best_fin_eval = res.best, res.best_finite, res.best_finite_eval
    if best_fin is best:
        best_fin = best_fin_eval = None
    if ex is not None and ex.best_eval is not None:
        # the exact maximum over every value: it is the finding unless the search found worse
        # (a length-dependent path, a crash); the one-value witness is what gets replayed first
        em = ex.best_eval.metrics
        worst = ex.worst
        witness = (worst.nonfinite_witness if em.nonfinite else None) or worst.witness
        if best_eval is None or (em.severity, em.abs) >= (best_eval.metrics.severity, best_eval.metrics.abs):
            if not em.nonfinite:
                best_fin = best_fin_eval = None  # the exact finite maximum supersedes the search's
            elif best_fin is None and best_eval is not None and not best_eval.metrics.nonfinite:
                best_fin, best_fin_eval = best, best_eval
            best, best_eval = witness or ex.candidates[0], ex.best_eval
    return best, best_eval, best_fin, best_fin_eval


def _finding(task: Task, runner, guidance: str, res, best, best_eval, best_fin, best_fin_eval) -> Finding:
    status, message = "ok", None
    if res.unsupported and best_eval is None:
        status, message = "unsupported", res.unsupported
    elif best_eval is None and not res.crashes:
        status, message = "no-valid-input", res.invalid_example
    finding = Finding(
        op=task.op.name,
        framework=task.op.framework,
        variant=task.variant,
        strategy=guidance,
        seed=task.seed,
        evals=res.evals,
        seconds=res.seconds,
        warmup=res.warmup,
        status=status,
        metrics=best_eval.metrics if best_eval else None,
        best=best,
        crashes=[Crash(c.signature, c.message, c.count, c.candidate) for c in res.crashes.values()],
        invalid=res.invalid,
        message=message,
        trajectory=[[e, f] for e, f in res.trajectory],
        env=runner.backend.environment(task.variant.device),
        extra=dict(best_eval.extra) if best_eval is not None else {},
    )
    if best_fin is not None and best_fin_eval is not None:
        finding.best_finite, finding.finite_metrics = best_fin, best_fin_eval.metrics
    return finding


def _add_exhaustive(finding: Finding, ex) -> None:
    if ex is not None:
        finding.extra["exhaustive"] = ex.summary()  # per set: its figures, or why it did not run
        finding.seconds += ex.seconds
        if ex.best_eval is not None:  # measured: the exact maximum, replayed on head and base
            finding.exhaustive = [*ex.witnesses, *ex.candidates]
            finding.extra["search"] = "exhaustive"
            finding.evals += sum(s.values for s in ex.sets if s.metrics is not None)


def _add_coverage(finding: Finding, res, cov, scheduler, seed_info: dict, evaluator, width: int) -> None:
    finding.coverage["mutators"] = {k: list(v) for k, v in res.mutator_stats.items()}
    if res.mutator_errors:
        finding.coverage["mutator_error"] = res.mutator_errors
    if cov is not None:
        finding.coverage["classes"] = cov.report()
    if hasattr(scheduler, "stats"):
        finding.coverage["schedule"] = scheduler.stats()
    finding.coverage["seeds"] = seed_info
    if evaluator is not None:
        finding.coverage["batch"] = {"width": width if evaluator.enabled else 1, "calls": evaluator.calls,
                                     "default": 8 if evaluator.pays else 1}


__all__ = ["fuzz_task", "Finding", "Crash", "Candidate", "GUIDANCES", "MUTATORS", "PREDOO_MUTATORS", "RUNNERS",
           "build_runner"]
