"""What "the finding still holds" means for one regression, on any input and any variant.

The rules are the judge's (:mod:`gate.judge.decide`) applied to one head/base pair of results
on an identical input: a new crash (same exception, numbers aside), new NaN/Inf, new integer
mismatches, head's error above ``max(floor, m x base error)``, or (behaviour change) head's
float64 output departing from base's. Without a base replay (framework built-ins) head is held
against the baseline row of the variant, as the judge does.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from ..oracles.runner import CRASH, INVALID, OK, UNSUPPORTED
from ..judge.decide import (BEHAVIOUR_TOLERANCE_ULP, NOT_DIFFERENTIABLE, GateSettings, new_nonfinite,
                            new_nonfinite_masks, base_unreliable, ref_divergence, same_outputs)
from ..judge.replay import UNAVAILABLE, ReplayResult
from ..ops.spec import OpSpec
from ..oracles.precision import floor_value, ulp

CRASH_KIND, NONFINITE, INT_MISMATCH, PRECISION, BEHAVIOUR = "crash", "nonfinite", "int_mismatch", "precision", "behaviour"


def failed(r: Optional[ReplayResult]) -> bool:
    """A crash, an invalid call, or (gradient variants) an output that lost its gradient."""
    if r is None:
        return False
    return r.status in (CRASH, INVALID) or (r.status == UNSUPPORTED and str(r.error or "").startswith(NOT_DIFFERENTIABLE))


def signature(r: ReplayResult) -> str:
    """Exception type and first line with numbers blanked: shrinking changes sizes in messages."""
    s = r.signature or r.error or ""
    return re.sub(r"\d+", "#", s.split("\n", 1)[0])[:200]


def _has_nonfinite(r: ReplayResult) -> bool:
    return any(np.asarray(o).dtype.kind == "f" and not np.isfinite(np.asarray(o)).all() for o in (r.outputs or ()))


def classify(h: ReplayResult, b: Optional[ReplayResult], outcome: str, dtype: Optional[str] = None) -> str:
    """The kind of finding, by the judge's definitions (gate.judge.decide): a new NaN/Inf is
    head's output non-finite where base's output is finite."""
    if failed(h):
        return CRASH_KIND
    if b is not None and b.status == OK and b.outputs is not None and h.outputs is not None:
        if new_nonfinite(h, b, dtype):
            return NONFINITE
    elif h.metrics is not None and h.metrics.nonfinite and not (b is not None and b.metrics and b.metrics.nonfinite):
        return NONFINITE
    if h.metrics is not None and h.metrics.int_mismatch and not (b is not None and b.metrics and b.metrics.int_mismatch):
        return INT_MISMATCH
    if outcome == "behaviour-change":
        return BEHAVIOUR
    return PRECISION


divergence = ref_divergence  # one definition, in the judge


@dataclass
class RowLimit:
    """Without a base replay: what the baseline row of a variant allows."""

    threshold: float
    nonfinite: int = 0
    crash: Optional[str] = None


class Target:
    """The predicate for one finding: ``holds(head, base, dtype)``.

    ``row_limit(variant)`` gives the baseline row's limit when there is no base (None: no row,
    the variation is inconclusive)."""

    def __init__(self, spec: OpSpec, settings: GateSettings, kind: str, crash_signature: Optional[str] = None,
                 row_limit: Optional[Callable[[object], Optional[RowLimit]]] = None, oracle: str = "precision"):
        self.spec = spec
        self.oracle = oracle
        self.settings = settings
        self.kind = kind
        self.crash_signature = crash_signature
        self.row_limit = row_limit

    def floor(self, dtype) -> float:
        """The floor for this finding's variant at ``dtype`` (or a Variant)."""
        if isinstance(dtype, str):
            return self.settings.floor(self.spec, dtype) * (self.settings.grad_floor_factor if self.oracle == "grad" else 1.0)
        return self.settings.floor(self.spec, dtype)

    def m(self, dtype) -> float:
        """The multiplier for this finding's variant at ``dtype`` (or a Variant)."""
        if isinstance(dtype, str):
            return self.settings.m(dtype) * (self.settings.grad_multiplier_factor if self.oracle == "grad" else 1.0)
        return self.settings.m(dtype)

    def threshold(self, b: Optional[ReplayResult], dtype: str, limit: Optional[RowLimit] = None) -> float:
        if b is not None and b.metrics is not None:
            return max(self.floor(dtype), self.m(dtype) * b.metrics.ulp)
        if limit is not None:
            return limit.threshold
        return self.floor(dtype)

    def head_suspect(self, h: ReplayResult, dtype: str) -> bool:
        """Cheap pre-filter on head alone: can this input possibly hold? (saves base calls)"""
        if self.kind == CRASH_KIND:
            return failed(h) and (self.crash_signature is None or signature(h) == self.crash_signature)
        if h.status != OK or h.metrics is None:
            return False
        if self.kind == NONFINITE:
            return h.metrics.nonfinite > 0 or _has_nonfinite(h)
        if self.kind == INT_MISMATCH:
            return h.metrics.int_mismatch > 0
        if self.kind == BEHAVIOUR:
            return True
        return h.metrics.ulp > self.floor(dtype)

    def holds(self, h: ReplayResult, b: Optional[ReplayResult], variant) -> Optional[bool]:
        """True/False, or None when it cannot be told (base unavailable, no baseline row)."""
        dtype = variant.dtype
        if not self.head_suspect(h, dtype):
            return False
        if b is not None and b.status == UNAVAILABLE:
            # base was asked and did not answer (a timeout, a dead worker): the finding cannot be
            # told on this input. A baseline row stands in for base only where no base runs at
            # all: a shrink accepted on it kept inputs where base fails the same way (x=[inf])
            return None
        if b is None:
            limit = self.row_limit(variant) if self.row_limit is not None else None
            if limit is None or self.kind == BEHAVIOUR:
                return None
            if self.kind == CRASH_KIND:
                return limit.crash is None
            if self.kind == NONFINITE:
                return not limit.nonfinite
            if self.kind == INT_MISMATCH:
                return True
            if h.metrics.nonfinite and not limit.nonfinite:
                return False
            return h.metrics.ulp > limit.threshold
        if self.kind == CRASH_KIND:
            return b.status == OK
        if b.status != OK or b.metrics is None:
            return False
        if self.kind == NONFINITE:
            if h.outputs is not None and b.outputs is not None:
                return new_nonfinite(h, b, dtype) > 0
            return not b.metrics.nonfinite
        if self.kind == INT_MISMATCH:
            return not b.metrics.int_mismatch
        if self.kind == BEHAVIOUR:
            d = divergence(h, b, dtype, self.spec.ulp_floor)
            # beyond the variant's own threshold, as the judge holds it (a smaller move is
            # "reference moved"); integer outputs or shapes that differ give an infinite move
            return d is not None and d > max(BEHAVIOUR_TOLERANCE_ULP, self.threshold(b, dtype))
        if (new_nonfinite(h, b, dtype) if h.outputs is not None and b.outputs is not None
                else h.metrics.nonfinite and not b.metrics.nonfinite):
            return False  # a new NaN/Inf: another kind of finding (the judge calls it that first)
        if h.outputs is not None and same_outputs(h, b):
            return False  # the same output: only the reference moved
        if base_unreliable(b.metrics.ulp, dtype):
            return False  # base kept fewer than half its digits on this input: not judged (the judge's rule)
        return h.metrics.ulp > self.threshold(b, dtype)

    def severity(self, h: ReplayResult, b: Optional[ReplayResult], dtype: str) -> float:
        """How strongly it holds (to prefer, among equally small inputs, the clearest one)."""
        if self.kind in (CRASH_KIND, NONFINITE, INT_MISMATCH):
            return math.inf
        if self.kind == BEHAVIOUR and b is not None:
            return divergence(h, b, dtype, self.spec.ulp_floor) or 0.0
        if h.metrics is None:
            return 0.0
        return h.metrics.ulp / max(self.threshold(b, dtype), 1e-300)


# ---------------------------------------------------------------------------------------
# element-level errors: where in the output the finding sits
# ---------------------------------------------------------------------------------------
def element_ulps(out: np.ndarray, ref: np.ndarray, dtype: str, ulp_floor: str) -> np.ndarray:
    """Per-element error in ULPs of ``dtype`` with the oracle's floor; non-finite where the
    reference is finite counts as infinite."""
    a = np.asarray(out, dtype=np.float64)
    b = np.asarray(ref, dtype=np.float64)
    fin = np.isfinite(b)
    mag = float(np.max(np.abs(b[fin]))) if np.any(fin) else 0.0
    floor = floor_value(mag, dtype, ulp_floor)
    denom = np.maximum(ulp(np.where(fin, b, 0.0), dtype), floor)
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(a - b) / denom
    err = np.where(fin & ~np.isfinite(a), np.inf, err)
    err = np.where(~fin, 0.0, err)
    return np.nan_to_num(err, nan=0.0, posinf=np.inf)


def focus_element(target: Target, h: ReplayResult, b: Optional[ReplayResult], dtype: str):
    """(output number, index) of the element where the finding is strongest, or None."""
    if h.outputs is None or h.reference is None:
        return None
    best = None
    new_masks = dict(new_nonfinite_masks(h, b, dtype)) if target.kind == NONFINITE and b is not None else {}
    for k, (o, r) in enumerate(zip(h.outputs, h.reference)):
        o, r = np.asarray(o), np.asarray(r)
        if o.shape != r.shape or o.size == 0 or o.dtype.kind != "f":
            continue
        if target.kind == BEHAVIOUR and b is not None and b.reference is not None and k < len(b.reference):
            br = np.asarray(b.reference[k])
            if br.shape != r.shape:
                continue
            score = element_ulps(r, br, dtype, target.spec.ulp_floor)
        elif target.kind == NONFINITE and k in new_masks:
            # a new NaN/Inf: the element that became non-finite where base's is finite (its error
            # in ulps is not measured: a NaN whose float64 run is NaN too reads 0)
            score = new_masks[k].astype(np.float64)
        else:
            score = element_ulps(o, r, dtype, target.spec.ulp_floor)
            if b is not None and b.outputs is not None and b.reference is not None and k < len(b.outputs):
                bo, br = np.asarray(b.outputs[k]), np.asarray(b.reference[k])
                if bo.shape == o.shape:
                    base_err = element_ulps(bo, br, dtype, target.spec.ulp_floor)
                    m = target.m(dtype)
                    with np.errstate(invalid="ignore"):
                        score = np.where(np.isinf(score) & ~np.isinf(base_err), np.inf,
                                         score / np.maximum(m * base_err, target.floor(dtype)))
        idx = int(np.argmax(score))
        val = float(score.flat[idx])
        if best is None or val > best[0]:
            best = (val, k, tuple(int(i) for i in np.unravel_index(idx, o.shape)))
    return None if best is None else (best[1], best[2])
