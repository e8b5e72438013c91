"""Plan: selected operators -> tasks (operator x variant x budget).

A :class:`Variant` is one way of computing an operator that the gate judges on its own
(dtype, device, mode, layout, oracle). A :class:`Task` is a variant with a budget and a seed.
"""
from __future__ import annotations

import zlib
from dataclasses import asdict, dataclass
from typing import Iterable, List, Optional, Sequence

from ..errors import GateError, UnsupportedVariant
from ..ops.spec import CUDA_MODES, FLOAT_DTYPES, MODES, OpSpec


@dataclass(frozen=True, order=True)
class Variant:
    dtype: str
    device: str = "cpu"
    mode: str = "input"
    layout: str = "default"
    oracle: str = "precision"

    @property
    def key(self) -> str:
        parts = [self.dtype, self.device, self.mode]
        if self.layout != "default":
            parts.append(self.layout)
        if self.oracle != "precision":
            parts.append(self.oracle)
        return "/".join(parts)

    @classmethod
    def parse(cls, key: str) -> "Variant":
        parts = key.split("/")
        dtype, device, mode = (parts + ["cpu", "input"])[:3] if len(parts) < 3 else parts[:3]
        rest = parts[3:]
        layout, oracle = "default", "precision"
        for p in rest:
            if p in ORACLES:
                oracle = p
            else:
                layout = p
        return cls(dtype=dtype, device=device, mode=mode, layout=layout, oracle=oracle)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict) -> "Variant":
        """Lenient: missing fields take their defaults, unknown keys are ignored."""
        fields = cls.__dataclass_fields__
        return cls(**({k: str(v) for k, v in raw.items() if k in fields and v is not None} or {"dtype": "?"}))


#: Oracles planned per operator by :func:`variants_for`, in the order of the rules table
#: ``gate/ops/catalog/oracles.yaml`` (which says which oracle applies to which operator); each
#: has a runner in ``gate.oracles.registry``.
def validate_variant_filters(dtypes, modes, devices) -> None:
    """``--dtype``/``--mode``/``--device`` values, checked before any work is done."""
    for d in dtypes or []:
        if d not in FLOAT_DTYPES:
            raise GateError(f"unknown dtype {d!r} (use {', '.join(FLOAT_DTYPES)})")
    for m in modes or []:
        if m not in MODES:
            raise GateError(f"unknown mode {m!r} (use {', '.join(MODES)})")
    for d in devices or []:
        if d not in ("cpu", "cuda"):
            raise GateError(f"unknown device {d!r} (use cpu or cuda)")


def _fuzz_oracles() -> tuple:
    from ..ops.rules import load_rules

    return tuple(load_rules().names())


def _campaign_oracles() -> tuple:
    from ..ops.rules import load_rules

    return tuple(load_rules().nightly)


#: Oracles the fuzz stage runs: every per-operator rule (``schedule: pr``, the default) of
#: ``gate/ops/catalog/oracles.yaml``, in its order.
FUZZ_ORACLES = _fuzz_oracles()
#: Oracles whose findings come from the nightly campaign (gate.oracles.export, gate.graphs): the
#: rules of ``oracles.yaml`` with ``schedule: nightly``, in its order.
CAMPAIGN_ORACLES = _campaign_oracles()
ORACLES = FUZZ_ORACLES + CAMPAIGN_ORACLES


@dataclass(frozen=True)
class Budget:
    seconds: Optional[float] = None
    evals: Optional[int] = None
    #: with ``seconds``: the search goes on past them until it has made ``min_evals``
    #: evaluations, but never past ``max_seconds`` (the time its operator has left): a variant
    #: whose evaluations cost more (a gradient, a slow machine) is given the time they take
    min_evals: Optional[int] = None
    max_seconds: Optional[float] = None

    def split(self, n: int) -> "Budget":
        n = max(n, 1)
        return Budget(
            seconds=None if self.seconds is None else self.seconds / n,
            evals=None if self.evals is None else max(1, self.evals // n),
        )

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Task:
    op: OpSpec
    variant: Variant
    budget: Budget
    seed: int
    strategy: str = "linf"

    @property
    def id(self) -> str:
        return f"{self.op.name}[{self.variant.key}]"

    def rng_seed(self) -> List[int]:
        """Per-task seed sequence: stable across runs and independent of task order."""
        return [self.seed, zlib.crc32(self.id.encode())]


def variants_for(
    spec: OpSpec,
    *,
    dtypes: Optional[Sequence[str]] = None,
    devices: Optional[Sequence[str]] = None,
    modes: Optional[Sequence[str]] = None,
    layouts: bool = True,
    available_devices: Sequence[str] = ("cpu",),
    oracles: Optional[Sequence[str]] = None,
) -> List[Variant]:
    """Every variant of ``spec`` the filters and this machine allow, for each oracle in
    ``oracles`` (default: precision only) that applies to ``spec`` (see ``oracles.yaml``)."""
    want_oracles = list(oracles) if oracles else ["precision"]
    bad_oracles = [o for o in want_oracles if o not in FUZZ_ORACLES]
    if bad_oracles:
        raise UnsupportedVariant(f"unknown oracle {', '.join(bad_oracles)} (use {', '.join(FUZZ_ORACLES)})")
    want_dtypes = list(dtypes) if dtypes else list(spec.dtypes)
    bad = [d for d in want_dtypes if d not in spec.dtypes]
    if dtypes and bad:
        raise UnsupportedVariant(
            f"operator {spec.name} does not support dtype {', '.join(bad)} (declared: {', '.join(spec.dtypes)})"
        )
    want_devices = [d for d in (devices or spec.devices) if d in spec.devices]
    if devices and not want_devices:
        raise UnsupportedVariant(f"operator {spec.name} does not run on {', '.join(devices)}")
    want_devices = [d for d in want_devices if d in available_devices]
    want_modes = [m for m in (modes or spec.modes) if m in spec.modes or m in CUDA_MODES]
    has_ref = spec.reference is not None
    out: List[Variant] = []
    # what a default layout or a default gradient check runs at: one dtype (float32 if asked)
    auto_dtype = "float32" if "float32" in want_dtypes else (want_dtypes[0] if want_dtypes else None)
    if "precision" in want_oracles:
        for device in want_devices:
            for dtype in want_dtypes:
                if dtype == "float64" and not has_ref:
                    continue  # float64 against itself measures nothing
                for mode in want_modes:
                    if mode == "operator" and dtype in ("float32", "float64"):
                        continue  # operator mode at full precision is input mode
                    if mode in CUDA_MODES and (device != "cuda" or dtype not in CUDA_MODES[mode]):
                        continue  # TF32 / reduced-precision reductions exist on CUDA, for their dtypes
                    out.append(Variant(dtype=dtype, device=device, mode=mode))
                if layouts:
                    for lay in spec.layouts:
                        if lay.auto and dtype != auto_dtype:
                            continue
                        out.append(Variant(dtype=dtype, device=device, mode="input", layout=lay.name))
        if oracles is None and spec.grad and spec.origin == "user" and auto_dtype is not None and auto_dtype != "float64":
            # a user operator's gradient by default (a backward-only bug: forward bit-identical,
            # gradient NaN), at one dtype; ``gate.oracles`` / ``--oracle`` choose otherwise
            out.extend(Variant(dtype=auto_dtype, device=device, mode="input", oracle="grad") for device in want_devices)
    others = [o for o in FUZZ_ORACLES if o in want_oracles and o != "precision"]
    if not others:
        return out
    from ..ops.rules import load_rules

    rules = load_rules()
    applies = rules.applicable(spec)
    for name in others:
        if name not in applies:
            continue
        rule = rules.get(name)
        if rule.dtype:
            rule_dtypes = [rule.dtype]
        else:
            rule_dtypes = [d for d in want_dtypes if d != "float64" and (rule.dtypes is None or d in rule.dtypes)]
        lays = [lay.name for lay in spec.layouts if not lay.auto] if rule.per_layout else ["default"]
        for device in want_devices:
            for dtype in rule_dtypes:
                for lay in lays:
                    out.append(Variant(dtype=dtype, device=device, mode="input", layout=lay, oracle=name))
    return out


def plan(
    specs: Iterable[OpSpec],
    budget: Budget,
    *,
    seed: int = 0,
    strategy: str = "linf",
    per_op: Optional[Budget] = None,
    **variant_filters,
) -> List[Task]:
    """Tasks for ``specs``: the op budget (``per_op`` or an even share of ``budget``) is split
    evenly across each op's variants."""
    specs = list(specs)
    tasks: List[Task] = []
    op_budget = per_op or budget.split(len(specs))
    for spec in specs:
        vs = variants_for(spec, **variant_filters)
        vb = op_budget.split(len(vs))
        tasks.extend(Task(op=spec, variant=v, budget=vb, seed=seed, strategy=strategy) for v in vs)
    return tasks


__all__ = ["Variant", "Budget", "Task", "plan", "variants_for", "ORACLES", "FUZZ_ORACLES", "CAMPAIGN_ORACLES"]
