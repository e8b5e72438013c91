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
from typing import List, Optional, Sequence

import numpy as np

from ..backends.base import FLOAT_FORMATS, Output, min_normal, overflow_bound  # noqa: F401  (dtype facts, re-exported)
from ..search.score import Metrics, fitness, ulp  # noqa: F401  (the score types the search sees)
from . import fused


def floor_value(mag: float, dtype: str, ulp_floor: str) -> float:
    """The oracle's absolute ULP floor: the ulp of the largest reference magnitude ``mag``
    (``ulp_floor='output'``) or the dtype's smallest subnormal (``'dtype'``). An all-zero
    reference (a variance of constant rows, a normalised constant) has no magnitude of its
    own: its errors are counted in ulps of 1, the scale of a normalised output."""
    if ulp_floor == "output":
        return float(ulp(np.asarray(float(mag) if mag > 0 else 1.0), dtype))
    return float(ulp(np.asarray(0.0), dtype))


def below_normal(a: np.ndarray, absb: np.ndarray, dtype: str) -> np.ndarray:
    """Elements where the output and the reference are both below ``dtype``'s smallest normal
    number: a flush to zero (CUDA's ``-ftz``, oneDNN, XLA, TensorFlow's CPU kernels) or a partial
    underflow there is how frameworks compute, not an operator's error (two correct formulas for
    the same gradient differ by 10^5 subnormal ulps on such values)."""
    mn = min_normal(dtype)
    return (np.abs(a) < mn) & (absb < mn)


def _flush_changes_errors(a: np.ndarray, b: np.ndarray, bmin: float, bmax: float, dtype: str) -> bool:
    mn = min_normal(dtype)
    if bmin >= mn or bmax <= -mn:  # no reference below the smallest normal: nothing to flush
        return False
    # the (usually few) elements whose reference is below the smallest normal, then only those:
    # two comparisons (one where the reference has one sign) and no |b| array: half the time
    # of np.abs(b) < mn on a million elements (outputs that cross zero always get here)
    if bmin >= 0.0:
        tiny = np.less(b, mn)
    else:
        tiny = np.greater(b, -mn)
        if bmax >= mn:
            tiny &= np.less(b, mn)
    small = np.flatnonzero(tiny)
    if small.size == 0:
        return False
    sa, sb = a[small], b[small]
    return bool(np.any((np.abs(sa) < mn) & (sa != sb)))


def residue_magnitude(mag: float, scale: float, dtype: str) -> float:
    """The magnitude an output's errors are counted in ulps of (``ulp_floor='output'``): its own
    largest reference value, unless every reference value is below one rounding unit of
    ``scale``, the scale of the computation that made it (its inputs; for a gradient, the
    upstream gradient times the inputs and outputs). Such an output is zero in exact arithmetic
    (a shift-invariant gradient, a mean-subtracted constant row, tied values): its float64 run
    is a residue (5.6e-17) and its low-precision run the rounding of the O(scale) terms that
    cancelled (-3e-8), which in ulps of the residue read 2e24. Its error belongs on the scale of
    those terms (Higham: |fl(x) - x| <= u * sum |terms|); a real cancellation loss is many ulps
    of that scale and still fails. ``scale`` 0: not known, the output's own magnitude."""
    p = FLOAT_FORMATS[dtype][0]
    if scale > 0 and math.isfinite(scale) and mag < math.ldexp(scale, -p):
        return scale
    return mag


#: float dtypes by width, for :func:`not_measured`
_WIDTH = {"float16": 16, "bfloat16": 16, "float32": 32, "float64": 64}


def not_measured(outputs: Sequence[Output], reference: Sequence[Output], dtype: str) -> Optional[str]:
    """Why figures of ``outputs`` against ``reference`` would not measure ``dtype``: a float output
    of the low-precision run in a wider dtype than the variant's (float32 for a float16 variant:
    the operator computed and returned in float32, as a Keras layer with its float32 dtype policy
    does), or a float output of the reference narrower than float64 (the operator cast its
    float64 input down). A float64 label on the low run is not counted: Python floats carry it.
    None when both runs are what they claim."""
    width = _WIDTH.get(dtype)
    if width is None or dtype == "float64":
        return None
    for o in outputs:
        w = _WIDTH.get(o.dtype)
        if w is not None and o.dtype != "float64" and w > width:
            return f"its {dtype} run returns {o.dtype} (the operator computes in another dtype than the variant's)"
    for r in reference:
        w = _WIDTH.get(r.dtype)
        if w is not None and w < 64:
            return f"its float64 reference returns {r.dtype} (the operator casts its input down)"
    return None


def _floor(mag: float, scale: float, dtype: str, ulp_floor: str) -> float:
    """The ULP floor of one output: :func:`floor_value`, of the residue's scale where the output
    is one (:func:`residue_magnitude`; ``ulp_floor='output'`` only: an elementwise operator's
    elements are each their own computation, judged in ulps of their own value)."""
    if ulp_floor == "output":
        mag = residue_magnitude(mag, scale, dtype)
    return floor_value(mag, dtype, ulp_floor)


def compare(outputs: Sequence[Output], reference: Sequence[Output], dtype: str, ulp_floor: str = "output",
            ftz: bool = True, figures: str = "all", scale: float = 0.0, check_dtypes: bool = True,
            kernel: str = "auto") -> Metrics:
    """Error figures of ``outputs`` against the float64 ``reference`` in units of ``dtype``.
    With ``ftz`` (the default: what the gate judges), an element whose output and reference are
    both below the smallest normal number of ``dtype`` counts as exact (:func:`below_normal`);
    ``ftz=False`` measures them in subnormal ulps (exhaustive sweeps of a dtype's every value).
    ``figures="search"``: only what a search is guided by (ULP, abs, l1, mean ULP, NaN/Inf, the
    worst element); ``rel`` and ``spread`` are NaN (not measured), which saves six of the twelve
    passes over a large finite output; :func:`gate.fuzz.fuzz_task` measures a finding's again.
    ``figures="max"``: the search's figures without ``l1`` and ``mean_ulp`` (NaN: not measured),
    what a search guided by the largest error reads (two sums an element fewer).
    Long on purpose: the batched twin (:func:`gate.oracles.batch.compare_segments`) follows it
    statement by statement. ``scale``: the scale of the computation (:func:`residue_magnitude`).
    ``check_dtypes``: say when the runs are not in the dtypes they claim (:func:`not_measured`;
    off for autocast's operator mode, where the policy decides an operator's output dtype).
    ``kernel``: who computes the search's figures of a large output: ``"auto"`` the compiled
    one-pass kernel (:mod:`gate.oracles.fused`) from :data:`gate.oracles.fused.MIN_ELEMENTS`
    elements when Numba is there, ``"numpy"`` this function's own passes (the definition the
    kernel is held to), ``"fused"`` the kernel at any size."""
    if figures not in ("all", "search", "max"):
        raise ValueError(f"unknown figures {figures!r} (all, search or max)")
    search = figures in ("search", "max")
    sums = figures != "max"  # l1 and the mean ULP error: only a search guided by them needs them
    if len(outputs) != len(reference):
        return Metrics(shape_mismatch=f"{len(outputs)} outputs vs {len(reference)} in the reference")
    unmeasured = not_measured(outputs, reference, dtype) if check_dtypes else None
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
        a = a.reshape(-1)
        if a.dtype != np.float64 and a.dtype != np.float32:  # numpy's float16 arithmetic is emulated
            a = a.astype(np.float64)
        b = b.astype(np.float64, copy=False).reshape(-1)
        if search and kernel != "numpy" and dtype in fused.DTYPES and (kernel == "fused" or a.size >= fused.MIN_ELEMENTS):
            r = fused.scores(np.ascontiguousarray(a), np.ascontiguousarray(b), dtype, ulp_floor, ftz, sums=sums)
            if r is None and kernel == "fused":
                raise RuntimeError("the fused scoring kernel is not available (Numba missing, or DL_GATE_FUSED=0)")
            # references beyond the range with one floor: each takes its own ulp (the NumPy
            # path's); without the sums, one more compiled pass gives the largest and its index
            beyond = r is not None and ulp_floor == "output" and r.beyond
            if beyond and not sums:
                nonfinite += r.nonfinite
                tot_abs = max(tot_abs, r.e_max)
                u, idx = fused.beyond_max(np.ascontiguousarray(a), np.ascontiguousarray(b), dtype, ftz,
                                          _floor(r.mag, scale, dtype, ulp_floor))
                if u > worst[0]:
                    worst = _worst(u, k, idx, shape, a, b)
                max_ulp = max(max_ulp, u)
                continue
            if r is not None and not beyond:
                nonfinite += r.nonfinite
                if not r.fast and r.judged == 0:  # nothing could be judged (as the NumPy path: no figure)
                    continue
                tot_abs = max(tot_abs, r.e_max)
                tot_l1 += r.s_err
                if ulp_floor == "output":
                    div = _floor(r.mag, scale, dtype, ulp_floor)
                    u, idx = r.e_max / div, r.e_idx
                    tot_ulp_sum += r.s_err / div
                else:
                    u, idx = r.u_max, r.u_idx
                    tot_ulp_sum += r.s_ulp
                if u > worst[0]:
                    worst = _worst(u, k, idx, shape, a, b)
                max_ulp = max(max_ulp, u)
                continue
        ovf = overflow_bound(dtype)
        # max/min propagate NaN: four reductions tell whether every value is finite (a search
        # skips the output's two: a NaN/Inf output makes its error NaN/Inf, checked below)
        bmax, bmin = float(b.max()), float(b.min())
        mag = max(abs(bmax), abs(bmin))
        fast = mag < ovf
        if not search:
            amax, amin = float(a.max()), float(a.min())
            fast = fast and math.isfinite(amax) and math.isfinite(amin)
        if fast and ftz and _flush_changes_errors(a, b, bmin, bmax, dtype):
            fast = False
        if fast:  # the common case: every value finite and in range (fewer passes, no masks)
            err = np.subtract(a, b)
            np.abs(err, out=err)
            idx = int(np.argmax(err))  # a NaN/Inf error is found first (argmax stops at a NaN)
            e_max = float(err[idx])
            fast = math.isfinite(e_max)
        if fast:
            floor = _floor(mag, scale, dtype, ulp_floor)
            if not search:
                spread = max(spread, amax - amin)
                rel_den = np.abs(b)
                np.maximum(rel_den, max(floor, np.finfo(np.float64).tiny), out=rel_den)
                tot_rel = max(tot_rel, float(np.divide(err, rel_den, out=rel_den).max()))
            if ulp_floor == "output":
                # ulp(|ref|) <= ulp(max |ref|) = floor everywhere: the error in ulps is err/floor
                # (a power of two, so scaling the max and the sum afterwards is exact)
                e_sum = float(err.sum()) if sums else math.nan
                u = e_max / floor
                if u > worst[0]:
                    worst = _worst(u, k, idx, shape, a, b)
                max_ulp = max(max_ulp, u)
                tot_abs = max(tot_abs, e_max)
                tot_l1 += e_sum
                tot_ulp_sum += e_sum / floor
                continue
            tot_abs = max(tot_abs, e_max)
            denom = ulp(b, dtype)  # already >= the dtype floor (the smallest subnormal)
            ulp_err = np.divide(err, denom, out=denom)
        else:
            a = a.astype(np.float64, copy=False)
            ulp_err, err, rel_max, nf, sp, div = _slow_errors(a, b, dtype, ulp_floor, ftz, ovf, search, scale)
            nonfinite += nf
            spread = max(spread, sp)
            if ulp_err is None:
                continue
            tot_abs = max(tot_abs, float(err.max()))
            tot_rel = max(tot_rel, rel_max)
            if div is not None:  # errors in ulps of one floor: as the fast path, scaled afterwards
                idx = int(np.argmax(err))
                u = float(err[idx]) / div
                if u > worst[0]:
                    worst = _worst(u, k, idx, shape, a, b)
                max_ulp = max(max_ulp, u)
                e_sum = float(err.sum()) if sums else math.nan
                tot_l1 += e_sum
                tot_ulp_sum += e_sum / div
                continue
        idx = int(np.argmax(ulp_err))
        u = float(ulp_err.flat[idx])
        if u > worst[0]:
            worst = _worst(u, k, idx, shape, a, b)
        max_ulp = max(max_ulp, u)
        tot_l1 += float(err.sum()) if sums else math.nan
        tot_ulp_sum += float(ulp_err.sum()) if sums else math.nan
    return Metrics(
        ulp=max_ulp,
        abs=tot_abs,
        rel=math.nan if search else tot_rel,
        l1=tot_l1 if sums else math.nan,
        mean_ulp=tot_ulp_sum / max(numel, 1) if sums else math.nan,
        nonfinite=nonfinite,
        int_mismatch=int_mismatch,
        numel=numel,
        worst_output=worst[1],
        worst_index=worst[2],
        worst_out=worst[3],
        worst_ref=worst[4],
        spread=math.nan if search else spread,
        unmeasured=unmeasured,
    )


def _worst(u: float, k: int, idx: int, shape, a: np.ndarray, b: np.ndarray) -> tuple:
    """(ulp error, output, index, output value, reference value) of the worst element so far."""
    return u, k, tuple(int(i) for i in np.unravel_index(idx, shape)), float(a[idx]), float(b[idx])


def _slow_errors(a, b, dtype, ulp_floor, ftz, ovf, search=False, scale=0.0):
    """Element errors when some values are non-finite or out of the dtype's range: (ulp errors,
    abs errors, max rel error, count of NaN/Inf outputs where the reference is representable,
    spread of the finite outputs, divisor); ``None`` errors when no element can be judged.
    ``search``: the relative error and the spread are not measured (NaN). A divisor (not None):
    every element is counted in ulps of that one floor, and the ulp errors are the abs errors,
    to be divided after the max and the sum are taken (as the all-finite path does: the fused
    kernel, :mod:`gate.oracles.fused`, follows that arithmetic bit for bit).

    An element is judged when both sides are finite (an infinity matching an overflowing
    reference, or the reference's own infinity, is exact; any other non-finite output is
    counted, not measured); with ``ftz`` an output and reference both below the smallest normal
    number are exact."""
    with np.errstate(invalid="ignore", over="ignore"):
        absb = np.abs(b)
        out_finite = np.isfinite(a)
        representable = absb < ovf  # NaN compares False
        nonfinite = int(np.count_nonzero(representable & ~out_finite))
        spread = math.nan
        if not search:
            fin = a[out_finite]
            spread = float(fin.max() - fin.min()) if fin.size else 0.0
        judged = np.isfinite(b)
        judged &= out_finite
        if ftz:  # below_normal, looked for only where the reference is below the smallest normal
            small = absb < min_normal(dtype)
            if small.any():
                small &= np.abs(a) < min_normal(dtype)
                judged &= ~small
        if not judged.any():
            return None, None, math.nan if search else 0.0, nonfinite, spread, None
        err = np.subtract(a, b, where=judged, out=np.zeros_like(b))
        np.abs(err, out=err)
        mag = float(np.max(absb, where=representable, initial=0.0))
        floor = _floor(mag, scale, dtype, ulp_floor)
        div = None
        if ulp_floor == "output":
            # ulp(|ref|) <= floor wherever the reference is representable: err/floor there; a
            # judged reference beyond the range (a finite output where it overflows) takes its own
            beyond = judged & ~representable
            if beyond.any():
                ulp_err = np.divide(err, floor)
                ulp_err[beyond] = err[beyond] / np.maximum(ulp(b[beyond], dtype), floor)
            else:
                ulp_err, div = err, floor
        else:
            denom = ulp(b, dtype)  # only judged (finite) elements matter: err is 0 elsewhere
            np.maximum(denom, floor, out=denom)
            ulp_err = np.divide(err, denom, out=denom)
        if search:
            return ulp_err, err, math.nan, nonfinite, spread, div
        rel_den = np.fmax(absb, max(floor, np.finfo(np.float64).tiny))  # fmax: NaN references give the floor
        rel_max = float(np.divide(err, rel_den, out=rel_den).max())
    return ulp_err, err, rel_max, nonfinite, spread, div


def summary_metrics(ms: List[Metrics]) -> Metrics:
    """The worst of several metrics by severity."""
    return max(ms, key=lambda m: (m.severity, m.abs)) if ms else Metrics()
