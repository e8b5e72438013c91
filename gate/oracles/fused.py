"""The search's figures of one output in one compiled pass (Numba).

:func:`gate.oracles.precision.compare` is the definition of every figure, written in NumPy: on a
large finite output its ``figures="search"`` branch still makes six passes over the output and
its float64 reference (subtract, abs, argmax, sum, the two range reductions, the below-normal
check) and allocates a float64 array of the whole tensor; on an output holding NaN/Inf or values
beyond the dtype's range it makes a dozen more, with masks. Here the same figures come out of one
loop over the two arrays, with no temporary: the max error and its index, the ULP error's max and
index (``ulp_floor='dtype'``), both sums in NumPy's own pairwise order (so they are bit for bit
the NumPy path's: ``tests/test_fused_scoring.py`` holds them to it on adversarial outputs), the
NaN/Inf count, the reference's largest representable magnitude, and the flags that tell which of
``compare``'s branches the NumPy path would have taken.

Why Numba: it ships as a wheel for every platform the gate runs on (no compiler on the user's
machine, unlike a C extension), compiles the loop once per signature and caches it on disk, and
is a well-kept library. Imported lazily and only for outputs of at least
:data:`MIN_ELEMENTS` elements: below that NumPy's passes cost less than importing it. Without
Numba (or with ``DL_GATE_FUSED=0``) :func:`available` is False and ``compare`` uses NumPy.
"""
from __future__ import annotations

import math
import os
from typing import NamedTuple, Optional

import numpy as np

#: outputs below this many elements are scored by NumPy (a few microseconds a pass there)
MIN_ELEMENTS = 1 << 15

#: the dtypes the kernel scores in: the low precisions a search measures. A float64 variant's
#: figures (its own ulps, down to float64's subnormals) are NumPy's: the kernel's differed from
#: them there (a max ulp error 2.1x off on float64 subnormal references, found when the bit-for-bit
#: test first covered float64)
DTYPES = ("float16", "bfloat16", "float32")

_kernel = None
_tried = False


def available() -> bool:
    """True when the compiled kernel can be used (Numba importable, not switched off)."""
    return _load() is not None


def _load():
    global _kernel, _tried
    if not _tried:
        _tried = True
        if os.environ.get("DL_GATE_FUSED", "1") != "0":
            try:
                _kernel = _build()
            except ImportError:  # no Numba (or no wheel for this platform): NumPy scores everything
                _kernel = None
    return _kernel


def warm() -> bool:
    """Compile (or load from Numba's cache) every signature the gate uses; True when available."""
    k = _load()
    if k is None:
        return False
    b = np.zeros(16)
    for a in (np.zeros(16), np.zeros(16, dtype=np.float32)):
        for x in (a, np.full_like(a, np.nan)):  # the all-finite pass, and the general one
            for sums in (True, False):
                scores(x, b, "float32", "output", True, sums)
                scores(x, b, "float32", "dtype", True, sums)
        beyond_max(a, b, "float32", True, 1.0)
    return True


class Scores(NamedTuple):
    """The figures of one output against its reference (see :func:`scores`)."""

    fast: bool
    e_max: float
    e_idx: int
    u_max: float
    u_idx: int
    s_err: float
    s_ulp: float
    nonfinite: int
    mag: float
    judged: int
    beyond: int


def scores(a: np.ndarray, b: np.ndarray, dtype: str, ulp_floor: str, ftz: bool, sums: bool = True
           ) -> Optional[Scores]:
    """The figures of the flat output ``a`` (float64 or float32) against the flat float64
    reference ``b`` in ``dtype``'s units, or None where the kernel is not available (or ``dtype``
    is not one of :data:`DTYPES`).

    ``fast``: the NumPy path would take its all-finite branch (every reference value finite and
    in range, every output finite, no element where a flush to zero changes the error);
    ``e_max``/``e_idx``: the largest |a - b| over judged elements (0 elsewhere) and its first
    index; ``u_max``/``u_idx``: with ``ulp_floor='dtype'``, the largest error in ulps of each
    reference value and its first index (``'output'``: the same as ``e_*``, scaled later by the
    floor, which needs ``mag``); ``s_err``, ``s_ulp``: the pairwise sums of both; ``nonfinite``:
    NaN/Inf outputs where the reference is representable; ``mag``: the largest representable
    |reference|; ``judged``: elements judged; ``beyond``: judged elements whose reference is
    beyond the dtype's range (``ulp_floor='output'`` scores those in NumPy). ``sums=False``:
    ``s_err`` and ``s_ulp`` are not taken (0.0; a search guided by the largest error)."""
    from ..backends.base import FLOAT_FORMATS, min_normal, overflow_bound

    k = _load()
    if k is None or dtype not in DTYPES:
        return None
    p, emin, emax = FLOAT_FORMATS[dtype]
    ovf = overflow_bound(dtype)
    by_dtype = ulp_floor == "dtype"
    mn = float(min_normal(dtype))
    args = (float(ovf), mn, bool(ftz), by_dtype, int(p), int(emin), int(emax), bool(sums))
    st = np.zeros(4)
    it = np.zeros(8, dtype=np.int64)
    # one traversal: block by block, the all-finite leaf where a block allows it, every rule elsewhere
    s_err, s_ulp = k.traverse(a, b, *args, st, it)
    e_max, u_max, mag = float(st[0]), float(st[1]), float(st[2])
    e_idx, u_idx, nonfinite, judged, beyond = (int(x) for x in it[:5])
    if it[5] == 0 and it[6] == 0 and it[7] == 0:  # NumPy's all-finite branch: its figures
        if not by_dtype:
            u_max, u_idx = 0.0, e_idx
        return Scores(True, e_max, e_idx, u_max, u_idx, float(s_err), float(s_ulp), 0, mag, a.size, 0)
    return Scores(False, e_max, e_idx, u_max, u_idx, float(s_err), float(s_ulp), nonfinite, mag, judged, beyond)


def beyond_max(a: np.ndarray, b: np.ndarray, dtype: str, ftz: bool, floor: float):
    """(largest ulp error, its first index) of the flat output ``a`` against ``b`` where
    ``ulp_floor='output'`` and some judged references are beyond ``dtype``'s range (:func:`scores`'
    ``beyond``): ``floor`` divides every error but those, which take the larger of their own ulp
    and ``floor`` (the NumPy path's arithmetic, :func:`gate.oracles.precision._slow_errors`); one
    more pass over the two arrays instead of that path's dozen. The caller has the kernel."""
    from ..backends.base import FLOAT_FORMATS, min_normal, overflow_bound

    p, emin, emax = FLOAT_FORMATS[dtype]
    u, idx = _load().beyond_max(a, b, float(overflow_bound(dtype)), float(min_normal(dtype)), bool(ftz),
                                float(floor), int(p), int(emin), int(emax))
    return float(u), int(idx)


def _build():
    from . import _fused_kernel  # imports Numba: only here

    return _fused_kernel
