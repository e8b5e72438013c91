"""The verdict for one operator x variant.

Rules (FIELD_GUIDE §2, after PyTorch's own compile-vs-eager rule), on identical inputs:

* **regression** if head raises where base returns; or head's *output* is NaN/Inf where base's
  output is finite (new NaN/Inf: even when head's float64 run is NaN too, and never when both
  outputs are non-finite, whatever the float64 runs say; nor where head's infinity is its finite
  float64 value correctly rounded and base's finite value was 2^(p/2) ulps off: :func:`new_nonfinite`;
  nor, in a gradient, on an input where head's forward returns numbers where base's returned
  NaN/Inf, :func:`_forward_fixed`: a behaviour change, reported);
  or head's error vs its reference
  exceeds ``max(floor, m x base error)`` (``m`` per dtype: 3 for float16/bfloat16, 2 for
  float32). An input on which head's output is bit-identical to base's is never a precision
  regression (only the reference moved), nor is one where base kept fewer than half its digits
  (:func:`base_unreliable`); an input where head returns numbers and base returned
  NaN/Inf is a fix; a PR that fixes such inputs and rounds worse elsewhere within ``m x`` the
  threshold is reported, not failed (a stability fix reformulates). Without a base replay
  (framework built-ins), head's max error is held against the stored baseline row;
* **behaviour-change** if head's float64 output differs from base's by more than the variant's
  threshold on a control input, or integer outputs differ on any input, while precision did not
  worsen; a smaller move is reported as "reference moved"; fails or warns per configuration,
  except for an operator that a PR fixes (head returns numbers where base failed, in any of its
  variants): its behaviour changes, and its precision losses on inputs where the float64 run
  changed, are reported alongside the fix (:func:`stability_fixes`), unless the function moved
  beyond half the digits on the random control inputs (:func:`changed_everywhere`);
* **improvement** if base's error exceeds ``m x head error`` (reported, never failed);
* **needs-baseline** / **not-comparable** when there is no stored row for this environment;
* otherwise **pass**.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..backends.base import Output
from ..search.finding import Finding
from ..oracles.runner import CRASH, INVALID, OK, UNSUPPORTED
from ..ops.spec import OpSpec
from ..oracles.precision import compare
from ..plan import Variant
from . import verdict as V
from .baselines import BaselineRow
from .replay import UNAVAILABLE, ReplayResult, replay

DEFAULT_MULTIPLIERS = {"float16": 3.0, "bfloat16": 3.0, "float32": 2.0, "float64": 2.0}
DEFAULT_FLOORS = {"float16": 2.0, "bfloat16": 2.0, "float32": 4.0, "float64": 8.0}
# a gradient variant's floor is the forward one (``gate.grad_floor_factor``, default 1). It was
# 4x: two correct backward formulas of one function (``xc * rsqrt(v)`` vs ``xc / sqrt(v)``, an
# approximation replaced by the exact function) round 2-3x apart on the same input. Judged
# against base's largest error over the run's inputs, with a zero gradient measured on its
# terms' scale, they no longer need it: bench/false_alarms.py --gate grad_floor_factor=1, 0 false
# alarms in 220 runs (the verdict bed's 11 benign PRs x 20 seeds), the refactor bed's 14
# directions x 10 seeds right with both factors at 1
GRAD_FLOOR_FACTOR = 1.0
# on ill-conditioned inputs (the gradient of a near-constant row's normalisation) two correct
# backward formulas differ by up to 8.5x in error on the same input, where both lose tens to
# hundreds of ulps: a gradient variant's multiplier is this many times m
# (``gate.grad_multiplier_factor``); still needed: at 1, the benign layer_norm refactor of the
# verdict bed fails 2 of 20 seeds (head 154 vs base 38.4 ulp, 1.03e3 vs 253, both 4.0x) although
# base's largest error is considered; a real gradient regression (a NaN, a cancellation that costs
# 1e3+ ulps where base has a few) is far beyond it
GRAD_MULTIPLIER_FACTOR = 8.0
NOT_DIFFERENTIABLE = "not differentiable"  # the gradient oracle's message (gate.oracles.gradients)
BEHAVIOUR_TOLERANCE_ULP = 1.0  # float64 outputs of base and head may differ by rounding only
# the search's evaluations a variant needs before it may pass (``gate.min_evals``): a loaded runner
# gave 32 of 41 gradient variants one evaluation each, and each "passed" on the handful of fixed
# inputs replayed beside it
MIN_EVALS = 20


@dataclass
class GateSettings:
    multipliers: Dict[str, float] = field(default_factory=lambda: dict(DEFAULT_MULTIPLIERS))
    floor_ulp: Dict[str, float] = field(default_factory=dict)  # overrides the spec's thresholds
    behaviour_change: str = "fail"  # fail | warn
    grad_floor_factor: float = GRAD_FLOOR_FACTOR
    grad_multiplier_factor: float = GRAD_MULTIPLIER_FACTOR
    #: searched evaluations a variant needs before it may pass (an --evals budget below it lowers it)
    min_evals: int = MIN_EVALS

    @classmethod
    def from_config(cls, gate_cfg: Optional[dict]) -> "GateSettings":
        g = dict(gate_cfg or {})
        return cls(
            multipliers={**DEFAULT_MULTIPLIERS, **dict(g.get("multipliers") or {})},
            floor_ulp=dict(g.get("floor_ulp") or {}),
            behaviour_change=g.get("behaviour_change", "fail"),
            grad_floor_factor=float(g.get("grad_floor_factor", GRAD_FLOOR_FACTOR)),
            grad_multiplier_factor=float(g.get("grad_multiplier_factor", GRAD_MULTIPLIER_FACTOR)),
            min_evals=int(g.get("min_evals", MIN_EVALS)),
        )

    def m(self, variant) -> float:
        """How many times base's error head may reach, for ``variant`` (a Variant, or a dtype
        name for the forward pass); a gradient variant's is ``grad_multiplier_factor`` times it."""
        dtype = getattr(variant, "dtype", variant)
        m = float(self.multipliers.get(dtype, 2.0))
        return m * self.grad_multiplier_factor if getattr(variant, "oracle", None) == "grad" else m

    def floor(self, spec: OpSpec, variant) -> float:
        """The error no verdict fails below, in ulps, for ``variant`` (a Variant, or a dtype name
        for the forward pass): the user's ``floor_ulp``, else the operator's threshold, else the
        dtype's default; a gradient variant's is ``grad_floor_factor`` times that."""
        dtype = getattr(variant, "dtype", variant)
        if dtype in self.floor_ulp:
            f = float(self.floor_ulp[dtype])
        else:
            thr = spec.threshold(dtype).ulp
            f = float(thr) if math.isfinite(thr) else DEFAULT_FLOORS.get(dtype, 4.0)
        return f * self.grad_floor_factor if getattr(variant, "oracle", None) == "grad" else f


def base_unreliable(err_ulp: Optional[float], dtype: str) -> bool:
    """Base kept fewer than half of the dtype's significand bits on this input: its error is
    2^(p/2) ulps or more (p: the significand bits; 45 ulps of float16, 16 of bfloat16, 4096 of
    float32). The ratio rule (head within ``m x`` base's error) assumes base's error measures
    its rounding; where base has already lost most of its digits, something in the computation
    amplifies rounding (terms of 1e4 that cancel to 0.2, the variance of a near-constant row),
    and base's and head's errors are amplified rounding noise whose ratio is luck: a focal loss
    whose ``log(sigmoid(x))`` became ``logsigmoid(x)`` (kornia #2125) rounds its two logs apart
    instead of together, and the float16 mean of terms that cancel moves from 159 to 1.1e4 ulps
    while the function did not change. Precision is judged on inputs where base was accurate;
    new NaN/Inf, crashes and lost gradients count everywhere."""
    return err_ulp is not None and math.isfinite(err_ulp) and err_ulp >= half_digits_ulps(dtype)


def half_digits_ulps(dtype: str) -> float:
    """2^(p/2) ulps of ``dtype`` (p: its significand bits): an error this large has lost half the
    digits (:func:`base_unreliable`, :func:`new_nonfinite`)."""
    from ..backends.base import FLOAT_FORMATS

    return 2.0 ** (FLOAT_FORMATS.get(dtype, (53,))[0] / 2)


def _failed(r: ReplayResult) -> bool:
    return r.status in (CRASH, INVALID)


def _raises(r: ReplayResult) -> bool:
    """The operator itself raised on this input (an INVALID result, the reference refusing the
    input or no output to compare, is the harness's matter: never "base fails the same way")."""
    return r.status == CRASH or (r.status == UNSUPPORTED and not str(r.error or "").startswith(NOT_DIFFERENTIABLE))


def _fails(r: ReplayResult) -> bool:
    """The side raised on this input: a crash, an invalid result, or an error the runner files as
    "no kernel" (``not implemented for 'Half'``, a ``.view`` of a non-contiguous layout); a lost
    gradient is its own finding (gradient lost / gained)."""
    return _failed(r) or (r.status == UNSUPPORTED and not str(r.error or "").startswith(NOT_DIFFERENTIABLE))


def ref_divergence(h: ReplayResult, b: ReplayResult, dtype: str, ulp_floor: str) -> Optional[float]:
    """ULPs (of ``dtype``) between head's and base's float64 outputs on the same input, on the
    scale of the computation where the runs measured one (:attr:`Metrics.scale`): a gradient that
    is zero in exact arithmetic (RMSNorm's over one element, x / |x|) is a float64 residue on both
    sides, and two residues of identical functions written differently (``x * rsqrt(v)``,
    ``x / sqrt(v)``) differ by their rounding, ~1e-16 of the terms, which in ulps of the residue
    itself read 4e6 (a behaviour change where nothing changed)."""
    if h.reference is None or b.reference is None:
        return None
    scale = _run_scale(h, b)
    x, y = h.reference, b.reference
    if ulp_floor == "output" and _all_zero(y) and not _all_zero(x):
        # base's function is identically zero here, head's is not (an eps under a sqrt on a flat
        # image: kornia's sobel fix returns sqrt(1e-6) where base returned 0): an all-zero output
        # has no scale of its own (compare counts its errors in ulps of 1, a normalised output's
        # scale), so the change is measured on head's, the side that has one (or, for a residue,
        # its terms': ``scale``); measured in ulps of 1, 0 -> 1e-3 read 1 float16 ulp, "the
        # function did not change", and the fix's float16 rounding of that new value failed
        x, y = y, x
    m = compare([Output(a, "float64") for a in x], [Output(a, "float64") for a in y], dtype, ulp_floor, scale=scale)
    if m.shape_mismatch or m.int_mismatch:
        return math.inf
    return m.ulp


def _run_scale(h: ReplayResult, b: ReplayResult) -> float:
    """The scale of the computation either side's figures were taken on (:attr:`Metrics.scale`)."""
    return max((r.metrics.scale for r in (h, b) if r.metrics is not None), default=0.0)


def base_against_head(h: ReplayResult, b: ReplayResult, dtype: str, ulp_floor: str) -> Optional[float]:
    """Base's low-precision output's error against head's float64 run on the same input, in the
    units of both sides' figures (None where there is nothing to compare)."""
    if h.reference is None or b.outputs is None or len(h.reference) != len(b.outputs):
        return None
    if any(np.shape(x) != np.shape(y) for x, y in zip(h.reference, b.outputs)):
        return None
    scale = _run_scale(h, b)
    outs = [Output(np.asarray(a), dtype if np.asarray(a).dtype.kind == "f" else str(np.asarray(a).dtype))
            for a in b.outputs]
    refs = [Output(np.asarray(a), "float64" if np.asarray(a).dtype.kind == "f" else str(np.asarray(a).dtype))
            for a in h.reference]
    m = compare(outs, refs, dtype, ulp_floor, scale=scale, check_dtypes=False)
    if m.shape_mismatch or m.int_mismatch:
        return None
    return math.inf if m.nonfinite else m.ulp


def _all_zero(arrays) -> bool:
    """Every float array holds zeros only (at least one element)."""
    fl = [np.asarray(a) for a in arrays if np.asarray(a).dtype.kind == "f"]
    return bool(fl) and any(a.size for a in fl) and all(not np.any(a) for a in fl)


def same_outputs(h: ReplayResult, b: ReplayResult) -> bool:
    """Head's outputs equal base's bit for bit (NaN where NaN) on the same input."""
    if h.outputs is None or b.outputs is None or len(h.outputs) != len(b.outputs):
        return False
    for x, y in zip(h.outputs, b.outputs):
        x, y = np.asarray(x), np.asarray(y)
        if x.shape != y.shape or not np.array_equal(x, y, equal_nan=x.dtype.kind in "fc" and y.dtype.kind in "fc"):
            return False
    return True


def new_nonfinite(h: ReplayResult, b: ReplayResult, dtype: Optional[str] = None) -> int:
    """Elements where head's output is NaN/Inf and base's output is finite (same input).

    With ``dtype``, an infinity that is head's finite float64 result correctly rounded (beyond
    the dtype's range, same sign) does not count where base's finite value there is no answer
    either (off from its own float64 run by 2^(p/2) ulps or more, :func:`base_unreliable`): a
    float16 fix that computes a variance in float32 (transformers #4436, T5's layer norm) turns
    base's 0.0 for a true -524032 into -inf, the float16 value of -524032. A finite base value
    that is right (a float32 area of 300000 where head's float16 overflows) keeps it counted."""
    if h.outputs is None or b.outputs is None or len(h.outputs) != len(b.outputs):
        return 0
    return sum(int(np.count_nonzero(new)) for _, new in new_nonfinite_masks(h, b, dtype))


def _held_nonfinite(head, base) -> Tuple[int, int]:
    """NaN/Inf elements head's and base's float outputs hold, over the inputs both ran."""
    nh = nb = 0
    for h, b in zip(head, base or ()):
        if h.status != OK or b.status != OK:
            continue
        for x, y in zip(h.outputs or (), b.outputs or ()):
            x, y = np.asarray(x), np.asarray(y)
            if x.shape == y.shape and x.dtype.kind == "f" and y.dtype.kind == "f":
                nh += int(np.count_nonzero(~np.isfinite(x)))
                nb += int(np.count_nonzero(~np.isfinite(y)))
    return nh, nb


def new_nonfinite_masks(h: ReplayResult, b: ReplayResult, dtype: Optional[str]):
    """(output index, mask of its new NaN/Inf elements) for each float output pair, by
    :func:`new_nonfinite`'s definition (localise focuses on these elements)."""
    for k, (x, y) in enumerate(zip(h.outputs or (), b.outputs or ())):
        x, y = np.asarray(x), np.asarray(y)
        if x.shape == y.shape and x.dtype.kind == "f" and y.dtype.kind == "f":
            new = ~np.isfinite(x) & np.isfinite(y)
            if dtype is not None and new.any():
                rx, ry = _ref(h, k, x.shape), _ref(b, k, x.shape)
                new &= ~_rounded_overflow(x, y, rx, ry, dtype)
                new &= ~_moved_edge_overflow(new, x, y, rx, ry, dtype)
            yield k, new


def _moved_edge_overflow(new: np.ndarray, x: np.ndarray, y: np.ndarray, rx: Optional[np.ndarray],
                         ry: Optional[np.ndarray], dtype: str) -> np.ndarray:
    """Head's new infinities at the range's end (their float64 values in the top binade or
    beyond: a sum of two products near the largest value overflows or not by the rounding of
    each), where base has as many such infinities on the same input at elements head keeps
    finite: the overflows moved, their number did not grow (keras-hub #1508's rotary fix on
    bfloat16 inputs of +-3.3e38: base's rounded positions overflow 47 elements, head's exact
    ones 1-3 others). Judged as a count, as errors are judged against base's whole run."""
    if rx is None:
        return np.zeros(x.shape, dtype=bool)
    from ..oracles.precision import overflow_bound

    ry = rx if ry is None else ry
    top = overflow_bound(dtype) / 2
    with np.errstate(invalid="ignore"):
        mine = new & np.isinf(x) & np.isfinite(rx) & (np.abs(rx) >= top)
        if not mine.any():
            return mine
        theirs = np.isinf(y) & np.isfinite(x) & np.isfinite(ry) & (np.abs(ry) >= top)
    return mine if np.count_nonzero(theirs) >= np.count_nonzero(mine) else np.zeros(x.shape, dtype=bool)


def _float32_values(r: ReplayResult) -> Optional[bool]:
    """Whether every finite value of ``r``'s float64 run is a float32 value (a float64 run that
    casts its inputs down returns nothing else); None where no reference was kept."""
    vals = [np.asarray(a, dtype=np.float64).ravel() for a in (r.reference or ()) if a is not None]
    v = np.concatenate(vals) if vals else np.zeros(0)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return None
    with np.errstate(over="ignore"):
        return bool(np.array_equal(v.astype(np.float32).astype(np.float64), v))


def _where_float64(h: ReplayResult, b: ReplayResult, dtype: str) -> str:
    """What head's float64 run says on the elements that became NaN/Inf, for the reason text."""
    nonfinite = beyond = inside = 0
    from ..oracles.precision import overflow_bound

    for k, new in new_nonfinite_masks(h, b, dtype):
        r = _ref(h, k, new.shape)
        if r is None:
            continue
        rv = r[new]
        fin = rv[np.isfinite(rv)]
        nonfinite += rv.size - fin.size
        big = int(np.count_nonzero(np.abs(fin) >= overflow_bound(dtype)))
        beyond, inside = beyond + big, inside + fin.size - big
    parts = []
    if nonfinite:
        parts.append(f"head's float64 run is NaN/Inf on {nonfinite} of them too: the function now yields it")
    if beyond:
        parts.append(f"on {beyond} the float64 value is beyond {dtype}'s range and base's finite value was close to it, "
                     "e.g. computed in a wider dtype")
    if inside:
        parts.append(f"on {inside} the float64 value is finite and in range: an intermediate overflows or divides by 0")
    return f" ({'; '.join(parts)})" if parts else ""


def _ref(r: ReplayResult, k: int, shape) -> Optional[np.ndarray]:
    ref = r.reference[k] if r.reference is not None and k < len(r.reference) else None
    return None if ref is None or np.shape(ref) != shape else np.asarray(ref, dtype=np.float64)


def _rounded_overflow(x: np.ndarray, y: np.ndarray, rx: Optional[np.ndarray], ry: Optional[np.ndarray],
                      dtype: str) -> np.ndarray:
    """Elements where ``x`` is +-inf standing for its finite float64 value ``rx`` at the end of
    the dtype's range, and ``y``'s finite value does not hold the answer either:

    * ``rx`` beyond the range (``x`` its correct rounding): ``y`` off from its float64 run ``ry``
      (``rx`` without one) by 2^(p/2) ulps of ``dtype`` or more, or inside the range, where no
      value is the answer (a float16 65504 for a true 65600);
    * ``rx`` inside the range's top binade (an intermediate of a result that large overflows:
      ``x*cos + y*sin`` at bfloat16's 3.4e38): ``y`` off by 2^(p/2) ulps or more (keras-hub
      #1508's rotary fix, on inputs at the range's end: base's wrong angle gave -8.9e37 for a
      true -3.395e38, head -inf).

    A finite value of ``y`` that is right keeps ``x``'s infinity new: a wider output beyond the
    range (a float32 box area of 300000), or a value at the range's end that ``x`` overflowed."""
    if rx is None:
        return np.zeros(x.shape, dtype=bool)
    from ..oracles.precision import overflow_bound, ulp

    ry = rx if ry is None else ry
    ovf = overflow_bound(dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        edge = np.isinf(x) & np.isfinite(rx) & (np.abs(rx) >= ovf / 2) & (np.sign(x) == np.sign(rx))
        if not edge.any():
            return edge
        ok = np.isfinite(ry) & np.isfinite(y)
        off = np.abs(y.astype(np.float64) - np.where(ok, ry, 0.0)) / ulp(np.where(ok, ry, 0.0), dtype)
        noise = off >= half_digits_ulps(dtype)
        beyond = np.abs(rx) >= ovf
        inside = np.abs(y.astype(np.float64)) < ovf
        return edge & ok & (noise | (beyond & inside))


def decide(
    spec: OpSpec,
    variant: Variant,
    head: Sequence[ReplayResult],
    base: Optional[Sequence[ReplayResult]],
    row: Optional[BaselineRow],
    row_status: str,
    finding: Optional[Finding],
    settings: GateSettings,
    inputs: Sequence[str] = (),
    controls: Sequence[bool] = (),
    ordinary: Sequence[bool] = (),
) -> V.VariantVerdict:
    dtype = variant.dtype
    m, floor = settings.m(variant), settings.floor(spec, variant)
    vv = V.VariantVerdict(
        op=spec.name, framework=spec.framework, variant=variant.to_dict(), outcome=V.PASS, reason="",
        seed=finding.seed if finding else None, evals=finding.evals if finding else 0,
        seconds=finding.seconds if finding else 0.0,
    )
    vv.details["floor_ulp"] = floor
    vv.details["multiplier"] = m
    if finding is not None and finding.warmup > 0.5 * max(finding.seconds, 1e-9):
        vv.details["warmup"] = round(finding.warmup, 3)  # most of the search's time was its first call
    vv.details["baseline"] = row_status
    lost = [i for i, (h, b) in enumerate(zip(head, base or ()))
            if h.status == UNSUPPORTED and str(h.error or "").startswith(NOT_DIFFERENTIABLE) and b.status == OK]
    if lost:  # base had a gradient on these inputs; head's output no longer carries one (a .detach(), no_grad)
        vv.outcome = V.REGRESSION
        vv.reason = (f"gradient lost: base's output is differentiable on {len(lost)} input(s) where head's is not "
                     f"({head[lost[0]].error})")
        vv.details["kind"] = "grad-lost"
        vv.details["input_index"] = lost[0]
        return vv
    base_returns = base is not None and any(r.status == OK for r in base)
    if (finding is not None and finding.status == "unsupported" and not any(r.status == OK for r in head)
            and not base_returns):
        if base is not None and any(_raises(r) for r in base):
            shared = next(r for r in base if _raises(r))
            vv.outcome = V.UNSUPPORTED
            vv.reason = f"base fails the same way: head and base both raise on every input ({shared.error})"
            vv.details["shared_failures"] = sum(_raises(r) for r in base)
        elif str(finding.message or "").startswith(NOT_DIFFERENTIABLE):
            vv.outcome, vv.reason = V.UNSUPPORTED, f"gradient not checked: {finding.message}"
        else:
            vv.outcome, vv.reason = V.UNSUPPORTED, f"{spec.framework} has no kernel for this variant: {finding.message}"
        return vv

    ok_head = [r for r in head if r.status == OK]
    head_max = max((r.metrics.ulp for r in ok_head), default=None)
    head_nonfinite = sum(r.metrics.nonfinite for r in ok_head)
    head_crash = next((r for r in head if r.status == CRASH), None)
    vv.head_error, vv.head_nonfinite = head_max, head_nonfinite
    vv.head_crash = head_crash.error if head_crash else None

    base_usable = base is not None and any(r.status != UNAVAILABLE for r in base)
    if base_usable:
        return _true_value(spec, _decide_with_base(spec, variant, head, base, row, row_status, settings, vv, inputs,
                                                   controls, ordinary))

    return _decide_with_row(vv, head, base, row, row_status, head_max, head_nonfinite, head_crash, m, floor, dtype)


def _decide_with_row(vv, head, base, row, row_status, head_max, head_nonfinite, head_crash, m, floor, dtype
                     ) -> V.VariantVerdict:
    """No base replay (a framework built-in, or base cannot import the operator): head is held
    against the stored baseline row."""
    if base is not None:
        vv.details["base"] = base[0].error if base else "unavailable"
    if row_status == "missing" or row is None:
        if head_crash or head_nonfinite:
            vv.outcome = V.NEEDS_BASELINE
            vv.reason = ("no baseline and no base version to compare with; head "
                         + ("raises " + (head_crash.error or "") if head_crash else f"returns NaN/Inf on {head_nonfinite} elements"))
        else:
            vv.outcome, vv.reason = V.NEEDS_BASELINE, f"no baseline for {vv.key}; head max error {_f(head_max)} ulp"
        return vv
    if row_status == "not-comparable":
        vv.outcome = V.NOT_COMPARABLE
        vv.reason = f"baseline recorded in another environment ({row.env.get('version')}, {row.env.get('capability')})"
        vv.base_error = row.ulp
        return vv
    if head_max is None and not head_crash:
        return _nothing_compared(vv, head, None)
    why = _unmeasured(head)
    if why and not head_crash and not head_nonfinite:
        vv.outcome = V.NOT_MEASURED
        vv.reason = (f"not measured: {why}; build the operator in the variant's dtype (a Keras layer: "
                     f"dtype='{dtype}'), or drop {dtype} from the row's dtypes")
        vv.details["not_measured"] = {"head": why}
        return vv
    vv.base_error, vv.base_nonfinite, vv.base_crash = row.ulp, row.nonfinite, row.crash
    thr = max(floor, m * row.ulp)
    vv.threshold = thr
    if head_crash and not row.crash:
        vv.outcome, vv.reason = V.REGRESSION, f"new crash: {head_crash.error}"
    elif head_nonfinite and not row.nonfinite:
        vv.outcome, vv.reason = V.REGRESSION, f"new NaN/Inf: {head_nonfinite} non-finite outputs where float64 is finite (baseline had none)"
    elif head_max is not None and head_max > thr:
        vv.outcome = V.REGRESSION
        vv.reason = f"{dtype} error {_f(head_max)} ulp > {_f(thr)} (max(floor {_f(floor)}, {m:g} x baseline {_f(row.ulp)}))"
    elif head_max is not None and row.ulp > max(floor, m * head_max):
        vv.outcome, vv.reason = V.IMPROVEMENT, f"error {_f(row.ulp)} -> {_f(head_max)} ulp"
    else:
        vv.outcome, vv.reason = V.PASS, f"error {_f(head_max)} ulp within {_f(thr)} (baseline {_f(row.ulp)})"
    return vv


@dataclass
class _Tally:
    """What the head/base comparison of every input found (``_compare_pairs``'s output)."""
    worst: Tuple[float, int, str] = (-1.0, -1, "")  # (severity, input, reason) of the worst regression
    behaviour: Tuple[float, int] = (-1.0, -1)  # (float64 divergence, input) of the largest behaviour change
    base_max: float = 0.0
    base_judged_max: float = 0.0  # base's largest error over the inputs judged for precision
    head_max_same: float = 0.0
    fixed: int = 0
    gained: int = 0  # inputs where head has a gradient and base's output had none (a detach removed)
    shared: int = 0  # inputs where head and base both raise (not new: base fails the same way)
    shared_error: str = ""
    garbage: int = 0
    pairs: int = 0
    identical: int = 0  # inputs with bit-identical outputs
    moved_ref: int = 0  # of those, with a moved reference
    low_ref: Dict[str, int] = field(default_factory=dict)  # side -> inputs where its reference equals its output
    fine_ref: int = 0  # moved references both really float64 (not float32 values): a change the dtype rounds away
    fine_ref_ulp: float = 0.0
    ref_moved: float = 0.0  # the largest move of the float64 run within the threshold (not a behaviour change)
    # fixes on inputs from the operator's ordinary value domain (random draws, all-zero and
    # constant tensors, structured rows), not the search's edges: a changed constant that moves
    # an overflow at 1e38 "fixes" an input there by accident, an eps fixes the flat image
    fixed_ordinary: int = 0
    changed_at: Optional[Tuple[int, float]] = None  # (input, float64 move) of the worst precision loss
    base_reach: float = 0.0  # base's largest error on any input of the run where it kept half its digits
    # a gradient's inputs with new NaN/Inf where base's own forward output was NaN/Inf and head's
    # is not (head fixed the function there): reported, not failed; the first of them
    forward_fixed: int = 0
    forward_fixed_at: int = -1
    # control inputs (random draws from the row's value spaces) whose float64 runs were
    # compared; of them, those where head's moved (beyond the tolerance) and those where it
    # moved beyond half the dtype's digits (read by stability_fixes)
    controls_compared: int = 0
    controls_moved: int = 0
    controls_far: int = 0

    # the worst input where head's error is above the threshold but base's output is no closer
    # to head's float64 run than head's (that run moved beyond the threshold there): (severity,
    # input, reason, base's error against head's float64 run, the float64 move), and how many
    closer: Tuple[float, int, str, float, float] = (-1.0, -1, "", 0.0, 0.0)
    closer_n: int = 0

    def regress(self, sev: float, i: int, why: str) -> None:
        self.worst = max(self.worst, (sev, i, why), key=lambda x: x[0])


def base_reach(head, base, dtype: str) -> float:
    """Base's largest error over every input both sides ran (those where head's output is base's
    bit for bit included: there the error is the shared code's), where base kept half its digits
    (:func:`base_unreliable`). A precision loss is a loss against what base's computation does:
    on one input base's error can be luck - a gradient that routes a zero residue differently
    (a softmax's shift written ``amax`` spreads it over tied maxima, ``max`` gives it to one)
    reads 1.3 ulp on one side and 22.6 on the other of an all-zero row, while the same code
    errs by 348 ulp on the run's other inputs. Head's error must exceed both ``m x`` base's on
    the input and this."""
    reach = 0.0
    for h, b in zip(head, base):
        if h.status != OK or b.status != OK or b.metrics is None or b.metrics.nonfinite:
            continue
        e = b.metrics.ulp
        if math.isfinite(e) and not base_unreliable(e, dtype):
            reach = max(reach, e)
    return reach


def _decide_with_base(spec, variant, head, base, row, row_status, settings, vv, inputs, controls,
                      ordinary=()) -> V.VariantVerdict:
    m, floor = settings.m(variant), settings.floor(spec, variant)
    # outputs are the operator's own (or its gradients) at the variant dtype
    by_output = variant.oracle in ("precision", "grad")
    t = _Tally()
    t.base_reach = base_reach(head, base, variant.dtype)
    for i, (h, b) in enumerate(zip(head, base)):
        _compare_pair(t, i, h, b, spec, variant.dtype, m, floor, by_output, controls, ordinary)
    if t.closer[1] >= 0 and t.behaviour[1] >= 0 and t.behaviour[0] > half_digits_ulps(variant.dtype):
        # the function changed on the control inputs too, beyond half the dtype's digits (another
        # function): base's yardstick stands, as before. Within half the digits (a refinement: a
        # regularisation or an approximation removed) head computes the same function, more
        # exactly: where its float64 run then moved far on an edge input, base's output there is
        # another value, and head's ulps there are no loss against it (naver/roma 34bd744: a
        # Procrustes gradient near equal singular values, head -0.0617 where base gave 4.08, both
        # 6.6e-6 off their float64 runs; head's 6e3 ulp were base's absolute error on a smaller value)
        t.regress(*t.closer[:3])
        if t.worst[1] == t.closer[1]:
            t.changed_at = (t.closer[1], t.closer[4])
        t.closer = (-1.0, -1, "", 0.0, 0.0)
    _tally_details(vv, t, variant.dtype)
    h_um, b_um = _unmeasured(head), _unmeasured(base)
    if h_um and b_um and not (t.worst[1] >= 0 and math.isinf(t.worst[0])):  # a crash or new NaN still fails
        return _not_measured(vv, variant.dtype, h_um, b_um)
    if h_um or b_um:
        # one side computes in a wider dtype and returns it (fvcore's focal loss `inputs.float()`,
        # torchvision's box_area upcast): what its callers get, judged as it is in the variant's
        # ulps (beyond the dtype's range too: gate.search.score.ulp), against the other side's
        # variant-dtype output on the same inputs; the changed dtype itself is reported
        vv.details["output_dtype_changed"] = h_um or b_um
        vv.details["warning"] = (f"the output dtype changed: on head {h_um}; base's {variant.dtype} run returned "
                                 f"{variant.dtype}; once merged, this row is not measured at {variant.dtype}: drop "
                                 f"{variant.dtype} from its dtypes" if h_um else
                                 f"the output dtype changed: head's {variant.dtype} run returns {variant.dtype}, on "
                                 f"base {b_um}")
    _stability_tradeoff(vv, t, m)
    if t.worst[1] >= 0:
        return _regression(vv, t, head, base, inputs, m, floor, by_output)
    if t.closer[1] >= 0:
        return _closer_than_base(vv, t, variant.dtype, inputs)
    vv.base_error, vv.head_error = t.base_max, t.head_max_same
    # the largest bar an input was held to: base's errors where it kept half its digits (on an
    # input where both sides flush a subnormal result to 0, base's 1e7 "ulp" is no bar and no
    # input was judged against it: shown, it read as a threshold of 3e7)
    vv.threshold = max(floor, t.base_reach, m * t.base_judged_max)
    if t.gained and t.pairs == 0 and t.identical == 0:
        # the mirror of "gradient lost": base's output carried no gradient, head's does (ignite #1675)
        vv.outcome = V.IMPROVEMENT
        vv.reason = f"gradient gained: head's output is differentiable on {t.gained} input(s) where base's is not"
        return vv
    if t.pairs == 0 and t.identical == 0 and not t.fixed and t.behaviour[1] < 0:
        if t.shared:
            vv.outcome = V.UNSUPPORTED
            vv.reason = (f"base fails the same way: head and base both raise on all {t.shared} input(s) that ran "
                         f"({t.shared_error})")
            return vv
        return _nothing_compared(vv, head, base)
    if t.behaviour[1] >= 0:
        return _behaviour_change(vv, t, variant.dtype, settings, inputs)
    if t.forward_fixed:
        return _gradient_of_a_fix(vv, t, variant.dtype, inputs)
    return _no_regression(vv, t, variant.dtype, row, row_status, base, m, floor, head=head)


def _compare_pair(t: _Tally, i: int, h, b, spec, dtype: str, m: float, floor: float, by_output: bool,
                  controls, ordinary=()) -> None:
    """Head's and base's evaluation of input ``i``, booked into ``t``."""
    is_ordinary = bool(ordinary[i]) if i < len(ordinary) else True
    if b.status == UNAVAILABLE:
        return
    if _fails(h) and b.status == OK:
        # an INVALID evaluation is the float64 run's failure (the runner runs it first): a float64
        # caller's new crash, said as such (tensorflow/addons' focal loss read "head raises")
        what = f"head's float64 run fails ({h.error})" if h.status == INVALID else f"head raises {h.error}"
        t.regress(math.inf, i, f"new crash: {what} where base returns")
        return
    if h.status == OK and b.status == UNSUPPORTED and str(b.error or "").startswith(NOT_DIFFERENTIABLE):
        t.gained += 1
        return
    if h.status == OK and _fails(b):
        t.fixed += 1
        t.fixed_ordinary += is_ordinary
        return
    if _raises(h) and _raises(b):  # not new: base fails the same way on this input
        t.shared += 1
        t.shared_error = t.shared_error or (h.error or b.error or "")
        return
    if h.status != OK or b.status != OK:
        return
    t.pairs += 1
    hm, bm = h.metrics, b.metrics
    if by_output and same_outputs(h, b):
        # the operator's result did not change; a different error can only come from the
        # reference (e.g. base cast its float64 input down): nothing to hold against head, and
        # no improvement either (the smaller of the two errors is each side's figure here)
        t.identical += 1
        d = ref_divergence(h, b, dtype, spec.ulp_floor)
        _count_control(t, i, d, dtype, controls)
        if d is not None and d > BEHAVIOUR_TOLERANCE_ULP:
            t.moved_ref += 1
            # the same output, one side's "float64" run equal to it to the last bit and the
            # other's not: that side's reference ran at the variant's precision (`x.float()`)
            side = None
            if (hm.ulp == 0.0) != (bm.ulp == 0.0):
                side = "head" if hm.ulp == 0.0 else "base"
            else:  # a float64 run that casts down returns float32 values only, a true one rarely does
                he, be = _float32_values(h), _float32_values(b)
                if he is not None and be is not None and he != be:
                    side = "head" if he else "base"
                elif he is False and be is False:
                    t.fine_ref += 1  # both really float64: the change is below the dtype's resolution
                    t.fine_ref_ulp = max(t.fine_ref_ulp, d)
            if side is not None:
                t.low_ref[side] = t.low_ref.get(side, 0) + 1
        t.head_max_same = max(t.head_max_same, min(hm.ulp, bm.ulp))
        t.base_max = max(t.base_max, min(hm.ulp, bm.ulp))
        return
    if not by_output and hm.nonfinite and not bm.nonfinite:
        # another oracle's outputs (a gradient, a compiled twin): its own NaN/Inf count decides
        t.regress(math.inf, i, f"new NaN/Inf: {hm.nonfinite} non-finite outputs where float64 is finite and base had none")
        return
    nf = new_nonfinite(h, b, dtype) if by_output else 0
    if nf and _forward_fixed(h, b):  # no gradient of base's to lose there: reported (_gradient_of_a_fix)
        t.forward_fixed += 1
        t.forward_fixed_at = i if t.forward_fixed_at < 0 else t.forward_fixed_at
        return
    if nf:
        t.regress(math.inf, i, f"new NaN/Inf: head returns NaN/Inf on {nf} elements where base's output is "
                               f"finite{_where_float64(h, b, dtype)}")
        return
    if by_output and new_nonfinite(b, h, dtype):
        # head returns numbers where base returned NaN/Inf: a fix, whatever head's error there
        # (base's NaN "matched" its own NaN reference, which is no accuracy to hold head to);
        # nor do its figures enter the "elsewhere" of the report (head's error on the fixed
        # elements read as "elsewhere 15.3 -> 1.02e+04 ulp")
        t.fixed += 1
        t.fixed_ordinary += is_ordinary
        return
    t.base_max = max(t.base_max, bm.ulp)
    t.head_max_same = max(t.head_max_same, hm.ulp)
    if hm.int_mismatch and not bm.int_mismatch:
        t.regress(math.inf, i, f"integer outputs differ from the reference on {hm.int_mismatch} elements (base: none)")
        return
    thr = max(floor, m * bm.ulp, t.base_reach)
    if base_unreliable(bm.ulp, dtype):
        t.garbage += 1  # base kept fewer than half its digits here: not judged (NaN/Inf, crashes still count)
    else:
        t.base_judged_max = max(t.base_judged_max, bm.ulp)
    if not base_unreliable(bm.ulp, dtype) and hm.ulp > thr:
        sev = hm.ulp / thr
        moved = ref_divergence(h, b, dtype, spec.ulp_floor)
        cross = base_against_head(h, b, dtype, spec.ulp_floor) if moved is not None and moved > thr else None
        if cross is not None and cross >= hm.ulp:
            # the float64 runs differ beyond the threshold on this input (base's formula was
            # inexact in float64 too: torch_activation's log(1 + exp(-90)) is 0 in both
            # precisions, its log1p fix -8.3e-38) and base's own output is no closer to head's
            # float64 value than head's output is: head lost nothing base delivered. Reported;
            # it fails after all where the function changed on the control inputs too
            if sev > t.closer[0]:
                t.closer = (sev, i, f"{dtype} error {_f(hm.ulp)} ulp > {_f(thr)} (max(floor {_f(floor)}, {m:g} x "
                                    f"base {_f(bm.ulp)})) on the same input", cross, moved)
            t.closer_n += 1
        elif sev > t.worst[0]:
            reach = f", base's largest elsewhere {_f(t.base_reach)}" if t.base_reach > max(floor, m * bm.ulp) else ""
            t.worst = (sev, i, f"{dtype} error {_f(hm.ulp)} ulp > {_f(thr)} (max(floor {_f(floor)}, {m:g} x base "
                               f"{_f(bm.ulp)}{reach})) on the same input")
            # the float64 runs differ beyond the threshold here: head computes another value
            # on this input (an eps now added), so base's error is not the yardstick
            t.changed_at = (i, moved) if moved is not None and moved > thr else None
    if bm.nonfinite and not hm.nonfinite:
        t.fixed += 1
        t.fixed_ordinary += is_ordinary
    _behaviour(t, i, h, b, spec, dtype, thr, controls)


def _behaviour(t: _Tally, i: int, h, b, spec, dtype: str, thr: float, controls) -> None:
    # behaviour change is judged on control inputs from the bulk of the value domain: at
    # adversarial edges (subnormal or overflowing intermediates) a float64 reference can
    # itself be inexact, and a changed formula there shows up as a precision difference
    is_control = controls[i] if i < len(controls) else True
    d = ref_divergence(h, b, dtype, spec.ulp_floor) if is_control else None
    if d is None and _int_outputs_differ(h, b):
        d = math.inf  # integer outputs (indices) are exact on any input: a tie now broken differently
    _count_control(t, i, d, dtype, controls)
    # the float64 run moved by less than the variant's own error threshold on this input: an
    # approximation replaced by the exact function (or the reverse) within the accuracy the
    # gate holds it to; reported as "reference moved", not a behaviour change
    if d is not None and BEHAVIOUR_TOLERANCE_ULP < d <= thr and math.isfinite(d):
        t.ref_moved = max(t.ref_moved, d)
    elif d is not None and d > BEHAVIOUR_TOLERANCE_ULP and d > t.behaviour[0]:
        t.behaviour = (d, i)


def _count_control(t: _Tally, i: int, d: Optional[float], dtype: str, controls) -> None:
    """Count a control input whose float64 runs were compared (``d``: their divergence), and
    whether they differ beyond half the dtype's digits."""
    if d is None or not (controls[i] if i < len(controls) else True):
        return
    t.controls_compared += 1
    t.controls_moved += d > BEHAVIOUR_TOLERANCE_ULP
    t.controls_far += d > half_digits_ulps(dtype)


def _tally_details(vv: V.VariantVerdict, t: _Tally, dtype: str) -> None:
    vv.details["pairs"] = t.pairs
    if t.controls_compared:
        vv.details["controls_changed"] = {"compared": t.controls_compared, "moved": t.controls_moved,
                                          "beyond_half_digits": t.controls_far}
    if t.ref_moved:  # the float64 run moved within the threshold (read by refinements)
        vv.details["ref_moved_ulp"] = t.ref_moved
    if t.behaviour[1] >= 0:  # and beyond it, on control inputs (whatever the verdict)
        vv.details["divergence_ulp"] = t.behaviour[0]
    vv.details["identical_outputs"] = t.identical
    if t.shared:
        vv.details["shared_failures"] = t.shared
    if t.fixed_ordinary:  # head returns numbers where base failed, on ordinary inputs (read by stability_fixes)
        vv.details["fixed_inputs"] = t.fixed_ordinary
    if t.garbage:
        vv.details["base_unreliable"] = t.garbage  # inputs where precision was not judged (base_unreliable)
    if t.ref_moved:
        vv.details["reference_moved_ulp"] = round(t.ref_moved, 3)
    if t.moved_ref:
        vv.details["reference_moved"] = t.moved_ref
        which = "one side's reference does not run in float64"
        if not t.low_ref and t.fine_ref == t.moved_ref:
            # an eps 1e-20 -> 1e-5 (vector-quantize-pytorch 569b8b0) under float16's resolution:
            # the PR changed the function, not the variant's results; nothing is untrustworthy
            vv.details["warning"] = (
                f"on {t.moved_ref} input(s) head's {dtype} output equals base's bit for bit while the float64 runs "
                f"differ (by up to {_f(t.fine_ref_ulp)} {dtype} ulp): the change does not reach {dtype}'s results "
                f"there (an eps or a constant that the {dtype} computation rounds away); each side's error is measured "
                "against its own float64 run")
            return
        if len(t.low_ref) == 1:
            (side, n), = t.low_ref.items()
            vv.details["low_reference"] = side
            which = (f"{side}'s reference does not run in float64 (on {n} of them its float64 run equals its {dtype} "
                     "output to the last bit)")
        vv.details["warning"] = (
            f"on {t.moved_ref} input(s) head's {dtype} output equals base's bit for bit but the float64 references "
            f"differ: {which} (e.g. the code casts its input to float32), so its error figure is not trustworthy "
            f"and {dtype} precision is not measured by it")


def _stability_tradeoff(vv: V.VariantVerdict, t: _Tally, m: float) -> None:
    """A stability fix (head returns numbers where base returned NaN/Inf or raised) usually
    reformulates (log space, a clamp): its rounding moves elsewhere. Within m x the threshold
    that is reported, not failed; a larger loss still fails (the fix broke more)."""
    worst = t.worst
    if worst[1] >= 0 and t.fixed and math.isfinite(worst[0]) and worst[0] <= m:
        i = worst[1]
        vv.details["stability_tradeoff"] = {"input_index": i, "severity": round(worst[0], 3)}
        vv.details["warning"] = (f"head fixes NaN/Inf or a crash on {t.fixed} input(s) and is less precise elsewhere: "
                                 f"{worst[2]} ({worst[0]:.2g}x the threshold, within {m:g}x: reported, not failed)")
        t.worst = (-1.0, -1, "")


def _unmeasured(results) -> Optional[str]:
    """Why one side's figures do not measure the variant (:func:`gate.oracles.precision.not_measured`)."""
    return next((r.metrics.unmeasured for r in results or ()
                 if r.status == OK and r.metrics is not None and r.metrics.unmeasured), None)


def _not_measured(vv: V.VariantVerdict, dtype: str, head_why: Optional[str], base_why: Optional[str]
                  ) -> V.VariantVerdict:
    """A run that is not what it claims on both sides is never a 0-ulp pass: ``not-measured``
    with what to change (one side only is the output dtype changing, judged in
    :func:`_decide_with_base`)."""
    vv.details["not_measured"] = {"head": head_why, "base": base_why}
    vv.outcome = V.NOT_MEASURED
    vv.reason = (f"not measured: {head_why}, on base too; build the operator in the variant's dtype (a Keras "
                 f"layer: dtype='{dtype}'), or drop {dtype} from the row's dtypes")
    return vv


def _regression(vv: V.VariantVerdict, t: _Tally, head, base, inputs, m: float, floor: float,
                by_output: bool) -> V.VariantVerdict:
    i = t.worst[1]
    h, b = head[i], base[i]
    vv.outcome, vv.reason = V.REGRESSION, t.worst[2]
    if t.fixed:  # a trade, not a plain regression: the report says both (torchmetrics #1030: NaN at p=0
        # fixed, inf at a subnormal q introduced)
        vv.reason += f"; head also fixes NaN/Inf or a crash on {t.fixed} other input(s) where base failed"
        vv.details["fixed_inputs_total"] = t.fixed
    vv.head_error = h.metrics.ulp if h.metrics else None
    vv.base_error = b.metrics.ulp if b.metrics else None
    kind = ("crash" if _failed(h) else "nonfinite" if t.worst[2].startswith("new NaN/Inf")
            else "int" if t.worst[2].startswith("integer outputs") else "precision")
    vv.details["kind"] = kind  # what the report draws: one kind, one NaN count, per verdict
    nf_new = new_nonfinite(h, b, vv.variant["dtype"]) if by_output else 0
    vv.head_nonfinite = (nf_new or (h.metrics.nonfinite if h.metrics else 0)) if kind == "nonfinite" else \
        (h.metrics.nonfinite if h.metrics else 0)
    vv.base_nonfinite = b.metrics.nonfinite if b.metrics else 0
    vv.threshold = max(floor, m * (vv.base_error or 0.0), t.base_reach if kind == "precision" else 0.0)
    vv.head_crash = h.error if _failed(h) else None
    vv.details["input_index"] = i
    if kind == "precision":
        if t.changed_at is not None and t.changed_at[0] == i:
            vv.details["function_changed_ulp"] = round(t.changed_at[1], 3)
        # where the function was refined, base's error on this input is another function's: the
        # yardstick over every judged input (read by refinements)
        vv.details["threshold_over_inputs"] = max(floor, m * t.base_judged_max)
    if i < len(inputs):
        vv.input_summary = inputs[i]
    return vv


def _closer_than_base(vv: V.VariantVerdict, t: _Tally, dtype: str, inputs) -> V.VariantVerdict:
    """Head's error is above the threshold only on inputs where its float64 output moved beyond
    the threshold and base's output is no closer to that value than head's: the function moved
    there (base's formula inexact in float64 too), head lost nothing base delivered. A behaviour
    change, reported, not failed (``closer_than_base``)."""
    sev, i, why, cross, moved = t.closer
    vv.outcome = V.BEHAVIOUR_CHANGE
    vv.base_error, vv.head_error = t.base_max, t.head_max_same
    vv.details["divergence_ulp"] = moved
    vv.details["closer_than_base"] = {"inputs": t.closer_n, "input_index": i, "base_against_head_ulp": round(cross, 3)}
    vv.details["input_index"] = i
    vv.reason = (f"{why}, but head's float64 output moved there by {_f(moved)} {dtype} ulp and base's {dtype} output "
                 f"is {_f(cross)} ulp from it: head's output is the closer one (base's formula was inexact in "
                 "float64 too): reported, not failed")
    if i < len(inputs):
        vv.input_summary = inputs[i]
    return vv


def _behaviour_change(vv: V.VariantVerdict, t: _Tally, dtype: str, settings, inputs) -> V.VariantVerdict:
    i = t.behaviour[1]
    vv.outcome = V.BEHAVIOUR_CHANGE
    d = t.behaviour[0]
    vv.details["divergence_ulp"] = d
    if math.isinf(d):
        vv.reason = ("head's float64 run returns different integer outputs or shapes than base's on the same "
                     "input (the function changed; precision did not worsen)")
    elif d <= half_digits_ulps(dtype):
        # a refinement: head and base agree to half the dtype's digits (an approximation replaced
        # by the exact function, a coefficient refined) and precision did not worsen. A different
        # function (a wrong scale, a wrong axis) differs in its leading digits and still fails
        vv.details["refinement"] = {"divergence_ulp": d, "within_ulp": half_digits_ulps(dtype)}
        vv.reason = (f"refinement: head's float64 output differs from base's by {_f(d)} {dtype} ulp on the same "
                     f"input, within half the {dtype} digits ({_f(half_digits_ulps(dtype))} ulp), and precision did "
                     "not worsen: reported, not failed")
    else:
        vv.reason = (f"head's float64 output differs from base's by {_f(d)} {dtype} ulp on the same "
                     "input (the function changed; precision did not worsen)")
    vv.details["input_index"] = i
    vv.details["behaviour_change"] = settings.behaviour_change
    if i < len(inputs):
        vv.input_summary = inputs[i]
    return vv


def _forward_fixed(h: ReplayResult, b: ReplayResult) -> bool:
    """A gradient variant's input on which base's own forward output held more NaN/Inf where its
    float64 forward is finite than head's (``Metrics.forward_nonfinite``): head fixed the
    function on this input (in float16 a true value beyond the range still overflows on both
    sides), and base's gradient of values it could not compute was no answer."""
    return bool(h.metrics is not None and b.metrics is not None
                and b.metrics.forward_nonfinite > h.metrics.forward_nonfinite)


def _gradient_of_a_fix(vv: V.VariantVerdict, t: _Tally, dtype: str, inputs) -> V.VariantVerdict:
    """New NaN/Inf in a gradient only on inputs where head fixed the forward (:func:`_forward_fixed`),
    and nothing else regressed: a behaviour change, reported and never failed. ``hypot`` for the
    square root of the squares (piqa 5ac2e7d) fixes the forward's overflow of ``gx * gx``; torch's
    hypot backward (``grad * x / result``) still overflows at x = 1.7e38 in float32, where base's
    gradient through the overflowed square read 0 for a true 2.0."""
    i = t.forward_fixed_at
    vv.outcome = V.BEHAVIOUR_CHANGE
    vv.details["gradient_of_a_fix"] = t.forward_fixed
    vv.details["input_index"] = i
    vv.reason = (f"new NaN/Inf in the {dtype} gradient on {t.forward_fixed} input(s), only on inputs where head's "
                 f"{dtype} forward returns numbers where base's returned NaN/Inf (head fixed the function there; "
                 "base's gradient of values it could not compute was no answer): reported, not failed")
    if t.pairs:
        vv.reason += f"; elsewhere head {_f(t.head_max_same)} ulp vs base {_f(t.base_max)} ulp on {t.pairs} input(s)"
    vv.base_error, vv.head_error = t.base_max, t.head_max_same
    if i < len(inputs):
        vv.input_summary = inputs[i]
    return vv


def _no_regression(vv: V.VariantVerdict, t: _Tally, dtype: str, row, row_status, base, m: float,
                   floor: float, head) -> V.VariantVerdict:
    """Needs a baseline, an improvement, or a pass."""
    base_max, head_max_same, fixed, pairs = t.base_max, t.head_max_same, t.fixed, t.pairs
    if row_status == "missing":
        vv.outcome = V.NEEDS_BASELINE
        vv.reason = f"no baseline for {vv.key}; head matches base on {pairs} identical inputs (max {_f(head_max_same)} ulp)"
        return vv
    if t.shared and vv.head_crash and not vv.base_crash:
        # inputs where both raise: the table reads "raises" on both sides, as the reason says
        vv.base_crash = t.shared_error or vv.head_crash
    if fixed or base_max > max(floor, m * head_max_same):
        vv.outcome = V.IMPROVEMENT
        # what the outputs hold on the compared inputs, on both sides: each side's own count is of
        # NaN/Inf where its float64 run is finite, and a fixed 0/0 is NaN in base's float64 run
        # too (0 on base's side) while head's NaN shared with base elsewhere counted (roma's
        # rotvec_to_rotmat fix read "base 0, head 312 NaN/Inf" beside "head fixes NaN/Inf")
        vv.head_nonfinite, vv.base_nonfinite = _held_nonfinite(head, base)
        if fixed:
            vv.reason = (f"head fixes NaN/Inf or a crash on {fixed} input(s) where base failed "
                         f"(elsewhere {_f(base_max)} -> {_f(head_max_same)} ulp)")
        else:
            vv.reason = f"error {_f(base_max)} -> {_f(head_max_same)} ulp on identical inputs"
        return vv
    if row_status == "not-comparable":
        vv.details["baseline_env"] = row.env if row else None
    vv.outcome = V.PASS
    vv.reason = f"head {_f(head_max_same)} ulp vs base {_f(base_max)} ulp on {pairs} identical inputs (threshold {_f(vv.threshold)})"
    if t.garbage:  # a passing row with a huge error says why it passes
        vv.reason += (f"; {t.garbage} of them not judged for precision: base's own error there is "
                      f"{_f(half_digits_ulps(dtype))} ulp or more (fewer than half its digits right)")
    if t.shared:
        vv.reason += f"; {t.shared} input(s) raise on base and head alike (not new: base fails the same way)"
    if t.ref_moved:
        vv.reason += (f"; the float64 run moved by up to {_f(t.ref_moved)} {dtype} ulp, within the threshold "
                      "(reference moved, not a behaviour change)")
    # the columns say what the two outputs hold on the inputs both ran, as an improvement's do:
    # each side's own count (NaN/Inf where its float64 run is finite) differs wherever the two
    # float64 runs do, and read "head 1883, base 1967 NaN/Inf" beside 15 of 15 identical outputs
    # (pytorch-metric-learning's PNPLoss fix in the acceptance run); a base whose "float64" run is
    # float32 (AMPLIFY's `x.float()`) counted none of the NaN its output holds
    vv.head_nonfinite, vv.base_nonfinite = _held_nonfinite(head, base)
    if vv.head_nonfinite and vv.base_nonfinite:
        vv.reason += f"; NaN/Inf in both (head {vv.head_nonfinite}, base {vv.base_nonfinite} elements): not new"
    return vv


def _true_value(spec: OpSpec, vv: V.VariantVerdict) -> V.VariantVerdict:
    """With a declared ``reference:`` both sides are measured against the same trusted value
    (a correctly rounded mpmath function, or the user's own): the verdict says which side is
    closer to the true value instead of comparing two float64 runs."""
    if not spec.reference or vv.details.get("kind") not in (None, "precision"):
        return vv
    vv.details["reference"] = spec.reference
    if vv.outcome == V.IMPROVEMENT and not vv.reason.startswith("head fixes"):
        vv.reason = f"head is closer to the true value ({spec.reference}): {vv.reason}"
    elif vv.outcome == V.REGRESSION:
        vv.reason = f"head is further from the true value ({spec.reference}): {vv.reason}"
    return vv


#: row keys a PR may not narrow for its own run (the base's values are kept as well)
WIDENED = ("dtypes", "modes", "devices")


def judged_row(spec: OpSpec, base: OpSpec) -> Tuple[OpSpec, Optional[str]]:
    """The operator row a PR is judged with, and a warning: the base's thresholds, and the union
    of the base's and the head's dtypes/modes/devices (a PR cannot drop float16 from its own
    gate); any other change of the row (domains, dims, params) is reported, since it changes
    what is searched."""
    if base.thresholds:
        spec = spec.replace(thresholds=base.thresholds)
    widened = {k: tuple(dict.fromkeys(tuple(getattr(spec, k)) + tuple(getattr(base, k)))) for k in WIDENED}
    if any(widened[k] != tuple(getattr(spec, k)) for k in WIDENED):
        spec = spec.replace(**widened)
    h, b = spec.to_dict(), base.to_dict()
    changed = sorted(k for k in set(h) | set(b)
                     if k not in WIDENED + ("thresholds", "callable", "sources", "description") and h.get(k) != b.get(k))
    warning = (f"{spec.name}: this PR changes its operator row ({', '.join(changed)}); the run searches the "
               "head's row, the base's dtypes, modes and thresholds are kept") if changed else None
    return spec, warning


def base_side(spec: OpSpec, base: Optional[OpSpec]) -> OpSpec:
    """The row base is replayed with: the callable base's own config names (a PR may rename it)."""
    if base is not None and base.callable != spec.callable:
        return spec.replace(callable=base.callable, reference=base.reference)
    return spec


def under_searched(vv: V.VariantVerdict, settings: GateSettings, asked_evals: Optional[int] = None) -> None:
    """A variant whose search ran fewer evaluations than a pass needs is not a pass: it becomes
    ``under-searched`` (what it would have been is kept in its details). An ``--evals`` budget
    below the minimum lowers it (the user asked for that many); a verdict that fails, or that is
    no judgement of precision (unsupported, needs-baseline), is left as it is."""
    need = min(settings.min_evals, asked_evals) if asked_evals else settings.min_evals
    if need <= 0 or vv.outcome not in (V.PASS, V.IMPROVEMENT) or vv.evals >= need:
        return
    vv.details["would_be"] = vv.outcome
    vv.details["min_evals"] = need
    vv.outcome = V.UNDER_SEARCHED
    warm = vv.details.get("warmup")
    took = f"{vv.seconds:.3g}s" + (f", {warm:.3g}s of them the first call's warm-up" if warm else "")
    vv.reason = (f"under-searched: {vv.evals} evaluation(s) in {took}, fewer than the {need} a pass needs "
                 f"(raise budget.total / per_op, or narrow --dtype/--mode); it would have been: {vv.reason}")


def recheck_determinism(vv: V.VariantVerdict, spec: OpSpec, variant: Variant, cand, first: ReplayResult,
                        isolate=None) -> None:
    """Before a failing verdict stands: run head once more on the input it rests on. If the
    operator's outputs differ between two runs on the same values, or its float64 run moves by
    more than rounding (the error the verdict rests on is measured against it: an operator whose
    noise is below the variant's resolution returns the same float32 values twice while its
    float64 run does not), head-vs-base differences cannot be told from noise: the verdict
    becomes an error that says so."""
    if first.status != OK or first.outputs is None:
        return
    again = replay(spec, variant, [cand], isolate=isolate)[0]
    if again.status == OK and same_outputs(first, again):
        moved = ref_divergence(first, again, variant.dtype, spec.ulp_floor)
        if moved is None or moved <= BEHAVIOUR_TOLERANCE_ULP:
            return
        vv.details["reference_rerun_ulp"] = round(moved, 3)
    vv.details["nondeterministic"] = True
    vv.details["would_be"] = vv.outcome
    vv.outcome = V.ERROR
    vv.reason = (f"non-deterministic: head's outputs differ between two runs on the same input, so head vs base "
                 f"cannot be told from noise (it would have been: {vv.reason})")


def _int_outputs_differ(h: ReplayResult, b: ReplayResult) -> bool:
    """Head's and base's float64 runs return different integer outputs (indices, counts)."""
    if h.reference is None or b.reference is None or len(h.reference) != len(b.reference):
        return False
    for x, y in zip(h.reference, b.reference):
        x, y = np.asarray(x), np.asarray(y)
        if x.dtype.kind in "iub" and y.dtype.kind in "iub" and (x.shape != y.shape or not np.array_equal(x, y)):
            return True
    return False


def _nothing_compared(vv: V.VariantVerdict, head, base) -> V.VariantVerdict:
    """No input gave a result on both sides: that is not a pass (a class declared where an
    instance was meant, an output the gate cannot read, a domain every input falls outside)."""
    why = next((r.error for r in head if r.error), None) or next((r.error for r in (base or []) if r.error), None)
    vv.outcome = V.ERROR
    vv.reason = "nothing was compared: no input gave a result on " + ("head and base" if base is not None else "head") \
        + (f" ({why})" if why else "")
    return vv


def _f(x: Optional[float]) -> str:
    if x is None:
        return "-"
    if math.isinf(x):
        return "inf"
    return f"{x:.3g}"


def stability_fixes(verdicts: Sequence[V.VariantVerdict]) -> List[str]:
    """A stability fix changes the function where it was broken: an eps under a sqrt, a wider
    clamp, a log-space rewrite move the float64 run near the singularity, on purpose. Where a PR
    makes an operator return numbers on inputs where base returned NaN/Inf or raised (in any of
    its variants: a NaN gradient fixed by an eps shows in the gradient variant, the eps itself
    in the forward one), that operator's behaviour changes, and its precision losses on inputs
    where head's float64 run computes another value than base's, are reported with the fix, not
    failed. New NaN/Inf (but a gradient's where base's forward itself failed,
    :func:`_forward_fixed`), new crashes, a lost gradient and precision losses where the function
    did not change still fail. Returns one warning line per operator whose verdicts it
    marked (``details.with_fix``)."""
    fixes: Dict[str, Tuple[str, int]] = {}
    for v in verdicts:
        n = int(v.details.get("fixed_inputs") or 0)
        if n and n > fixes.get(v.op, ("", 0))[1]:
            fixes[v.op] = (v.key, n)
    marked: Dict[str, int] = {}
    for v in verdicts:
        if v.op not in fixes:
            continue
        changed = v.outcome == V.REGRESSION and v.details.get("kind") == "precision" and "function_changed_ulp" in v.details
        if v.outcome != V.BEHAVIOUR_CHANGE and not changed:
            continue
        if changed_everywhere(v):
            # a fix changes the function where it was broken, and by an eps (if at all) elsewhere;
            # one whose float64 output moved beyond half the digits on the random control inputs
            # computes another function: naver/roma's 1c27395 reverted, a normalisation dropped,
            # "fixes" the NaN of normalising an overflowed product and leaves every composition
            # unnormalised
            c = v.details["controls_changed"]
            v.reason = (f"{v.reason}; not excused by the stability fix on {fixes[v.op][1]} input(s) of {fixes[v.op][0]}: "
                        f"the float64 output moved beyond half the {v.variant.get('dtype')} digits on "
                        f"{c['beyond_half_digits']} of the {c['compared']} random control inputs, and by no less on "
                        "any (another function, not a guard near where base failed)")
            continue
        key, n = fixes[v.op]
        v.details["with_fix"] = {"variant": key, "fixed_inputs": n}
        if changed:
            v.outcome = V.BEHAVIOUR_CHANGE
            v.reason = (f"{v.reason}, where head's float64 output differs from base's by "
                        f"{_f(v.details['function_changed_ulp'])} {v.variant.get('dtype')} ulp (the function changed there)")
        v.reason = (f"changed alongside a stability fix (head returns numbers where base failed on {n} input(s) of "
                    f"{key}): reported, not failed. {v.reason}")
        marked[v.op] = marked.get(v.op, 0) + 1
    return [f"{op}: {k} behaviour change(s) alongside a stability fix (head returns numbers where base failed on "
            f"{fixes[op][1]} input(s) of {fixes[op][0]}): reported, not failed" for op, k in marked.items()]


#: the fewest random control inputs on which head's float64 output must have moved beyond half
#: the digits for the function to count as changed everywhere (one: too little evidence)
EVERYWHERE_MIN_CONTROLS = 2


def changed_everywhere(v: V.VariantVerdict) -> bool:
    """Head's float64 output moved beyond half the dtype's digits on at least
    :data:`EVERYWHERE_MIN_CONTROLS` random control inputs and by no smaller amount on any: another
    function (a control left as it was is one where a parameter keeps the old path, roma's
    ``normalize=False``), not a guard that moves the function near a singularity (there the
    random draws do not move) or an eps (which moves them all a little)."""
    c = v.details.get("controls_changed") or {}
    far = int(c.get("beyond_half_digits") or 0)
    return far >= EVERYWHERE_MIN_CONTROLS and far == int(c.get("moved") or 0)


def refinements(verdicts: Sequence[V.VariantVerdict]) -> List[str]:
    """Changes that come with a refined function are reported, not failed.

    An operator is *refined* when its forward variants' float64 runs moved (by more than
    rounding) but agree with base's to within half the dtype's digits on every control input
    (an approximation replaced by the exact function, a constant written to more digits). Then:

    * a gradient variant's behaviour change: the derivative of an approximation is a worse
      approximation of the derivative (precision did not worsen, or it would be a regression);
    * a precision regression on an input where head and base compute (slightly) different
      functions: base's error there is another function's, so head's error is held to base's
      largest error over every judged input instead of the one input.

    A gradient that changed while the forward did not move (a wrong backward), a function that
    changed beyond half the digits, a precision loss above base's whole distribution, new
    NaN/Inf and crashes still fail. Returns one warning line per operator it marked."""
    fwd: Dict[str, Tuple[str, float]] = {}
    changed_fwd = set()
    for v in verdicts:
        if v.variant.get("oracle", "precision") != "precision":
            continue
        d = v.details.get("divergence_ulp")
        if d is not None and float(d) > half_digits_ulps(v.variant.get("dtype", "float32")):
            changed_fwd.add(v.op)  # a different function: nothing here is a refinement
        moved = max(float(v.details.get("ref_moved_ulp") or 0.0), float(d or 0.0))
        if moved > BEHAVIOUR_TOLERANCE_ULP and moved > fwd.get(v.op, ("", 0.0))[1]:
            fwd[v.op] = (v.key, moved)
    marked: Dict[str, int] = {}
    for v in verdicts:
        if v.op not in fwd or v.op in changed_fwd or v.reported_only:
            continue
        key, moved = fwd[v.op]
        dtype = v.variant.get("dtype", "float32")
        changed = v.details.get("function_changed_ulp")
        bar = v.details.get("threshold_over_inputs")
        if (v.outcome == V.REGRESSION and v.details.get("kind") == "precision" and bar is not None
                and (changed is None or float(changed) <= half_digits_ulps(dtype))
                and v.head_error is not None and v.head_error <= float(bar)):
            v.outcome = V.BEHAVIOUR_CHANGE
            v.details["refinement"] = {"forward": key, "forward_moved_ulp": moved}
            v.reason = (f"a refined function's precision: {v.reason}, but within base's largest error over every "
                        f"judged input ({_f(float(bar))} ulp with the multiplier; the forward's float64 run moved by up "
                        f"to {_f(moved)} ulp in {key}, within half its digits): reported, not failed")
        elif v.variant.get("oracle") == "grad" and v.outcome == V.BEHAVIOUR_CHANGE:
            v.details["refinement"] = {"forward": key, "forward_moved_ulp": moved}
            v.reason = (f"the gradient of a refinement (the forward's float64 run moved by up to {_f(moved)} ulp in "
                        f"{key}, within half its digits): reported, not failed. {v.reason}")
        else:
            continue
        marked[v.op] = marked.get(v.op, 0) + 1
    return [f"{op}: {k} change(s) that come with a refined forward ({fwd[op][0]} moved by up to "
            f"{_f(fwd[op][1])} ulp, within half its digits): reported, not failed" for op, k in marked.items()]


def failing(v: V.VariantVerdict, settings: GateSettings) -> bool:
    """Whether this verdict fails the gate."""
    if v.outcome == V.REGRESSION:
        return True
    return v.outcome == V.BEHAVIOUR_CHANGE and settings.behaviour_change == "fail" and not v.reported_only


def overall(verdicts: Sequence[V.VariantVerdict], errors: Sequence[str], settings: GateSettings) -> Tuple[str, str]:
    """Run outcome and its one-line reason."""
    from ..errors import Outcome

    regs = [v for v in verdicts if failing(v, settings)]
    if regs:
        first = regs[0]
        more = f" (+{len(regs) - 1} more)" if len(regs) > 1 else ""
        return Outcome.REGRESSION.value, f"{first.id}: {first.reason}{more}"
    if errors:
        return Outcome.ERROR.value, errors[0]
    if any(v.outcome == V.ERROR for v in verdicts):
        e = next(v for v in verdicts if v.outcome == V.ERROR)
        return Outcome.ERROR.value, f"{e.id}: {e.reason}"
    under = [v for v in verdicts if v.outcome == V.UNDER_SEARCHED]
    if under:  # a changed operator that could not be judged: not a pass
        return Outcome.ERROR.value, (f"{len(under)} variant(s) under-searched (fewer evaluations than a pass needs), "
                                     f"e.g. {under[0].id}: {under[0].reason}")
    blind = [v for v in verdicts if v.outcome == V.NOT_MEASURED]
    if blind:
        return Outcome.ERROR.value, f"{len(blind)} variant(s) not measured, e.g. {blind[0].id}: {blind[0].reason}"
    nb = [v for v in verdicts if v.outcome == V.NEEDS_BASELINE]
    if nb:
        return Outcome.NEEDS_BASELINE.value, f"{len(nb)} variant(s) have no baseline yet, e.g. {nb[0].id}; run `dl-gate baseline refresh`"
    nc = sum(v.outcome == V.NOT_COVERED for v in verdicts)
    n = len(verdicts) - nc
    if nc and not n:  # nothing was checked: that is not a pass
        return Outcome.ERROR.value, (f"the budget covered none of the {nc} selected variant(s): "
                                     "raise --budget (budget.total) or narrow --dtype/--mode")
    imp = sum(v.outcome == V.IMPROVEMENT for v in verdicts)
    beh = [v for v in verdicts if v.outcome == V.BEHAVIOUR_CHANGE]
    fix = sum(bool(v.details.get("with_fix")) for v in beh)
    ref = sum(bool(v.details.get("refinement")) and not v.details.get("with_fix") for v in beh)
    why = [f"{fix} alongside a stability fix"] * bool(fix) + [f"{ref} refinement(s)"] * bool(ref)
    why += ["warn"] * (fix + ref < len(beh))
    warn = f", {len(beh)} behaviour change(s) ({', '.join(why)})" if beh else ""
    return Outcome.PASS.value, (f"{n} variant(s) checked, no regression" + (f", {imp} improved" if imp else "") + warn
                                + (f"; {nc} not covered by the budget" if nc else ""))
