"""Fuzz: Task -> Finding. Seeds, mutations and guidance; the loop itself is framework-blind
(:mod:`gate.fuzz.engine`), the glue to a backend is :mod:`gate.fuzz.runner`."""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np

from ..plan import Task
from .engine import GUIDANCES, search
from .finding import Crash, Finding
from .inputs import Candidate, draw
from .mutate import MUTATORS, PREDOO_MUTATORS
from .registry import RUNNERS, build_runner
from .runner import VariantRunner


def fuzz_task(
    task: Task,
    *,
    seeds: Sequence[Candidate] = (),
    progress: Optional[Callable[[int, float], None]] = None,
    runner: Optional[VariantRunner] = None,
    mutators: Optional[Sequence[str]] = None,
    scheduler=None,
    isolate=None,
) -> Finding:
    """Search ``task``'s variant for the input with the largest error of its oracle
    (``task.variant.oracle``, dispatched through :data:`gate.fuzz.registry.RUNNERS`).
    ``isolate`` (True or :class:`gate.fuzz.isolate.IsolateOptions`) runs every evaluation in a
    worker process that may crash or hang without taking the gate down."""
    own_runner = runner is None
    runner = runner or build_runner(task.op, task.variant, isolate=isolate)
    try:
        return _fuzz(task, runner, seeds=seeds, progress=progress, mutators=mutators, scheduler=scheduler)
    finally:
        if own_runner and hasattr(runner, "close"):
            runner.close()


def _fuzz(task: Task, runner, *, seeds, progress, mutators, scheduler) -> Finding:
    # the oracle's hooks: the space candidates come from, an imposed guidance, extra mutators
    spec = getattr(runner, "search_spec", None) or task.op
    guidance = getattr(runner, "guidance", None) or task.strategy
    runner.backend.seed(task.seed)
    rng = np.random.default_rng(task.rng_seed())
    names = list(mutators or MUTATORS)
    bound = {n: (lambda m: (lambda c, r: m(c, spec, r)))(MUTATORS[n]) for n in names}
    for n, m in (getattr(runner, "extra_mutators", None) or {}).items():
        bound[n] = (lambda m: (lambda c, r: m(c, spec, r)))(m)
        names.append(n)
    if scheduler is not None and hasattr(scheduler, "bind"):
        scheduler = scheduler.bind(names)
    res = search(
        runner.evaluate,
        lambda r: draw(spec, r),
        bound,
        rng,
        seconds=task.budget.seconds,
        evals=task.budget.evals,
        guidance=guidance,
        seeds=seeds,
        scheduler=scheduler,
        progress=progress,
    )
    status, message = "ok", None
    if res.unsupported and res.best_eval is None:
        status, message = "unsupported", res.unsupported
    elif res.best_eval is None and not res.crashes:
        status, message = "no-valid-input", res.invalid_example
    finding = Finding(
        op=task.op.name,
        framework=task.op.framework,
        variant=task.variant,
        strategy=guidance,
        seed=task.seed,
        evals=res.evals,
        seconds=res.seconds,
        status=status,
        metrics=res.best_eval.metrics if res.best_eval else None,
        best=res.best,
        crashes=[Crash(c.signature, c.message, c.count, c.candidate) for c in res.crashes.values()],
        invalid=res.invalid,
        message=message,
        trajectory=[[e, f] for e, f in res.trajectory],
        env=runner.backend.environment(task.variant.device),
        extra=dict(res.best_eval.extra) if res.best_eval is not None else {},
    )
    finding.coverage["mutators"] = {k: list(v) for k, v in res.mutator_stats.items()}
    return finding


__all__ = ["fuzz_task", "Finding", "Crash", "Candidate", "GUIDANCES", "MUTATORS", "PREDOO_MUTATORS", "VariantRunner",
           "RUNNERS", "build_runner"]
