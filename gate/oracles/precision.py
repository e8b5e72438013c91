"""The precision oracle (Predoo done right).

Both sides saw the *same* input values (exactly representable in the low dtype); the candidate
output is compared with the float64 reference output. Errors are reported as

* ``abs`` (l∞ of |out − ref|), ``l1`` (sum of |out − ref|),
* ``rel`` (|out − ref| / max(|ref|, floor)),
* ``ulp`` (|out − ref| in units in the last place of the dtype under test, with an absolute
  floor so that outputs near a zero of the function do not explode: ``ulp_floor='output'``
  uses the ulp of the output's magnitude, ``'dtype'`` the smallest subnormal),
* ``nonfinite``: NaN/Inf in the output where the reference, rounded to the dtype, is finite,
* ``int_mismatch``: differing elements of integer outputs (indices), compared exactly,
* ``spread``: max − min of the finite float outputs (what Audee's NaN search maximises).

A reference value that overflows the dtype's range is matched by an infinity of the same sign.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np

from ..backends.base import FLOAT_FORMATS, Output


def ulp(x: np.ndarray, dtype: str) -> np.ndarray:
    """Unit in the last place of |x| in ``dtype`` (subnormal spacing near zero)."""
    p, emin, _ = FLOAT_FORMATS[dtype]
    _, e = np.frexp(np.abs(np.asarray(x, dtype=np.float64)))
    e = np.maximum(e.astype(np.int64) - 1, emin)
    return np.ldexp(1.0, (e - (p - 1)).astype(np.int32))


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
    spread: float = 0.0

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


def compare(outputs: Sequence[Output], reference: Sequence[Output], dtype: str, ulp_floor: str = "output") -> Metrics:
    """Error figures of ``outputs`` against the float64 ``reference`` in units of ``dtype``."""
    if len(outputs) != len(reference):
        return Metrics(shape_mismatch=f"{len(outputs)} outputs vs {len(reference)} in the reference")
    worst = (-1.0, 0, (), 0.0, 0.0)
    tot_abs = tot_l1 = tot_rel = tot_ulp_sum = 0.0
    max_ulp = 0.0
    spread = 0.0
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
        a = a.astype(np.float64, copy=False)
        b = b.astype(np.float64, copy=False)
        fin = a[np.isfinite(a)]
        if fin.size:
            spread = max(spread, float(fin.max() - fin.min()))
        ref_finite = np.isfinite(b)
        ovf = overflow_bound(dtype)
        ref_representable = ref_finite & (np.abs(b) < ovf)
        out_finite = np.isfinite(a)
        nonfinite += int(np.count_nonzero(ref_representable & ~out_finite))
        # overflowing reference matched by the right infinity counts as exact
        ref_overflow = ref_finite & ~ref_representable
        exact_inf = (ref_overflow & np.isinf(a) & (np.sign(a) == np.sign(b))) | (
            ~ref_finite & ~np.isnan(b) & (a == b)
        )
        judged = ref_finite & out_finite & ~exact_inf
        if not np.any(judged):
            continue
        err = np.zeros_like(b)
        err[judged] = np.abs(a[judged] - b[judged])
        mag = float(np.max(np.abs(b[ref_representable]))) if np.any(ref_representable) else 0.0
        if ulp_floor == "output":
            floor = float(ulp(np.asarray(mag), dtype))
        else:
            floor = float(ulp(np.asarray(0.0), dtype))
        denom = np.maximum(ulp(b, dtype), floor)
        ulp_err = np.where(judged, err / denom, 0.0)
        abs_floor = max(floor, np.finfo(np.float64).tiny)
        rel_err = np.where(judged, err / np.maximum(np.abs(b), abs_floor), 0.0)
        idx = int(np.argmax(ulp_err))
        u = float(ulp_err.flat[idx])
        if u > worst[0]:
            worst = (u, k, tuple(int(i) for i in np.unravel_index(idx, a.shape)), float(a.flat[idx]), float(b.flat[idx]))
        max_ulp = max(max_ulp, u)
        tot_abs = max(tot_abs, float(err.max()))
        tot_rel = max(tot_rel, float(rel_err.max()))
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
