"""A :class:`Finding` is what fuzzing one task produced: the worst input found and its error
figures, crashes, and what was spent. Serialisable to JSON (+ ``.npz`` for inputs)."""
from __future__ import annotations

import base64
import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from .score import Metrics
from ..serial import from_json_safe, json_safe  # noqa: F401  (re-exported)
from ..plan import Variant
from .inputs import Candidate


@dataclass
class Crash:
    signature: str
    message: str
    count: int
    candidate: Optional[Candidate] = None

    def to_dict(self, with_inputs: bool = True) -> dict:
        d = {"signature": self.signature, "message": self.message, "count": self.count}
        if with_inputs and self.candidate is not None:
            d["input"] = base64.b64encode(self.candidate.to_bytes()).decode()
            d["input_summary"] = self.candidate.summary()
        return d

    @classmethod
    def from_dict(cls, raw: dict) -> "Crash":
        cand = Candidate.load(base64.b64decode(raw["input"])) if raw.get("input") else None
        return cls(signature=raw["signature"], message=raw.get("message", ""), count=int(raw.get("count", 1)), candidate=cand)


@dataclass
class Finding:
    op: str
    framework: str
    variant: Variant
    strategy: str = "linf"
    seed: int = 0
    evals: int = 0
    seconds: float = 0.0
    #: of ``seconds``, the first evaluation's (a worker's warm-up: not counted by the time budget)
    warmup: float = 0.0
    status: str = "ok"  # ok | unsupported | no-valid-input | error
    metrics: Optional[Metrics] = None
    best: Optional[Candidate] = None
    crashes: List[Crash] = field(default_factory=list)
    invalid: int = 0
    message: Optional[str] = None
    trajectory: List[List[float]] = field(default_factory=list)
    env: Dict[str, Any] = field(default_factory=dict)
    coverage: Dict[str, Any] = field(default_factory=dict)
    #: oracle-specific facts (graph: first diverging node, amplification; export: converter
    #: function, stage); JSON-safe via :func:`json_safe`
    extra: Dict[str, Any] = field(default_factory=dict)
    #: when ``best`` is a NaN/Inf: the worst input with a finite error, and its figures
    best_finite: Optional[Candidate] = None
    finite_metrics: Optional[Metrics] = None
    #: exhaustive mode (gate.fuzz.exhaustive): the one-value witnesses and every value of the
    #: dtype per parameter setting, replayed on head and base alike (regenerated, not serialised)
    exhaustive: List[Candidate] = field(default_factory=list)

    @property
    def inputs(self) -> List[Candidate]:
        """The inputs worth replaying: the worst, the worst finite one, each crash's, and the
        exhaustive sets (so that head and base are compared on the exact maxima)."""
        out = [c for c in [self.best, self.best_finite, *[x.candidate for x in self.crashes]] if c is not None]
        return out + [c for c in self.exhaustive if not any(c is o for o in out)]

    @property
    def id(self) -> str:
        return f"{self.op}[{self.variant.key}]"

    @property
    def worst_ulp(self) -> float:
        return self.metrics.ulp if self.metrics else 0.0

    @property
    def nonfinite(self) -> int:
        return self.metrics.nonfinite if self.metrics else 0

    def to_dict(self, with_inputs: bool = True) -> dict:
        d = {
            "op": self.op,
            "framework": self.framework,
            "variant": self.variant.to_dict(),
            "strategy": self.strategy,
            "seed": self.seed,
            "evals": self.evals,
            "seconds": round(self.seconds, 4),
            "warmup": round(self.warmup, 4),
            "status": self.status,
            "metrics": self.metrics.to_dict() if self.metrics else None,
            "best_summary": self.best.summary() if self.best else None,
            "crashes": [c.to_dict(with_inputs) for c in self.crashes],
            "invalid": self.invalid,
            "message": self.message,
            "trajectory": [[int(e), _num(f)] for e, f in self.trajectory],
            "env": self.env,
            "coverage": self.coverage,
            "extra": json_safe(self.extra),
        }
        if self.finite_metrics is not None:
            d["finite_metrics"] = self.finite_metrics.to_dict()
            d["best_finite_summary"] = self.best_finite.summary() if self.best_finite else None
        if with_inputs and self.best is not None:
            d["best_input"] = base64.b64encode(self.best.to_bytes()).decode()
        if with_inputs and self.best_finite is not None:
            d["best_finite_input"] = base64.b64encode(self.best_finite.to_bytes()).decode()
        return d

    @classmethod
    def from_dict(cls, raw: dict) -> "Finding":
        best = Candidate.load(base64.b64decode(raw["best_input"])) if raw.get("best_input") else None
        return cls(
            op=raw["op"],
            framework=raw["framework"],
            variant=Variant(**raw["variant"]),
            strategy=raw.get("strategy", "linf"),
            seed=int(raw.get("seed", 0)),
            evals=int(raw.get("evals", 0)),
            seconds=float(raw.get("seconds", 0.0)),
            warmup=float(raw.get("warmup", 0.0)),
            status=raw.get("status", "ok"),
            metrics=Metrics.from_dict(raw["metrics"]) if raw.get("metrics") else None,
            best=best,
            crashes=[Crash.from_dict(c) for c in raw.get("crashes", [])],
            invalid=int(raw.get("invalid", 0)),
            message=raw.get("message"),
            trajectory=[[e, (math.inf if f == "inf" else f)] for e, f in raw.get("trajectory", [])],
            env=raw.get("env", {}),
            coverage=raw.get("coverage", {}),
            extra=from_json_safe(raw.get("extra", {})),
            best_finite=Candidate.load(base64.b64decode(raw["best_finite_input"])) if raw.get("best_finite_input") else None,
            finite_metrics=Metrics.from_dict(raw["finite_metrics"]) if raw.get("finite_metrics") else None,
        )




def _num(f: float):
    if isinstance(f, float) and math.isinf(f):
        return "inf"
    return float(f)
