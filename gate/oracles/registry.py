"""Oracle name -> runner class: the extension point through which :func:`gate.fuzz.fuzz_task`
dispatches on ``task.variant.oracle``.

Every per-PR oracle is a rule in ``gate/ops/catalog/oracles.yaml`` whose ``runner`` names its class
(``module:Class``); the registry imports the classes from there, so it names no oracle module
itself. A runner class is built with ``cls.build(spec, variant, options)`` (options: the
oracle's rule arguments merged with the row's ``oracle_args``; a class without ``build`` is
called as ``cls(spec, variant, **options)``) and exposes ``evaluate(candidate) -> (quantised
candidate, Evaluation)`` and ``backend``; the optional hooks ``candidate_spec``,
``mutators_for`` (classmethods), ``guidance`` and ``batch_evaluator`` are described in
:mod:`gate.oracles.base`. A new oracle is one file in ``gate/oracles/`` with its runner and one
rule in ``oracles.yaml``.

No module imported here imports a framework at import time.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable, Dict, Optional, Tuple

from ..errors import ConfigError
from ..ops.spec import OpSpec
from ..plan import Variant


def _load(name: str, path: str) -> type:
    module, _, attr = path.partition(":")
    if not module or not attr:
        raise ConfigError(f"oracle rule {name}: runner {path!r} is not 'module:Class'")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"oracle rule {name}: cannot import runner {path!r}: {exc}") from None


def _runners_from_rules() -> Dict[str, type]:
    from ..ops.rules import load_rules

    return {name: _load(name, rule.runner) for name, rule in load_rules().rules.items() if rule.runner}


RUNNERS: Dict[str, type] = _runners_from_rules()


def register_runner(name: str, cls: type) -> None:
    """Plug in (or replace) the runner of oracle ``name``."""
    RUNNERS[name] = cls


def runner_class(oracle: str) -> type:
    if oracle not in RUNNERS:
        raise ConfigError(f"no runner for oracle {oracle!r} (known: {', '.join(RUNNERS)})")
    return RUNNERS[oracle]


def runner_options(spec: OpSpec, oracle: str) -> Dict[str, Any]:
    """The oracle's arguments for ``spec``: its rule's defaults overridden by the row's
    ``oracle_args`` (a registered oracle without a rule gets the row's arguments alone)."""
    from ..ops.rules import load_rules

    rules = load_rules()
    if oracle in rules.rules:
        return rules.get(oracle).args_for(spec)
    return dict(spec.oracle_args.get(oracle) or {})


def hooks(spec: OpSpec, variant: Variant, options: Optional[Dict[str, Any]] = None
          ) -> Tuple[OpSpec, Optional[str], Dict[str, Callable]]:
    """(candidate spec, imposed guidance, extra mutators) of the variant's oracle, from data alone."""
    cls = runner_class(variant.oracle)
    options = runner_options(spec, variant.oracle) if options is None else options
    cand_spec = cls.candidate_spec(spec, variant, options) if hasattr(cls, "candidate_spec") else spec
    muts = cls.mutators_for(spec, variant, options) if hasattr(cls, "mutators_for") else {}
    return cand_spec, getattr(cls, "guidance", None), muts


def _crash(**kw: Any):
    """The evaluation of a candidate whose isolated worker died or hung."""
    from ..search.evaluation import CRASH, Evaluation

    return Evaluation(CRASH, **kw)


def build_runner(spec: OpSpec, variant: Variant, *, isolate=None):
    """The runner for ``variant.oracle``, in this process or (``isolate``: True or an
    :class:`gate.backends.isolate.IsolateOptions`) in a worker process."""
    if isolate:
        from ..backends.isolate import IsolatedRunner, IsolateOptions

        opts = isolate if isinstance(isolate, IsolateOptions) else IsolateOptions()
        return IsolatedRunner(spec, variant, opts, hooks=hooks(spec, variant), crash=_crash)
    cls = runner_class(variant.oracle)
    options = runner_options(spec, variant.oracle)
    if hasattr(cls, "build"):
        return cls.build(spec, variant, options)
    return cls(spec, variant, **options)


__all__ = ["RUNNERS", "register_runner", "runner_class", "runner_options", "hooks", "build_runner"]


def warm_kernels() -> None:
    """Load the search's and the oracles' compiled loops (Numba: rounding, scoring, band counts,
    random numbers) into this process. A worker zygote calls it once before it forks
    (gate.backends.isolate): each worker otherwise imported Numba and loaded each loop from its
    on-disk cache anew, ~1 s of CPU a worker (~1 of every 3 CPU-seconds of a torch bed's run).
    Imports no framework; a loop that cannot be loaded is left to the worker, which falls back
    to NumPy as before."""
    from ..backends.base import warm_round_kernel
    from ..search import coverage, randoms
    from . import fused

    for warm in (warm_round_kernel, fused.warm, coverage.warm, randoms.warm):
        try:
            warm()
        except Exception:  # pragma: no cover - a broken Numba: the worker's own path reports it
            pass

