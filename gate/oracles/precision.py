"""The precision oracle (Predoo done right).

Both sides saw the *same* input values (exactly representable in the low dtype); the candidate
output is compared with the float64 reference output. Errors are reported as

* ``abs`` (l∞ of |out − ref|), ``l1`` (sum of |out − ref|),
* ``rel`` (|out − ref| / max(|ref|, floor)),
* ``ulp`` (|out − ref| in units in the last place of the dtype under test, with an absolute
  floor so that outputs near a zero of the function do not explode: ``ulp_floor='output'``
  uses the ulp of the output's magnitude, ``'dtype'`` the smallest subnormal),
* ``nonfinite``: NaN/Inf in the output where the reference, rounded to the dtype, is finite,
* ``int_mismatch``: differing elements of integer outputs (indices), compared exactly.

A reference value that overflows the dtype's range is matched by an infinity of the same sign.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np

from ..backends.base import FLOAT_FORMATS, Output


def ulp(x: np.ndarray, dtype: str) -> np.ndarray:
    """Unit in the last place of |x| in ``dtype`` (subnormal spacing near zero).

    Computed from the float64 exponent bits (integer ops only: several times faster than
    frexp/ldexp on large outputs). Non-finite inputs give the ulp of the largest exponent."""
    p, emin, emax = FLOAT_FORMATS[dtype]
    x = np.asarray(x, dtype=np.float64)
    shape = x.shape
    x = np.ascontiguousarray(x).reshape(-1)
    e = ((x.view(np.uint64) >> np.uint64(52)) & np.uint64(0x7FF)).astype(np.int64) - 1023
    # float64 subnormals (e == -1023) are far below every emin here except float64's own
    e = np.clip(e, emin, emax) - (p - 1)
    if dtype == "float64":
        small = e < -1022
        if np.any(small):  # float64 subnormal spacing cannot be built from the exponent field
            out = np.empty(e.shape, dtype=np.float64)
            out[~small] = ((e[~small] + 1023).astype(np.uint64) << np.uint64(52)).view(np.float64)
            out[small] = np.ldexp(1.0, e[small].astype(np.int32))
            return out.reshape(shape)
    return ((e + 1023).astype(np.uint64) << np.uint64(52)).view(np.float64).reshape(shape)


def overflow_bound(dtype: str) -> float:
    """Smallest magnitude that rounds to infinity in ``dtype``."""
    p, _, emax = FLOAT_FORMATS[dtype]
    return math.ldexp(2.0 - math.ldexp(1.0, -p), emax)


@dataclass(frozen=True)
class Metrics:
    ulp: float = 0.0
    abs: float = 0.0
    rel: float = 0.0
    l1: float = 0.0
    mean_ulp: float = 0.0
    nonfinite: int = 0
    int_mismatch: int = 0
    numel: int = 0
    worst_output: int = 0
    worst_index: Tuple[int, ...] = ()
    worst_out: float = 0.0
    worst_ref: float = 0.0
    shape_mismatch: Optional[str] = None
    spread: float = 0.0  # max - min of the finite float outputs (Audee's NaN search maximises it)

    @property
    def severity(self) -> float:
        """A single number that orders findings: NaN/Inf and mismatches first, then ULP."""
        if self.shape_mismatch or self.nonfinite or self.int_mismatch:
            return math.inf
        return self.ulp

    def to_dict(self) -> dict:
        d = asdict(self)
        d["worst_index"] = list(self.worst_index)
        return {k: _jsonable(v) for k, v in d.items()}

    @classmethod
    def from_dict(cls, raw: dict) -> "Metrics":
        raw = dict(raw)
        raw["worst_index"] = tuple(raw.get("worst_index") or ())
        return cls(**{k: (math.inf if v == "inf" else v) for k, v in raw.items() if k in cls.__dataclass_fields__})


def _jsonable(v):
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    if isinstance(v, float) and math.isnan(v):
        return "nan"
    return v


def min_normal(dtype: str) -> float:
    _, emin, _ = FLOAT_FORMATS[dtype]
    return math.ldexp(1.0, emin)


def compare(outputs: Sequence[Output], reference: Sequence[Output], dtype: str, ulp_floor: str = "output",
            ftz: bool = False) -> Metrics:
    """Error figures of ``outputs`` against the float64 ``reference`` in units of ``dtype``.
    With ``ftz`` (a framework that flushes subnormals), a zero output where the reference is
    subnormal in ``dtype`` counts as exact."""
    if len(outputs) != len(reference):
        return Metrics(shape_mismatch=f"{len(outputs)} outputs vs {len(reference)} in the reference")
    worst = (-1.0, 0, (), 0.0, 0.0)
    tot_abs = tot_l1 = tot_rel = tot_ulp_sum = 0.0
    max_ulp = spread = 0.0
    nonfinite = int_mismatch = numel = 0
    for k, (o, r) in enumerate(zip(outputs, reference)):
        a, b = np.asarray(o.array), np.asarray(r.array)
        if a.shape != b.shape:
            return Metrics(shape_mismatch=f"output {k}: shape {a.shape} vs reference {b.shape}")
        numel += a.size
        if not o.is_float or not r.is_float:
            int_mismatch += int(np.count_nonzero(a != b))
            continue
        if a.size == 0:
            continue
        shape = a.shape
        a = a.astype(np.float64, copy=False).reshape(-1)
        b = b.astype(np.float64, copy=False).reshape(-1)
        ovf = overflow_bound(dtype)
        fast = bool(np.isfinite(a).all() and np.isfinite(b).all())
        if fast:
            mag = max(abs(float(b.max())), abs(float(b.min())))
            fast = mag < ovf and not (ftz and np.any(a == 0))
        if fast:  # the common case: every value finite and in range (fewer passes, no masks)
            spread = max(spread, float(a.max() - a.min()))
            err = np.abs(a - b)
            floor = float(ulp(np.asarray(mag), dtype)) if ulp_floor == "output" else float(ulp(np.asarray(0.0), dtype))
            denom = ulp(b, dtype)
            np.maximum(denom, floor, out=denom)
            ulp_err = np.divide(err, denom, out=denom)
            rel_den = np.abs(b)
            np.maximum(rel_den, max(floor, np.finfo(np.float64).tiny), out=rel_den)
            rel_max = float((err / rel_den).max())
        else:
            fin = a[np.isfinite(a)]
            if fin.size:
                spread = max(spread, float(fin.max() - fin.min()))
            ulp_err, err, rel_max = _slow_errors(a, b, dtype, ulp_floor, ftz, ovf)
            nonfinite += int(np.count_nonzero(np.isfinite(b) & (np.abs(b) < ovf) & ~np.isfinite(a)))
            if ulp_err is None:
                continue
        idx = int(np.argmax(ulp_err))
        u = float(ulp_err.flat[idx])
        if u > worst[0]:
            worst = (u, k, tuple(int(i) for i in np.unravel_index(idx, shape)), float(a[idx]), float(b[idx]))
        max_ulp = max(max_ulp, u)
        tot_abs = max(tot_abs, float(err.max()))
        tot_rel = max(tot_rel, rel_max)
        tot_l1 += float(err.sum())
        tot_ulp_sum += float(ulp_err.sum())
    return Metrics(
        ulp=max_ulp,
        abs=tot_abs,
        rel=tot_rel,
        l1=tot_l1,
        mean_ulp=tot_ulp_sum / max(numel, 1),
        nonfinite=nonfinite,
        int_mismatch=int_mismatch,
        numel=numel,
        worst_output=worst[1],
        worst_index=worst[2],
        worst_out=worst[3],
        worst_ref=worst[4],
        spread=spread,
    )


def _slow_errors(a, b, dtype, ulp_floor, ftz, ovf):
    """Element errors when some values are non-finite or out of the dtype's range."""
    ref_finite = np.isfinite(b)
    ref_representable = ref_finite & (np.abs(b) < ovf)
    out_finite = np.isfinite(a)
    # overflowing reference matched by the right infinity counts as exact
    ref_overflow = ref_finite & ~ref_representable
    exact = (ref_overflow & np.isinf(a) & (np.sign(a) == np.sign(b))) | (~ref_finite & ~np.isnan(b) & (a == b))
    if ftz:
        exact = exact | ((a == 0) & (np.abs(b) < min_normal(dtype)))
    judged = ref_finite & out_finite & ~exact
    if not np.any(judged):
        return None, None, 0.0
    err = np.zeros_like(b)
    err[judged] = np.abs(a[judged] - b[judged])
    mag = float(np.max(np.abs(b[ref_representable]))) if np.any(ref_representable) else 0.0
    floor = float(ulp(np.asarray(mag), dtype)) if ulp_floor == "output" else float(ulp(np.asarray(0.0), dtype))
    denom = np.maximum(ulp(b, dtype), floor)
    ulp_err = np.where(judged, err / denom, 0.0)
    rel_err = np.where(judged, err / np.maximum(np.abs(b), max(floor, np.finfo(np.float64).tiny)), 0.0)
    return ulp_err, err, float(rel_err.max())


def fitness(m: Metrics, guidance: str) -> float:
    """The number the search maximises. ``linf``: max ULP error; ``l1``: mean ULP error;
    ``spread``: max − min of the output (drives values towards overflow, Audee's NaN search);
    ``random``: no feedback. NaN/Inf and mismatches dominate everything."""
    if m.shape_mismatch or m.nonfinite or m.int_mismatch:
        return math.inf
    if guidance == "spread":
        return m.spread
    if guidance == "l1":
        return m.mean_ulp
    return m.ulp


def summary_metrics(ms: List[Metrics]) -> Metrics:
    """The worst of several metrics by severity."""
    return max(ms, key=lambda m: (m.severity, m.abs)) if ms else Metrics()
