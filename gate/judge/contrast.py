"""Search guidance that knows the base: a NaN/Inf base shares does not steer the search.

The search maximises head's error; a NaN/Inf in head's output dominates every finite error. On
a PR that breaks an operator only on ordinary inputs (a reverted bisection fix that makes
peaked rows NaN), the search used to find huge inputs where head *and base* overflow to NaN,
hold on to them as its best, and the replay on base then showed nothing new: the regression
passed. :class:`ContrastRunner` runs the same quantised input on base whenever head's output
holds a NaN/Inf, and scores it by the judge's rule (:func:`gate.judge.decide.new_nonfinite`):

* head NaN/Inf where base's output is finite -> the new-NaN finding (infinite fitness), even
  where head's own float64 run is NaN too (the reference does not rescue it);
* NaN/Inf at the same places on both sides -> scored by head's finite elements only, so the
  search goes on looking for inputs on which head and base *differ*.

Inputs whose output is finite cost nothing extra: precision guidance stays head's error (a
ratio to base's error would chase rounding differences of benign reassociations).
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import numpy as np

from ..errors import GateError
from ..search.inputs import Candidate
from ..oracles.runner import OK, Evaluation


def _nonfinite(outputs) -> bool:
    for o in outputs or ():
        a = np.asarray(o.array)
        if a.dtype.kind in "fc" and not np.isfinite(a).all():
            return True
    return False


def _new_nonfinite(head_outputs, base_outputs) -> int:
    if head_outputs is None or base_outputs is None or len(head_outputs) != len(base_outputs):
        return 0
    n = 0
    for x, y in zip(head_outputs, base_outputs):
        x, y = np.asarray(x.array), np.asarray(y.array)
        if x.shape == y.shape and x.dtype.kind in "fc" and y.dtype.kind in "fc":
            n += int(np.count_nonzero(~np.isfinite(x) & np.isfinite(y)))
    return n


class ContrastRunner:
    """Head's runner (any with the runner interface) with base's beside it."""

    def __init__(self, head, base, guidance: str = "linf"):
        self.head, self.base, self.guidance_name = head, base, guidance
        self.backend = head.backend
        for attr in ("spec", "variant", "search_spec", "guidance", "extra_mutators", "stop_on_inf"):
            if hasattr(head, attr):
                setattr(self, attr, getattr(head, attr))
        self.stats = {"base_evaluations": 0, "new_nonfinite": 0, "shared_nonfinite": 0}

    @property
    def figures(self) -> str:
        """Head's (the search is guided by head's figures; base's outputs only settle NaN/Inf)."""
        return getattr(self.head, "figures", "all")

    @figures.setter
    def figures(self, value: str) -> None:
        if hasattr(self.head, "figures"):
            self.head.figures = value

    def quantize(self, cand: Candidate) -> Candidate:
        return self.head.quantize(cand)

    def evaluate(self, cand: Candidate, keep_outputs: bool = False, quantized: bool = False) -> Tuple[Candidate, Evaluation]:
        # head's outputs come back only where they hold a NaN/Inf, unless the caller wants them
        q, ev = self.head.evaluate(cand, keep_outputs=True if keep_outputs else "nonfinite", quantized=quantized)
        if ev.status == OK and ev.metrics is not None and _nonfinite(ev.outputs):
            self.stats["base_evaluations"] += 1
            try:
                _, bev = self.base.evaluate(q, keep_outputs=True, quantized=True)
            except (GateError, OSError, RuntimeError):  # base's worker failed: judge head alone
                bev = None
            if bev is not None and bev.status == OK:
                if _new_nonfinite(ev.outputs, bev.outputs):
                    self.stats["new_nonfinite"] += 1
                    ev.extra = {**ev.extra, "fitness": math.inf, "contrast": "new NaN/Inf (base finite)"}
                else:
                    self.stats["shared_nonfinite"] += 1
                    finite = ev.metrics.ulp if math.isfinite(ev.metrics.ulp) else 0.0
                    ev.extra = {**ev.extra, "fitness": finite, "contrast": "NaN/Inf shared with base"}
        if not keep_outputs:
            ev.outputs = ev.reference = None
        return q, ev

    def close(self) -> None:
        for r in (self.head, self.base):
            if hasattr(r, "close"):
                r.close()


def contrast_runner(spec, base_spec, variant, isolate, base_isolate) -> Optional[ContrastRunner]:
    """Head's and base's isolated runners for ``variant``; None where base cannot run it (a new
    operator, or an import error on base: the search is then head's alone)."""
    from ..oracles.registry import build_runner

    head = build_runner(spec, variant, isolate=isolate)
    try:
        base = build_runner(base_spec, variant, isolate=base_isolate)
    except GateError:
        head.close()
        return None
    return ContrastRunner(head, base)


__all__ = ["ContrastRunner", "contrast_runner"]
