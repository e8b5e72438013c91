"""A graph-fuzzing campaign: an arm proposes graphs, each is fuzzed at every dtype under test,
coverage is counted and the arm is rewarded; findings are merged per graph structure.

Reward (both terms in [0, 1], weighted equally):

* coverage — ``1 − 2^-k`` for ``k`` new operator-level coverage items (all criteria);
* error growth — 1 for new NaN/Inf or a crash at the outputs, else
  ``min(1, log10(1 + ulp / floor) / 3)``: 0 at no error, 1 at a thousand times the output
  operator's ULP floor.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ..search.finding import Finding
from .coverage import Coverage, CoverageSpace
from .evaluate import DEFAULT_FLOOR_ULP, fuzz_graph
from .generate import GraphSpace, make_arm
from .model import Graph


def _severity(f: Finding) -> float:
    if f.crashes and f.metrics is None:
        return math.inf
    return f.metrics.severity if f.metrics is not None else -1.0


def failure_key(f: Finding) -> Optional[Tuple[str, ...]]:
    """A graph finding's root cause, for counting unique failures: the first diverging
    operator and the cause, or the crash signature."""
    if f.crashes:
        return ("crash", f.variant.dtype, f.crashes[0].signature.split(": ", 1)[-1][:120])
    fd = (f.extra or {}).get("first_diverging")
    if fd:
        return (fd["op"], str(fd.get("cause")), f.variant.dtype)
    return None


@dataclass
class CampaignResult:
    arm: str
    framework: str
    findings: List[Finding]
    coverage: Dict[str, dict]
    graphs: int = 0  # graphs generated and evaluated
    valid: int = 0  # graphs with at least one valid input
    evals: int = 0
    seconds: float = 0.0
    failures: List[Tuple[str, ...]] = field(default_factory=list)  # unique root causes, in order found
    history: List[str] = field(default_factory=list)  # signature of every evaluated graph
    timeline: List[dict] = field(default_factory=list)  # after each graph: t, graphs, covered, failures

    @property
    def failures_per_minute(self) -> float:
        return len(self.failures) / (self.seconds / 60.0) if self.seconds > 0 else 0.0

    def to_dict(self) -> dict:
        return {
            "arm": self.arm, "framework": self.framework, "graphs": self.graphs, "valid": self.valid,
            "evals": self.evals, "seconds": round(self.seconds, 3), "coverage": self.coverage,
            "failures": [list(f) for f in self.failures], "failures_per_minute": self.failures_per_minute,
            "timeline": self.timeline,
        }


class GraphCampaign:
    def __init__(self, space: GraphSpace, *, arm: str = "mcts", dtypes: Sequence[str] = ("float16",), seed: int = 0,
                 evals_per_graph: int = 4, device: str = "cpu", progress: Optional[Callable[[int, float], None]] = None):
        self.space = space
        self.arm_name = arm
        self.arm = make_arm(arm, space, seed)
        self.dtypes = tuple(dtypes)
        self.seed = seed
        self.evals_per_graph = evals_per_graph
        self.device = device
        self.progress = progress
        self.coverage = Coverage(CoverageSpace.build(space.ops, space.out_ranks, space.max_out), space.ops)
        self.findings: Dict[Tuple[str, str], Finding] = {}
        self.failures: List[Tuple[str, ...]] = []
        self._seen_failures: set = set()
        self.graphs = 0
        self.valid = 0
        self.evals = 0
        self.timeline: List[dict] = []
        self.history: List[str] = []  # signature of every evaluated graph, in order
        self._t0 = 0.0

    # -- one graph ------------------------------------------------------------------------
    def evaluate(self, g: Graph) -> float:
        specs = self.space.specs
        self.graphs += 1
        self.history.append(g.signature)
        valid = False
        growth = 0.0
        for dtype in self.dtypes:
            f = fuzz_graph(g, specs, dtype, seed=self.seed, evals=self.evals_per_graph, device=self.device,
                           salt=self.graphs)
            self.evals += f.evals
            if f.metrics is not None or f.crashes:
                valid = True
            growth = max(growth, self._growth(f, g))
            key = failure_key(f)
            if key is not None and key not in self._seen_failures:
                self._seen_failures.add(key)
                self.failures.append(key)
            self._merge(f)
        new = self.coverage.add(g) if valid else {}
        if valid:
            self.valid += 1
        k = sum(new.values())
        cov = 1.0 - 0.5 ** k
        for dtype in self.dtypes:
            f = self.findings.get((g.signature, dtype))
            if f is not None and "new_items" not in f.coverage:
                f.coverage["new_items"] = new
        self.timeline.append({"t": round(time.perf_counter() - self._t0, 3), "graphs": self.graphs,
                              "covered": self.coverage.total_covered(), "failures": len(self.failures)})
        if self.progress:
            self.progress(self.graphs, time.perf_counter() - self._t0)
        return 0.5 * cov + 0.5 * growth

    def _growth(self, f: Finding, g: Graph) -> float:
        if f.crashes:
            return 1.0
        m = f.metrics
        if m is None:
            return 0.0
        if m.severity == math.inf:
            return 1.0
        floors = []
        for j in g.sinks:
            thr = self.space.ops[g.nodes[j].op].spec.threshold(f.variant.dtype).ulp
            floors.append(thr if math.isfinite(thr) else DEFAULT_FLOOR_ULP)
        floor = min(floors) if floors else DEFAULT_FLOOR_ULP
        return min(1.0, math.log10(1.0 + m.ulp / floor) / 3.0)

    def _merge(self, f: Finding) -> None:
        key = (f.op, f.variant.dtype)
        old = self.findings.get(key)
        f.extra["arm"] = self.arm_name
        if old is None:
            f.extra["instances"] = 1
            self.findings[key] = f
            return
        instances = int(old.extra.get("instances", 1)) + 1
        crashes = {c.signature: c for c in old.crashes}
        for c in f.crashes:
            if c.signature in crashes:
                crashes[c.signature].count += c.count
            else:
                crashes[c.signature] = c
        keep = f if _severity(f) > _severity(old) else old
        merged = Finding(
            op=old.op, framework=old.framework, variant=old.variant, strategy=old.strategy, seed=old.seed,
            evals=old.evals + f.evals, seconds=old.seconds + f.seconds,
            status="ok" if "ok" in (old.status, f.status) else keep.status,
            metrics=keep.metrics, best=keep.best, crashes=list(crashes.values()), invalid=old.invalid + f.invalid,
            message=keep.message, trajectory=keep.trajectory, env=old.env, coverage=dict(old.coverage),
            extra={**keep.extra, "instances": instances},
        )
        self.findings[key] = merged

    # -- the loop -------------------------------------------------------------------------
    def run(self, *, seconds: Optional[float] = None, graphs: Optional[int] = None) -> CampaignResult:
        """Generate and evaluate graphs until ``seconds`` or ``graphs`` is spent (``graphs``
        makes a run reproducible)."""
        if seconds is None and graphs is None:
            graphs = 20
        self._t0 = time.perf_counter()
        stalls = 0
        while True:
            if graphs is not None and self.graphs >= graphs:
                break
            if seconds is not None and time.perf_counter() - self._t0 >= seconds:
                break
            before = self.graphs
            self.arm.step(self.evaluate)
            if self.graphs == before:
                stalls += 1
                if stalls >= 200:  # the space is exhausted (tiny catalogues)
                    break
            else:
                stalls = 0
        elapsed = time.perf_counter() - self._t0
        fig = self.coverage.figures()
        findings = sorted(self.findings.values(), key=lambda f: (f.op, f.variant.dtype))
        for f in findings:
            f.coverage["run"] = fig
        return CampaignResult(arm=self.arm_name, framework=self.space.framework, findings=findings, coverage=fig,
                              graphs=self.graphs, valid=self.valid, evals=self.evals, seconds=elapsed,
                              failures=list(self.failures), timeline=self.timeline, history=list(self.history))


__all__ = ["GraphCampaign", "CampaignResult", "failure_key"]
