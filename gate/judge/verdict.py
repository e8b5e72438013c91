"""The judge's output types: one :class:`VariantVerdict` per operator x variant and one
:class:`GateReport` per run. Plain data, JSON-serialisable: the report stage renders them
(JUnit, Markdown, PR comment, annotations) without importing any framework."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional

from ..errors import Outcome
from ..plan import Variant
from ..serial import from_json_safe, json_safe

# Per-variant outcomes. Only REGRESSION (and BEHAVIOUR_CHANGE when configured to fail) fail.
PASS = "pass"
REGRESSION = "regression"  # precision worse than m x base (above the floor), or new NaN/Inf/crash
BEHAVIOUR_CHANGE = "behaviour-change"  # head output differs from base on identical inputs
IMPROVEMENT = "improvement"
NEEDS_BASELINE = "needs-baseline"
NOT_COMPARABLE = "not-comparable"  # baseline from another environment
NOT_COVERED = "not-covered"  # budget ran out before this variant
UNSUPPORTED = "unsupported"  # the framework has no kernel for this dtype/device, or base fails the same way
#: fewer searched evaluations than a pass needs (``gate.min_evals``): not judged, never a plain pass
UNDER_SEARCHED = "under-searched"
#: the runs are not what they claim (the low-precision run returns a wider dtype, the reference
#: a narrower one): figures that would read 0 ulp, not a measurement of the variant
NOT_MEASURED = "not-measured"
ERROR = "error"  # harness fault
VARIANT_OUTCOMES = (PASS, REGRESSION, BEHAVIOUR_CHANGE, IMPROVEMENT, NEEDS_BASELINE, NOT_COMPARABLE,
                    NOT_COVERED, UNSUPPORTED, UNDER_SEARCHED, NOT_MEASURED, ERROR)




@dataclass
class VariantVerdict:
    op: str
    framework: str
    variant: Dict[str, str]  # Variant.to_dict(): dtype, device, mode, layout, oracle
    outcome: str
    reason: str  # the one-line diagnosis
    metric: str = "ulp"
    base_error: Optional[float] = None
    head_error: Optional[float] = None
    threshold: Optional[float] = None  # head_error above this fails: max(floor, m x base)
    base_nonfinite: int = 0
    head_nonfinite: int = 0
    base_crash: Optional[str] = None
    head_crash: Optional[str] = None
    seed: Optional[int] = None
    evals: int = 0
    seconds: float = 0.0
    source_file: Optional[str] = None
    source_line: Optional[int] = None
    input_summary: Optional[str] = None
    repro_command: Optional[str] = None
    details: Dict[str, Any] = field(default_factory=dict)  # free-form figures (abs, rel, l1, …)
    diagnosis: Optional[Dict[str, Any]] = None  # filled by gate.localise (see its Diagnosis)

    @property
    def key(self) -> str:
        return Variant.from_dict({"dtype": "?", **self.variant}).key

    @property
    def reported_only(self) -> bool:
        """A behaviour change that is reported, never failed: it came with a stability fix of the
        same operator (``with_fix``), or it is a refinement (``refinement``: head and base agree
        to within half the dtype's digits, or a gradient that moved with a refined forward), or a
        gradient's only change is NaN/Inf where head fixed the forward (``gradient_of_a_fix``), or
        head's output is closer than base's to head's moved float64 value (``closer_than_base``)."""
        return self.outcome == BEHAVIOUR_CHANGE and bool(self.details.get("with_fix") or self.details.get("refinement")
                                                         or self.details.get("gradient_of_a_fix")
                                                         or self.details.get("closer_than_base"))

    @property
    def id(self) -> str:
        return f"{self.op}[{self.key}]"

    @property
    def ratio(self) -> Optional[float]:
        if self.base_error is None or self.head_error is None:
            return None
        if self.base_error == 0:
            return math.inf if self.head_error > 0 else 1.0
        return self.head_error / self.base_error

    def to_dict(self) -> dict:
        return json_safe(asdict(self))

    @classmethod
    def from_dict(cls, raw: dict) -> "VariantVerdict":
        raw = from_json_safe(dict(raw))
        return cls(**{k: v for k, v in raw.items() if k in cls.__dataclass_fields__})


@dataclass
class GateReport:
    outcome: str  # Outcome value: pass | regression | needs-baseline | error
    reason: str  # one line
    verdicts: List[VariantVerdict] = field(default_factory=list)
    selected: List[Dict[str, Any]] = field(default_factory=list)  # [{op, reasons: [...]}]
    not_covered: List[str] = field(default_factory=list)
    errors: List[str] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)
    base_ref: Optional[str] = None
    base_sha: Optional[str] = None
    head_sha: Optional[str] = None
    seed: Optional[int] = None
    seconds: float = 0.0
    env: Dict[str, Any] = field(default_factory=dict)
    artifacts: Dict[str, str] = field(default_factory=dict)  # name -> path (report.json, junit.xml, plots)
    # variant outcomes that fail the gate in this run: the judge adds BEHAVIOUR_CHANGE when the
    # config says ``gate.behaviour_change: fail``; the report marks these as failures.
    fail_outcomes: List[str] = field(default_factory=lambda: [REGRESSION])

    @property
    def exit_code(self) -> int:
        return Outcome(self.outcome).exit_code

    def stopped(self, why: str) -> None:
        """The run stopped early (an error, SIGTERM at the deadline, an exit): the error is
        recorded, and a failing verdict already reached stands. A regression found before
        localisation was cut short is still a regression (exit 1), said with "localisation
        incomplete" on its row; only when nothing failed is the run's outcome ``error``."""
        self.errors.append(why)
        failing = [v for v in self.verdicts if v.outcome in (self.fail_outcomes or [REGRESSION]) and not v.reported_only]
        if not failing:
            self.outcome, self.reason = Outcome.ERROR.value, why
            return
        for v in failing:
            if v.diagnosis is None:  # not reached by localisation
                v.diagnosis = {"error": f"localisation incomplete: {why}"}
                v.details["localisation"] = "incomplete"
        first = failing[0]
        more = f" (+{len(failing) - 1} more)" if len(failing) > 1 else ""
        self.outcome = Outcome.REGRESSION.value
        self.reason = f"{first.id}: {first.reason}{more}; localisation incomplete ({why})"

    def counts(self) -> Dict[str, int]:
        out: Dict[str, int] = {}
        for v in self.verdicts:
            out[v.outcome] = out.get(v.outcome, 0) + 1
        return out

    def to_dict(self) -> dict:
        d = asdict(self)
        d["verdicts"] = [v.to_dict() for v in self.verdicts]
        return json_safe(d)

    @classmethod
    def from_dict(cls, raw: dict) -> "GateReport":
        raw = dict(raw)
        verdicts = [VariantVerdict.from_dict(v) for v in raw.pop("verdicts", [])]
        raw = from_json_safe(raw)
        return cls(verdicts=verdicts, **{k: v for k, v in raw.items() if k in cls.__dataclass_fields__})
