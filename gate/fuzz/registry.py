"""Oracle name -> runner class: the extension point through which :func:`gate.fuzz.fuzz_task`
dispatches on ``task.variant.oracle``.

A runner class is built as ``cls(spec, variant, **options)`` (options: the oracle's rule
arguments from ``gate/ops/catalog/oracles.yaml`` merged with the row's ``oracle_args``) and
exposes ``evaluate(candidate) -> (quantised candidate, Evaluation)`` and ``backend``; the
optional hooks ``candidate_spec``, ``mutators_for`` (classmethods) and ``guidance`` are
described in :mod:`gate.fuzz.oracle_base`. A new oracle is a runner registered here, a rule in
``oracles.yaml`` saying which operators it applies to, and its name in ``gate.plan.ORACLES``.

No module imported here imports a framework at import time.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Tuple

from ..errors import ConfigError
from ..ops.spec import OpSpec
from ..plan import Variant
from .differential import XfwRunner
from .equivalence import (BatchEqRunner, CompiledRunner, CompiledXlaRunner, ContigEqRunner, DtypeEqRunner,
                          InplaceEqRunner, LayoutEqRunner, LengthEqRunner)
from .gradients import GradcheckRunner, GradRunner
from .nansearch import NanRunner
from .runner import VariantRunner

RUNNERS: Dict[str, type] = {
    "precision": VariantRunner,
    "nan": NanRunner,
    "xfw": XfwRunner,
    "compiled": CompiledRunner,
    "compiled_xla": CompiledXlaRunner,
    "dtype_eq": DtypeEqRunner,
    "layout_eq": LayoutEqRunner,
    "contig_eq": ContigEqRunner,
    "length_eq": LengthEqRunner,
    "batch_eq": BatchEqRunner,
    "inplace_eq": InplaceEqRunner,
    "grad": GradRunner,
    "gradcheck": GradcheckRunner,
}


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


def build_runner(spec: OpSpec, variant: Variant, *, isolate=None):
    """The runner for ``variant.oracle``, in this process or (``isolate``: True or an
    :class:`gate.fuzz.isolate.IsolateOptions`) in a worker process."""
    if isolate:
        from .isolate import IsolatedRunner, IsolateOptions

        opts = isolate if isinstance(isolate, IsolateOptions) else IsolateOptions()
        return IsolatedRunner(spec, variant, opts)
    cls = runner_class(variant.oracle)
    options = runner_options(spec, variant.oracle)
    if cls is VariantRunner:
        return VariantRunner(spec, variant)
    return cls(spec, variant, **options)


__all__ = ["RUNNERS", "register_runner", "runner_class", "runner_options", "hooks", "build_runner"]
