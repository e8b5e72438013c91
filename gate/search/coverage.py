"""Value-class coverage of one operator (Opera's argument value classes; the shape and
parameter coverage, SPC, of graph fuzzers).

Every candidate is mapped to *classes*, one set per coverage key:

* ``param:NAME`` - Opera's classes of the argument value: ints ``<=-2, -1, 0, 1, >=2``;
  floats ``<0, 0, >0`` (and ``nan``/``+inf``/``-inf``); each enum value (``'tanh'``); ``True``/
  ``False``/``None``; tuples element-wise (``(>=2,1)``); ``default`` when the call left it out.
* ``dim:NAME`` - the size class of a dimension: ``0, 1, 2-6, 7, 8, 9, 10-63, 64-4095, >=4096``
  (length 1, the vector width 8 and its neighbours, long reductions).
* ``values:TENSOR`` - the value classes present in a float input (several at once):
  ``bulk, zero, subnormal, tiny, all_tiny, near_one, large, near_max, constant, shifted
  (one sign, |mean| >= 30 std), negative, empty``; the magnitude bands are those of
  :func:`gate.search.inputs.element_bands` for the dtype under test.
* ``shape:TENSOR`` - rank x per-dimension size class (``r2:1x10-63``), reported alone.

The *universe* of a key is the set of classes the spec's value spaces can reach: parameter
choices and ranges, dim ranges (bounds evaluated over the parameter values and the earlier
dims' extremes, exact for bounds monotone in their variables, as every catalogue row is), and
for value classes the intersection of each band with the tensor's domain. Singles are
(key, class); pairs are two classes of two different keys (params, dims and values; shapes are
functions of dims and stay out of pairs). :class:`CoverageMap` counts covered singles and pairs
exactly against that universe, proposes uncovered targets, and draws candidates that realise
them (generation that prefers uncovered classes and pairs).
"""
from __future__ import annotations

import collections
import functools
import itertools
import math
import weakref
from typing import Any, Dict, Iterable, List, Mapping, Optional, Set, Tuple

import numpy as np

from ..ops import expr
from ..ops.spec import Domain, OpSpec, ParamSpec, TensorSpec
from .inputs import (REGIMES, Candidate, band_intervals, draw, element_bands, regime_values, tensor_shape)

SIZE_CLASSES = ("0", "1", "2-6", "7", "8", "9", "10-63", "64-4095", ">=4096")
_SIZE_RANGES = {"0": (0, 0), "1": (1, 1), "2-6": (2, 6), "7": (7, 7), "8": (8, 8), "9": (9, 9),
                "10-63": (10, 63), "64-4095": (64, 4095), ">=4096": (4096, math.inf)}
INT_CLASSES = ("<=-2", "-1", "0", "1", ">=2")
FLOAT_CLASSES = ("<0", "0", ">0")
VALUE_CLASSES = REGIMES + ("empty",)
DEFAULT = "default"
_MAX_COMBOS = 4096


# ---------------------------------------------------------------------------------------
# classes of one value
# ---------------------------------------------------------------------------------------
def size_class(n: int) -> str:
    n = int(n)
    for cls in SIZE_CLASSES:
        lo, hi = _SIZE_RANGES[cls]
        if lo <= n <= hi:
            return cls
    raise ValueError(f"negative size {n}")


def size_classes_between(lo: float, hi: float) -> List[str]:
    """Size classes that meet the closed interval ``[lo, hi]``."""
    return [c for c in SIZE_CLASSES if _SIZE_RANGES[c][0] <= hi and _SIZE_RANGES[c][1] >= lo]


def value_class(v: Any) -> str:
    """Opera's value class of one argument value."""
    if v is None:
        return "None"
    if isinstance(v, (bool, np.bool_)):
        return str(bool(v))
    if isinstance(v, (int, np.integer)):
        v = int(v)
        return "<=-2" if v <= -2 else ">=2" if v >= 2 else str(v)
    if isinstance(v, (float, np.floating)):
        v = float(v)
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "+inf" if v > 0 else "-inf"
        return "<0" if v < 0 else ">0" if v > 0 else "0"
    if isinstance(v, str):
        return repr(v)
    if isinstance(v, (tuple, list)):
        return "(" + ",".join(value_class(x) for x in v) + ")"
    return type(v).__name__


def param_universe(p: ParamSpec) -> List[str]:
    """Classes a parameter's value space can produce (empty for derived ``expr`` params)."""
    if p.kind == "expr":
        return []
    if p.kind == "choice":
        return _unique(value_class(c) for c in p.choices or ())
    lo, hi = float(p.lo), float(p.hi)
    if p.kind == "int":
        rng = {"<=-2": (-math.inf, -2), "-1": (-1, -1), "0": (0, 0), "1": (1, 1), ">=2": (2, math.inf)}
        return [c for c in INT_CLASSES if rng[c][0] <= hi and rng[c][1] >= lo]
    out = []
    if lo < 0:
        out.append("<0")
    if lo <= 0 <= hi:
        out.append("0")
    if hi > 0:
        out.append(">0")
    return out


def realise_param(p: ParamSpec, cls: str, rng: np.random.Generator) -> Any:
    """A value of parameter ``p`` in class ``cls`` (``None`` if the space has none)."""
    if p.kind == "choice":
        vals = [c for c in p.choices or () if value_class(c) == cls]
        return vals[int(rng.integers(len(vals)))] if vals else None
    lo, hi = float(p.lo), float(p.hi)
    if p.kind == "int":
        bounds = {"<=-2": (lo, min(hi, -2)), "-1": (-1, -1), "0": (0, 0), "1": (1, 1), ">=2": (max(lo, 2), hi)}
        a, b = bounds.get(cls, (1, 0))
        a, b = max(a, lo), min(b, hi)
        return int(rng.integers(int(a), int(b) + 1)) if a <= b else None
    if cls == "0" and lo <= 0 <= hi:
        return 0.0
    if cls == "<0" and lo < 0:
        return float(rng.uniform(lo, min(hi, 0.0))) or float(lo)
    if cls == ">0" and hi > 0:
        return float(rng.uniform(max(lo, 0.0), hi)) or float(hi)
    return None


@functools.lru_cache(maxsize=None)
def _band_edges(dtype: str) -> Tuple[np.ndarray, float, float]:
    bands = element_bands(dtype)
    edges = np.array([bands["subnormal"][0], bands["tiny"][0], bands["bulk"][0], bands["large"][0],
                      bands["near_max"][0], bands["near_max"][1]])
    return edges, bands["near_one"][0], bands["near_one"][1]


_BINS = ("zero", "subnormal", "tiny", "bulk", "large", "near_max", None)


def value_features(arr: np.ndarray, dtype: str, kernel: str = "auto") -> Set[str]:
    """The value classes present in one float tensor (already rounded to ``dtype``). A few
    passes over the data: min and max tell whether every value is finite and give the bands of
    the smallest and largest magnitudes (present by definition); only bands strictly between
    them, and near one, are searched, on magnitudes taken once and only when needed. An
    all-finite tensor of :data:`BANDS_KERNEL_MIN` elements or more has its bands counted by one
    compiled loop instead (:mod:`gate.search._bands_kernel`) where Numba is there;
    ``kernel="numpy"``: this function's own passes (the definition the loop is held to)."""
    known = _remembered(arr, dtype) if kernel != "numpy" else None
    a = np.asarray(arr, dtype=np.float64).reshape(-1)
    if a.size == 0:
        return {"empty"}
    # the extremes, from the rounding (gate.oracles.runner) where it read them already
    lo, hi = known if known is not None else (float(a.min()), float(a.max()))  # NaN propagates: both finite iff every value is
    all_finite = math.isfinite(lo) and math.isfinite(hi)
    if all_finite and a.size >= BANDS_KERNEL_MIN and kernel != "numpy":
        k = _bands_kernel()
        if k is not None:
            return _counted_features(k, np.ascontiguousarray(a), lo, hi, dtype, arr)
    out: Set[str] = set()
    fin = a
    if not all_finite:
        out.add("nonfinite")
        fin = a[np.isfinite(a)]
        if fin.size == 0:
            return out
        lo, hi = float(fin.min()), float(fin.max())
    m_hi = max(abs(lo), abs(hi))
    mags: List[np.ndarray] = []

    def magnitudes() -> np.ndarray:
        if not mags:
            mags.append(np.abs(fin) if lo < 0.0 else fin)  # no negative value: the values are their magnitudes
        return mags[0]

    m_lo = float(magnitudes().min()) if lo < 0.0 < hi else min(abs(lo), abs(hi))
    edges, nlo, nhi = _band_edges(dtype)
    b_lo = int(np.searchsorted(edges, m_lo, side="right"))
    b_hi = int(np.searchsorted(edges, m_hi, side="right"))
    present = {b_lo, b_hi}
    for b in range(b_lo + 1, b_hi):
        if _any_between(magnitudes(), edges[b - 1], edges[b] if b < len(edges) else math.inf):
            present.add(b)
    for b in present:
        if _BINS[b]:
            out.add(_BINS[b])
    if m_lo < nhi and m_hi >= nlo and _any_between(magnitudes(), nlo, nhi):
        out.add("near_one")
        if 3 in present:  # bulk holds near-one values: it counts only with a value outside that band
            m = magnitudes()
            if not (_any_between(m, edges[2], nlo) or _any_between(m, nhi, edges[3])):
                out.discard("bulk")
    if all_finite and m_hi < edges[2]:
        out.add("all_tiny")
    if a.size >= 2 and all_finite:
        if lo == hi:
            out.add("constant")
        elif lo > 0 or hi < 0:  # large mean, small spread: one sign, |mean| >= 30 std
            mean = float(fin.mean())
            # every value lies within (hi - lo) / 2 of the midpoint, so std <= (hi - lo) / 2
            if abs(mean) >= 15 * (hi - lo) or _shifted(fin, mean, hi - lo):
                out.add("shifted")
    if all_finite and hi < 0:
        out.add("negative")
    return out


#: tensors below this many elements are classified by NumPy (importing Numba costs more there)
BANDS_KERNEL_MIN = 1 << 15

_KERNEL: List[Any] = []


def _bands_kernel():
    """The compiled counting loop, or None (no Numba, or ``DL_GATE_FUSED=0``)."""
    if not _KERNEL:
        import os

        k = None
        if os.environ.get("DL_GATE_FUSED", "1") != "0":
            try:
                from . import _bands_kernel as k
            except ImportError:  # no Numba (or no wheel for this platform): NumPy classifies
                k = None
        _KERNEL.append(k)
    return _KERNEL[0]


def warm() -> bool:
    """Load the band-counting loop from Numba's cache (compiling it the first time); True when
    it is used."""
    k = _bands_kernel()
    if k is None:
        return False
    _counted_features(k, np.linspace(-2.0, 2.0, BANDS_KERNEL_MIN), -2.0, 2.0, "float32")
    return True


#: (weak reference to an array, dtype, its least value, its greatest) of the last few all-finite
#: arrays whose extremes were read as they were rounded to ``dtype``
_REMEMBERED: "collections.deque" = collections.deque(maxlen=8)


def remember(arr: np.ndarray, dtype: str, lo: float, hi: float) -> None:
    """``arr`` (rounded to ``dtype``, all finite, and never written in place afterwards, as every
    candidate array) has least value ``lo`` and greatest ``hi``: :func:`value_features` of this
    very object for ``dtype`` does not read them again. Only a weak reference is kept."""
    _REMEMBERED.append((weakref.ref(arr), dtype, float(lo), float(hi)))


def _remembered(arr, dtype: str):
    for ref, dt, lo, hi in reversed(_REMEMBERED):
        if ref() is arr and dt == dtype:
            return lo, hi
    return None


def count_thresholds(dtype: str) -> Tuple[float, ...]:
    """The eight magnitudes :func:`_counted_features` counts at or above: the band edges, then
    the two ends of the near-one band."""
    edges, nlo, nhi = _band_edges(dtype)
    return tuple(float(e) for e in edges) + (float(nlo), float(nhi))


def count_in_rounding(dtype: str) -> None:
    """Have the compiled float32 rounding of a candidate count the magnitudes at ``dtype``'s
    band edges in its own pass (:func:`gate.backends.base.count_magnitudes_at`), so that
    :func:`value_features` of the array it made does not read it again (a float32 search: the
    counts of a float32 array rounded for a float32 variant)."""
    from ..backends.base import count_magnitudes_at

    if dtype == "float32":
        count_magnitudes_at(dtype, count_thresholds(dtype))


def _counted_features(k, a: np.ndarray, lo: float, hi: float, dtype: str, arr=None) -> Set[str]:
    """:func:`value_features` of the flat, all-finite ``a`` (minimum ``lo``, maximum ``hi``)
    from counts of magnitudes at or above each band edge and each end of the near-one band
    (which lies inside the bulk band): the same decisions as the NumPy passes. The counts come
    from the rounding pass that made ``arr`` (``a``'s array) where it counted them
    (:func:`count_in_rounding`), else from one counting pass."""
    from ..backends.base import known_counts

    edges, nlo, nhi = _band_edges(dtype)
    g = known_counts(arr, count_thresholds(dtype)) if arr is not None else None
    if g is None:
        g = k.at_or_above(a, *count_thresholds(dtype))
    n = a.size
    counts = (n - g[0], g[0] - g[1], g[1] - g[2], g[2] - g[3], g[3] - g[4], g[4] - g[5], g[5])
    out: Set[str] = {_BINS[b] for b, c in enumerate(counts) if c and _BINS[b]}
    if g[6] - g[7]:  # magnitudes in [nlo, nhi)
        out.add("near_one")
        if counts[3] and not ((g[2] - g[6]) or (g[7] - g[3])):  # bulk holds near-one values only
            out.discard("bulk")
    m_hi = max(abs(lo), abs(hi))
    if m_hi < edges[2]:
        out.add("all_tiny")
    if n >= 2:
        if lo == hi:
            out.add("constant")
        elif lo > 0 or hi < 0:
            mean = float(a.mean())
            if abs(mean) >= 15 * (hi - lo) or _shifted(a, mean, hi - lo):
                out.add("shifted")
    if hi < 0:
        out.add("negative")
    return out


def _any_between(m: np.ndarray, lo: float, hi: float) -> bool:
    """Is any of the magnitudes ``m`` in [lo, hi)?"""
    inside = np.greater_equal(m, lo)
    inside &= np.less(m, hi)
    return bool(inside.any())


def _shifted(fin: np.ndarray, mean: float, width: float) -> bool:
    """|mean| >= 30 std of one-signed values spread over ``width`` > 0 (the variance from one
    centred copy, in units of the width: no overflow near float64's largest values)."""
    d = np.subtract(fin, mean)
    d /= width
    # not np.dot: a BLAS call wakes OpenBLAS's thread pool, whose spinning threads then slowed the
    # framework's next operator calls 3x on a 2-core machine (torch.matmul, bench/throughput.py)
    var = float(np.square(d, out=d).sum()) / d.size
    m = mean / width
    return var > 0 and m * m >= 900.0 * var


def feasible_values(domain: Domain, dtype: str, numel: Tuple[float, float]) -> List[str]:
    """Value classes reachable inside ``domain`` for tensors of ``numel`` in [lo, hi]."""
    bands = element_bands(dtype)
    nlo, nhi = numel
    reach = _in_set(domain.values, bands, nhi) if domain.values else _in_interval(domain, bands, nhi)
    return [c for c in VALUE_CLASSES if (nlo == 0 if c == "empty" else nhi != 0 and reach(c))]


def _in_interval(domain: Domain, bands: Dict[str, tuple], nhi: float):
    """Whether a tensor of at most ``nhi`` elements inside the open interval can be of a class."""
    lo = -math.inf if domain.lo is None else domain.lo
    hi = math.inf if domain.hi is None else domain.hi

    def reach(cls: str) -> bool:
        if cls == "zero":
            return lo < 0 < hi
        if cls in ("constant", "shifted"):
            return nhi >= 2
        if cls == "negative":
            return lo < 0
        return bool(band_intervals(*bands["tiny" if cls == "all_tiny" else cls], domain))

    return reach


def _in_set(values: tuple, bands: Dict[str, tuple], nhi: float):
    """Whether a tensor of at most ``nhi`` elements holding only ``values`` (a set domain:
    labels) can be of a class."""
    mags = [abs(v) for v in values]

    def reach(cls: str) -> bool:
        if cls == "zero":
            return 0.0 in values
        if cls == "constant":
            return nhi >= 2
        if cls == "shifted":  # one sign, a spread: two distinct values of one sign
            return nhi >= 2 and (sum(v > 0 for v in values) >= 2 or sum(v < 0 for v in values) >= 2)
        if cls == "negative":
            return any(v < 0 for v in values)
        if cls == "all_tiny":
            return any(m < bands["tiny"][1] for m in mags)
        a, b = bands[cls]
        return any(a <= m < b for m in mags)

    return reach


# ---------------------------------------------------------------------------------------
# the universe of one spec
# ---------------------------------------------------------------------------------------
def _param_options(spec: OpSpec) -> Dict[str, list]:
    opts: Dict[str, list] = {}
    for p in spec.params:
        if p.kind == "choice":
            opts[p.name] = [c for c in p.choices or () if isinstance(c, (int, float)) and not isinstance(c, bool)] \
                or list(p.choices or ())
        elif p.kind in ("int", "float"):
            opts[p.name] = [p.lo, p.hi]
    return opts


def _extremes(e: Any, options: Mapping[str, list]) -> Optional[Tuple[float, float]]:
    """min and max of expression ``e`` over every combination of its names' options."""
    names = sorted(expr.names(e))
    if any(n not in options for n in names):
        return None
    combos = list(itertools.islice(itertools.product(*(options[n] for n in names)), _MAX_COMBOS))
    vals = []
    for combo in combos:
        try:
            v = expr.evaluate(e, dict(zip(names, combo)))
        except Exception:
            continue
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            vals.append(float(v))
    return (min(vals), max(vals)) if vals else None


def dim_envelope(spec: OpSpec, reach: bool = True) -> Dict[str, Tuple[float, float]]:
    """[lowest lower bound, highest upper bound] of every dim over the spec's value spaces (with
    ``reach``: up to a dim's reach, where the search's size mutation aims; without it, the drawn
    ranges)."""
    options = _param_options(spec)
    env: Dict[str, Tuple[float, float]] = {}
    reach = dict(spec.reach) if reach else {}
    for name, (lo_e, hi_e) in spec.dims:
        lo = _extremes(lo_e, options)
        hi = _extremes(hi_e, options)
        a = lo[0] if lo else 0.0
        b = max(hi[1], reach.get(name, -math.inf)) if hi else math.inf
        env[name] = (max(a, 0.0), b)
        options[name] = sorted({env[name][0], env[name][1]} - {math.inf}) or [0]
    return env


class Universe:
    """Every class a spec's value spaces can reach, per coverage key, for one dtype."""

    def __init__(self, spec: OpSpec, dtype: str = "float32"):
        self.spec, self.dtype = spec, dtype
        self.envelope = dim_envelope(spec)
        self.keys: Dict[str, List[str]] = {}
        for p in spec.params:
            cls = param_universe(p)
            if cls:
                self.keys[f"param:{p.name}"] = cls
        for name, _ in spec.dims:
            lo, hi = self.envelope[name]
            self.keys[f"dim:{name}"] = size_classes_between(lo, hi)
        self.shapes: Dict[str, Tuple[int, bool]] = {}
        for t in spec.inputs:
            shape_classes, exact, numel = self._shape_universe(t)
            self.shapes[t.name] = (shape_classes, exact)
            if t.kind == "float":
                self.keys[f"values:{t.name}"] = feasible_values(t.domain, dtype, numel)
        self.keys = {k: v for k, v in self.keys.items() if v}

    def _entry_range(self, e: Any) -> Tuple[float, float]:
        if isinstance(e, (int, float)):
            return (float(e), float(e))
        if isinstance(e, str) and e in self.envelope:
            return self.envelope[e]
        opts = _param_options(self.spec)
        for n, (lo, hi) in self.envelope.items():
            opts[n] = sorted({lo, hi} - {math.inf}) or [0]
        ext = _extremes(e, opts)
        return ext if ext else (0.0, math.inf)

    def _shape_universe(self, t: TensorSpec) -> Tuple[int, bool, Tuple[float, float]]:
        """(number of reachable shape classes, whether that count is exact, numel range)."""
        ranges = [self._entry_range(e) for e in t.shape]
        nlo = float(np.prod([r[0] for r in ranges])) if ranges else 1.0
        nhi = float(np.prod([r[1] for r in ranges])) if ranges else 1.0
        exact = all(isinstance(e, int) or (isinstance(e, str) and e in self.envelope) for e in t.shape)
        count = 1
        seen: Dict[str, int] = {}
        for e, (lo, hi) in zip(t.shape, ranges):
            if isinstance(e, str) and e in seen:
                continue  # a repeated dim takes the same class
            n = len(size_classes_between(lo, hi))
            if isinstance(e, str):
                seen[e] = n
            count *= n
        return count, exact, (nlo, nhi)

    def singles(self) -> int:
        return sum(len(v) for v in self.keys.values())

    def pairs(self) -> int:
        sizes = [len(v) for v in self.keys.values()]
        total = sum(sizes)
        return (total * total - sum(s * s for s in sizes)) // 2


def classify(spec: OpSpec, cand: Candidate, dtype: str = "float32") -> Tuple[Dict[str, Set[str]], Dict[str, str]]:
    """(key -> classes of ``cand``, tensor -> shape class)."""
    out: Dict[str, Set[str]] = {}
    for p in spec.params:
        if p.kind == "expr":
            continue
        out[f"param:{p.name}"] = {value_class(cand.params[p.name]) if p.name in cand.params else DEFAULT}
    for name, _ in spec.dims:
        if name in cand.dims:
            out[f"dim:{name}"] = {size_class(cand.dims[name])}
    shapes: Dict[str, str] = {}
    for t in spec.inputs:
        a = cand.arrays.get(t.name)
        if a is None:
            continue
        shapes[t.name] = f"r{a.ndim}:" + "x".join(size_class(s) for s in a.shape)
        if t.kind == "float":
            out[f"values:{t.name}"] = value_features(a, dtype)
    return out, shapes


# ---------------------------------------------------------------------------------------
# the running account
# ---------------------------------------------------------------------------------------
class CoverageMap:
    """Covered singles and pairs of one spec under one dtype, and what is left to cover."""

    def __init__(self, spec: OpSpec, dtype: str = "float32", max_attempts: int = 3):
        self.spec, self.dtype = spec, dtype
        count_in_rounding(dtype)
        self.universe = Universe(spec, dtype)
        self.keys = list(self.universe.keys)
        self._index = {k: i for i, k in enumerate(self.keys)}
        self.covered: Dict[str, Set[str]] = {k: set() for k in self.keys}
        self.extra: Dict[str, Set[str]] = {}
        self.pairs: Set[Tuple[int, str, int, str]] = set()
        self.shapes: Dict[str, Set[str]] = {t: set() for t in self.universe.shapes}
        self.attempts: Dict[tuple, int] = {}
        self.max_attempts = max_attempts
        self.observed = 0
        self.exhausted = False

    # -- accounting ---------------------------------------------------------------------
    def observe(self, cand: Candidate) -> Tuple[int, int]:
        """Record ``cand`` (as run: rounded to the dtype); returns (new singles, new pairs)."""
        classes, shapes = classify(self.spec, cand, self.dtype)
        self.observed += 1
        for t, s in shapes.items():
            self.shapes.setdefault(t, set()).add(s)
        new_singles = new_pairs = 0
        inside: List[Tuple[int, List[str]]] = []
        for key, cls in classes.items():
            uni = self.universe.keys.get(key)
            if uni is None:
                if cls:
                    self.extra.setdefault(key, set()).update(cls)
                continue
            ok = [c for c in cls if c in uni]
            bad = set(cls) - set(ok)
            if bad:
                self.extra.setdefault(key, set()).update(bad)
            for c in ok:
                if c not in self.covered[key]:
                    self.covered[key].add(c)
                    new_singles += 1
            if ok:
                inside.append((self._index[key], sorted(ok)))
        inside.sort()
        for (i, ci), (j, cj) in itertools.combinations(inside, 2):
            for a in ci:
                for b in cj:
                    p = (i, a, j, b)
                    if p not in self.pairs:
                        self.pairs.add(p)
                        new_pairs += 1
        return new_singles, new_pairs

    def covered_singles(self) -> int:
        return sum(len(v) for v in self.covered.values())

    def uncovered_singles(self) -> List[Tuple[str, str]]:
        return [(k, c) for k in self.keys for c in self.universe.keys[k] if c not in self.covered[k]]

    def uncovered_pairs(self) -> List[Tuple[str, str, str, str]]:
        out = []
        for (i, ki), (j, kj) in itertools.combinations(enumerate(self.keys), 2):
            for a in self.universe.keys[ki]:
                for b in self.universe.keys[kj]:
                    if (i, a, j, b) not in self.pairs:
                        out.append((ki, a, kj, b))
        return out

    # -- choosing what to cover next ----------------------------------------------------
    def _fresh(self, target: Tuple) -> bool:
        return self.attempts.get(target, 0) < self.max_attempts

    def suggest(self, rng: np.random.Generator) -> Dict[str, str]:
        """An uncovered target: an uncovered single with a partner making an uncovered pair,
        else an uncovered pair; ``{}`` when everything reachable was covered or tried."""
        if self.exhausted:
            return {}
        singles = [s for s in self.uncovered_singles() if self._fresh(s)]
        if singles:
            key, cls = singles[int(rng.integers(len(singles)))]
            self.attempts[(key, cls)] = self.attempts.get((key, cls), 0) + 1
            i = self._index[key]
            for k2 in rng.permutation(self.keys):
                if k2 == key:
                    continue
                j = self._index[k2]
                opts = [c for c in self.universe.keys[k2]
                        if ((i, cls, j, c) if i < j else (j, c, i, cls)) not in self.pairs]
                if opts:
                    return {key: cls, str(k2): opts[int(rng.integers(len(opts)))]}
            return {key: cls}
        # rejection sampling first (cheap), enumeration when the pairs are nearly all covered
        for _ in range(32):
            if len(self.keys) < 2:
                break
            i, j = sorted(int(x) for x in rng.choice(len(self.keys), size=2, replace=False))
            ki, kj = self.keys[i], self.keys[j]
            a = self.universe.keys[ki][int(rng.integers(len(self.universe.keys[ki])))]
            b = self.universe.keys[kj][int(rng.integers(len(self.universe.keys[kj])))]
            t = (ki, a, kj, b)
            if (i, a, j, b) not in self.pairs and self._fresh(t):
                self.attempts[t] = self.attempts.get(t, 0) + 1
                return {ki: a, kj: b}
        left = [t for t in self.uncovered_pairs() if self._fresh(t)]
        if not left:
            self.exhausted = True  # coverage and attempts only grow: nothing will reopen
            return {}
        t = left[int(rng.integers(len(left)))]
        self.attempts[t] = self.attempts.get(t, 0) + 1
        return {t[0]: t[1], t[2]: t[3]}

    def draw(self, rng: np.random.Generator, p_target: float = 0.8, p_regime: float = 0.3,
             origin: str = "coverage") -> Candidate:
        """A fresh candidate aimed at an uncovered target (with probability ``p_target``);
        tensors not aimed at get a random feasible value regime with probability ``p_regime``
        (edge values mixed into generation by each tensor's domain)."""
        target = self.suggest(rng) if rng.random() < p_target else {}
        return realise(self.spec, target, rng, self.dtype, self.universe, p_regime=p_regime, origin=origin)

    # -- reporting ----------------------------------------------------------------------
    def report(self) -> dict:
        keys = {}
        for k in self.keys:
            keys[k] = {"covered": [c for c in self.universe.keys[k] if c in self.covered[k]],
                       "missing": [c for c in self.universe.keys[k] if c not in self.covered[k]]}
            if self.extra.get(k):
                keys[k]["extra"] = sorted(self.extra[k])
        for k, v in self.extra.items():
            if k not in keys:
                keys[k] = {"covered": [], "missing": [], "extra": sorted(v)}
        shapes = {t: {"covered": sorted(self.shapes.get(t, ())), "total": n, "exact": exact}
                  for t, (n, exact) in self.universe.shapes.items()}
        tried = sum(1 for t, n in self.attempts.items() if n >= self.max_attempts and not self._is_covered(t))
        s_tot, p_tot = self.universe.singles(), self.universe.pairs()
        return {
            "dtype": self.dtype,
            "observed": self.observed,
            "singles": {"covered": self.covered_singles(), "total": s_tot},
            "pairs": {"covered": len(self.pairs), "total": p_tot},
            "ratio": round((self.covered_singles() + len(self.pairs)) / max(1, s_tot + p_tot), 4),
            "unreached_targets": tried,
            "keys": keys,
            "shapes": shapes,
        }

    def _is_covered(self, target: Tuple) -> bool:
        if len(target) == 2:
            return target[1] in self.covered.get(target[0], ())
        ki, a, kj, b = target
        return (self._index[ki], a, self._index[kj], b) in self.pairs


# ---------------------------------------------------------------------------------------
# realising a target
# ---------------------------------------------------------------------------------------
def realise_size(cls: str, lo: float, hi: float, rng: np.random.Generator) -> Optional[int]:
    a, b = _SIZE_RANGES[cls]
    a, b = max(a, lo), min(b, hi)
    if a > b or math.isinf(b):
        return None if a > b else int(a)
    return int(rng.integers(int(a), int(b) + 1))


def realise(spec: OpSpec, target: Mapping[str, str], rng: np.random.Generator, dtype: str = "float32",
            universe: Optional[Universe] = None, p_regime: float = 0.3, origin: str = "coverage",
            like: Optional[Mapping[str, np.ndarray]] = None) -> Candidate:
    """A candidate realising ``target`` (key -> class) where the spec allows it."""
    universe = universe or Universe(spec, dtype)
    pspecs = {p.name: p for p in spec.params}
    fixed_params: Dict[str, Any] = {}
    fixed_dims: Dict[str, int] = {}
    regimes: Dict[str, str] = {}
    for key, cls in target.items():
        kind, name = key.split(":", 1)
        if kind == "param" and name in pspecs:
            v = realise_param(pspecs[name], cls, rng)
            if v is not None:
                fixed_params[name] = v
        elif kind == "dim":
            lo, hi = universe.envelope.get(name, (0, math.inf))
            v = realise_size(cls, lo, hi, rng)
            if v is not None:
                fixed_dims[name] = v
        elif kind == "values":
            regimes[name] = cls
    cand = draw(spec, rng, fixed_params=fixed_params or None, fixed_dims=fixed_dims or None, like=like,
                origin=origin)
    env = {**cand.params, **cand.dims}
    for t in spec.inputs:
        if t.kind != "float":
            continue
        regime = regimes.get(t.name)
        if regime is None and rng.random() < p_regime:
            opts = [c for c in universe.keys.get(f"values:{t.name}", ()) if c != "empty"]
            regime = opts[int(rng.integers(len(opts)))] if opts else None
        if regime is None or regime == "empty":
            continue
        arr = regime_values(regime, t.domain, tensor_shape(t, env), rng, dtype, base=cand.arrays[t.name])
        if arr is not None:
            cand.arrays[t.name] = arr
    return cand


def _unique(xs: Iterable[str]) -> List[str]:
    out: List[str] = []
    for x in xs:
        if x not in out:
            out.append(x)
    return out


__all__ = ["CoverageMap", "Universe", "classify", "value_class", "size_class", "value_features", "realise",
           "SIZE_CLASSES", "INT_CLASSES", "FLOAT_CLASSES", "VALUE_CLASSES"]
