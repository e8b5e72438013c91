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
from .runner import VariantRunner


def fuzz_task(
    task: Task,
    *,
    seeds: Sequence[Candidate] = (),
    progress: Optional[Callable[[int, float], None]] = None,
    runner: Optional[VariantRunner] = None,
    mutators: Optional[Sequence[str]] = None,
    scheduler=None,
) -> Finding:
    """Search ``task``'s variant for the input with the largest precision error."""
    spec = task.op
    runner = runner or VariantRunner(spec, task.variant)
    runner.backend.seed(task.seed)
    rng = np.random.default_rng(task.rng_seed())
    names = list(mutators or MUTATORS)
    bound = {n: (lambda m: (lambda c, r: m(c, spec, r)))(MUTATORS[n]) for n in names}
    if scheduler is not None and hasattr(scheduler, "bind"):
        scheduler = scheduler.bind(names)
    with np.errstate(all="ignore"):
        res = _search(spec, runner, rng, task, bound, seeds, scheduler, progress)
    status, message = "ok", None
    if res.unsupported and res.best_eval is None:
        status, message = "unsupported", res.unsupported
    elif res.best_eval is None and not res.crashes:
        status, message = "no-valid-input", res.invalid_example
    finding = Finding(
        op=spec.name,
        framework=spec.framework,
        variant=task.variant,
        strategy=task.strategy,
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
    )
    finding.coverage["mutators"] = {k: list(v) for k, v in res.mutator_stats.items()}
    return finding


def _search(spec, runner, rng, task, bound, seeds, scheduler, progress):
    return search(
        runner.evaluate,
        lambda r: draw(spec, r),
        bound,
        rng,
        seconds=task.budget.seconds,
        evals=task.budget.evals,
        guidance=task.strategy,
        seeds=seeds,
        scheduler=scheduler,
        progress=progress,
    )


__all__ = ["fuzz_task", "Finding", "Crash", "Candidate", "GUIDANCES", "MUTATORS", "PREDOO_MUTATORS", "VariantRunner"]
