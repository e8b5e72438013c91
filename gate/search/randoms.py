"""Random numbers for large candidates, at the cost of a pass over memory.

A search makes a candidate of a million elements many times a second; NumPy's ``Generator``
draws a million standard normals in ~10 ms on a 2-core CI machine (its ziggurat, ~9 ns a value,
in float32 too), uniforms or integers in ~2.5 ms, ``choice`` of two signs in ~6 ms: more than a
cheap operator and its float64 reference together. For tensors of :data:`MIN_ELEMENTS` or more
the search's generators draw one 64-bit seed from the search's ``Generator`` and derive every
element from it with a counter-based generator, SplitMix64 (Java's ``SplittableRandom``; passes
BigCrush): element ``i`` is ``mix(seed + (i + 1) * 0x9E3779B97F4A7C15)``. So a seed still fixes
every candidate, and each element costs a few integer multiplies, which one compiled loop
(:mod:`gate.search._randoms_kernel`, Numba) vectorises; the NumPy path below computes the same
numbers (bit for bit, ``tests/test_search_randoms.py``) where Numba is missing or
``DL_GATE_FUSED=0``. Smaller tensors keep NumPy's own draws (their candidates are unchanged).

From a 64-bit value ``z``:

* a standard normal by inverting its distribution function: the top 16 bits pick one of 65,536
  equal-probability intervals of the normal (quantiles ``Q[j] = Φ⁻¹(j / 2¹⁶)``), the next 32 bits
  place the value inside it (linearly); the two outermost intervals (|x| > 4.17) go through a
  second table of 65,536 quantiles of the tail, ``Φ⁻¹(m / 2³²)``, out to |x| = 6.23 (a value
  beyond that is 1 in 10⁹: NumPy's ziggurat would give one in a thousand tensors of a million).
  Mean, spread, tails and the spacing of the values are the normal's (the test compares
  quantiles); the tables come from :class:`statistics.NormalDist` (Wichura's AS241, ~14 ms once).
* a uniform in [0, 1): ``((z >> 11) + 0.5) / 2⁵³``;
* an index below ``n`` (< 2³²): ``((z >> 32) * n) >> 32`` (Lemire's multiply-shift; a bias of
  n / 2³², below 2.5e-4 for a million);
* a sign: the lowest bit.
"""
from __future__ import annotations

import functools
import os
import statistics
from typing import Any, List

import numpy as np

#: arrays below this many elements are drawn by NumPy's ``Generator`` as before
MIN_ELEMENTS = 1 << 15

GAMMA = np.uint64(0x9E3779B97F4A7C15)
C1 = np.uint64(0xBF58476D1CE4E5B9)
C2 = np.uint64(0x94D049BB133111EB)
_SCALE32 = 2.0 ** -32
_SCALE16 = 2.0 ** -16
_SCALE53 = 2.0 ** -53

_KERNEL: List[Any] = []


def kernel():
    """The compiled loops, or None (no Numba, or ``DL_GATE_FUSED=0``)."""
    if not _KERNEL:
        k = None
        if os.environ.get("DL_GATE_FUSED", "1") != "0":
            try:
                from . import _randoms_kernel as k
            except ImportError:  # no Numba (or no wheel for this platform): NumPy draws them
                k = None
        _KERNEL.append(k)
    return _KERNEL[0]


def warm() -> bool:
    """Compile (or load from Numba's cache) every loop the search uses; True when available."""
    k = kernel()
    if k is None:
        return False
    rng = np.random.default_rng(0)
    n = MIN_ELEMENTS
    for f in (lambda: standard_normal(rng, (n,)), lambda: uniform(rng, 0.0, 1.0, (n,)),
              lambda: integers(rng, 3, n), lambda: resample(rng, np.ones(4), (n,)),
              lambda: signed(rng, np.ones(n)), lambda: noise(rng, np.ones(n), 0.1)):
        f()
    return True


@functools.lru_cache(maxsize=None)
def tables():
    """(Q, D, T): ``Q[j] = Φ⁻¹(j / 2¹⁶)`` for j in 1..65535 (``Q[0]`` unused), ``D[j] = Q[j+1] - Q[j]``
    (j in 1..65534), ``T[m] = Φ⁻¹(m / 2³²)`` for m in 1..65536 (``T[0] = T[1]``) and its
    differences appended (``T`` has 2 × 65537 entries: values, then differences). Exactly
    symmetric: ``Q[65536 - j] = -Q[j]``."""
    inv = statistics.NormalDist().inv_cdf
    half = np.array([inv(k / 65536) for k in range(1, 32768)])  # Q[1..32767]
    q = np.zeros(65537)
    q[1:32768] = half
    q[32768] = 0.0
    q[32769:65536] = -half[::-1]
    d = np.zeros(65536)
    d[1:65535] = q[2:65536] - q[1:65535]
    t = np.empty(65537)
    t[1:] = [inv(m * 2.0 ** -32) for m in range(1, 65537)]
    t[0] = t[1]
    td = np.zeros(65537)
    td[:-1] = t[1:] - t[:-1]
    for a in (q, d, t, td):
        a.setflags(write=False)
    return q[:65536], d, t, td


@functools.lru_cache(maxsize=None)
def packed_tables():
    """(QD, TT): :func:`tables` interleaved for the compiled loop, ``QD[2j] = Q[j]``,
    ``QD[2j + 1] = D[j]`` (and ``T`` with its differences alike): the two entries an element reads
    share a cache line. The tables are 1 MB, as large as a core's L2 cache; reading them apart
    took two misses an element (a million normals: 6.3 ms, 4.5 ms interleaved; the same values)."""
    q, d, t, td = tables()
    qd = np.empty(2 * q.size)
    qd[0::2], qd[1::2] = q, d
    tt = np.empty(2 * t.size)
    tt[0::2], tt[1::2] = t, td
    for a in (qd, tt):
        a.setflags(write=False)
    return qd, tt


def seed_of(rng: np.random.Generator) -> np.uint64:
    """One 64-bit seed from the search's generator (the only draw it makes for a large array)."""
    return np.uint64(rng.integers(0, 1 << 64, dtype=np.uint64))


# -- the NumPy path: the reference the compiled loops are held to -------------------------------
def mix(seed: np.uint64, n: int) -> np.ndarray:
    """SplitMix64's outputs 1..n after ``seed`` (uint64, wrapping)."""
    with np.errstate(over="ignore"):
        z = np.arange(1, n + 1, dtype=np.uint64)
        z *= GAMMA
        z += np.uint64(seed)
        z ^= z >> np.uint64(30)
        z *= C1
        z ^= z >> np.uint64(27)
        z *= C2
        z ^= z >> np.uint64(31)
    return z


def normal_of(z: np.ndarray) -> np.ndarray:
    """Standard normals from 64-bit values (see the module)."""
    q, d, t, td = tables()
    j = (z >> np.uint64(48)).astype(np.intp)
    frac = ((z >> np.uint64(16)) & np.uint64(0xFFFFFFFF)).astype(np.float64)
    frac += 0.5
    frac *= _SCALE32
    tail = (j == 0) | (j == 65535)
    j[tail] = 1  # a finite placeholder, replaced below
    x = d[j]
    x *= frac
    x += q[j]
    if tail.any():
        zt = z[tail]
        m = ((zt >> np.uint64(32)) & np.uint64(0xFFFF)).astype(np.intp)
        u = ((zt >> np.uint64(16)) & np.uint64(0xFFFF)).astype(np.float64)
        u += 0.5
        u *= _SCALE16
        v = td[m] * u + t[m]
        x[tail] = np.where((zt >> np.uint64(48)) == np.uint64(0), v, -v)
    return x


def numpy_normal(seed: np.uint64, n: int) -> np.ndarray:
    return normal_of(mix(seed, n))


def numpy_uniform(seed: np.uint64, n: int, lo: float = 0.0, hi: float = 1.0) -> np.ndarray:
    u = (mix(seed, n) >> np.uint64(11)).astype(np.float64)
    u += 0.5
    u *= _SCALE53
    u *= (hi - lo)
    u += lo
    return u


def numpy_indices(seed: np.uint64, n: int, below: int) -> np.ndarray:
    with np.errstate(over="ignore"):
        return ((mix(seed, n) >> np.uint64(32)) * np.uint64(below) >> np.uint64(32)).astype(np.intp)


def numpy_noise(seed: np.uint64, a: np.ndarray, rel: float) -> np.ndarray:
    step = np.abs(a)
    step += 1e-12
    step *= numpy_normal(seed, a.size)
    step *= rel
    step += a
    return step


def numpy_signed(seed: np.uint64, mags: np.ndarray) -> np.ndarray:
    neg = (mix(seed, mags.size) & np.uint64(1)).astype(bool)
    return np.where(neg, -mags, mags)


# -- what the search calls -----------------------------------------------------------------------
def _size(shape) -> int:
    return int(np.prod(shape)) if shape else 1


def _flat(shape) -> tuple:
    return tuple(shape) if isinstance(shape, (tuple, list)) else (int(shape),)


def standard_normal(rng: np.random.Generator, shape) -> np.ndarray:
    """Standard normals of ``shape`` (float64)."""
    n = _size(shape)
    if n < MIN_ELEMENTS:
        return rng.standard_normal(shape)
    seed, k = seed_of(rng), kernel()
    if k is None:
        return numpy_normal(seed, n).reshape(_flat(shape))
    qd, tt = packed_tables()
    out = np.empty(n)
    k.normals(seed, qd, tt, out)
    return out.reshape(_flat(shape))


def uniform(rng: np.random.Generator, lo: float, hi: float, shape) -> np.ndarray:
    """Uniforms in [lo, hi) of ``shape`` (float64)."""
    n = _size(shape)
    if n < MIN_ELEMENTS:
        return rng.uniform(lo, hi, shape)
    seed, k = seed_of(rng), kernel()
    if k is None:
        return numpy_uniform(seed, n, lo, hi).reshape(_flat(shape))
    out = np.empty(n)
    k.uniforms(seed, float(lo), float(hi), out)
    return out.reshape(_flat(shape))


def random(rng: np.random.Generator, shape) -> np.ndarray:
    """Uniforms in [0, 1) of ``shape`` (``rng.random`` for a small array)."""
    if _size(shape) < MIN_ELEMENTS:
        return rng.random(shape)
    return uniform(rng, 0.0, 1.0, shape)


def integers_shaped(rng: np.random.Generator, below: int, shape) -> np.ndarray:
    """Integers in [0, below) of ``shape``."""
    n = _size(shape)
    if n < MIN_ELEMENTS or below >= 1 << 32:
        return rng.integers(0, below, size=shape)
    return integers(rng, below, n).reshape(_flat(shape))


def integers(rng: np.random.Generator, below: int, size: int) -> np.ndarray:
    """``size`` integers in [0, below) (intp)."""
    if size < MIN_ELEMENTS or below >= 1 << 32:
        return rng.integers(0, below, size=size)
    seed, k = seed_of(rng), kernel()
    if k is None:
        return numpy_indices(seed, size, below)
    out = np.empty(size, dtype=np.intp)
    k.indices(seed, below, out)
    return out


def resample(rng: np.random.Generator, src: np.ndarray, shape) -> np.ndarray:
    """Values of the flat ``src`` drawn with repetition into an array of ``shape``."""
    n = _size(shape)
    if n < MIN_ELEMENTS or src.size >= 1 << 32:
        return src[rng.integers(0, src.size, size=shape)]
    seed, k = seed_of(rng), kernel()
    if k is None:
        return src[numpy_indices(seed, n, src.size)].reshape(_flat(shape))
    out = np.empty(n, dtype=src.dtype)
    k.gather(seed, np.ascontiguousarray(src), out)
    return out.reshape(_flat(shape))


def choice(rng: np.random.Generator, values: np.ndarray, size: int) -> np.ndarray:
    """``size`` of ``values`` drawn with repetition."""
    if size < MIN_ELEMENTS:
        return rng.choice(values, size=size)
    return resample(rng, np.asarray(values), (size,))


def signed(rng: np.random.Generator, mags: np.ndarray) -> np.ndarray:
    """``mags`` with random signs."""
    if mags.size < MIN_ELEMENTS:
        return mags * rng.choice([-1.0, 1.0], size=mags.shape)
    seed, k = seed_of(rng), kernel()
    flat = np.ascontiguousarray(mags, dtype=np.float64).reshape(-1)
    if k is None:
        return numpy_signed(seed, flat).reshape(mags.shape)
    out = np.empty_like(flat)
    k.signed(seed, flat, out)
    return out.reshape(mags.shape)


def noise(rng: np.random.Generator, a: np.ndarray, rel: float) -> np.ndarray:
    """``a + rel * (|a| + 1e-12) * N(0, 1)`` elementwise (relative gaussian noise), one pass."""
    if a.size < MIN_ELEMENTS:
        step = np.abs(a)
        step += 1e-12
        step *= rng.standard_normal(a.shape)
        step *= rel
        step += a
        return step
    seed, k = seed_of(rng), kernel()
    flat = np.ascontiguousarray(a, dtype=np.float64).reshape(-1)
    if k is None:
        return numpy_noise(seed, flat, rel).reshape(a.shape)
    qd, tt = packed_tables()
    out = np.empty_like(flat)
    k.noise(seed, qd, tt, flat, float(rel), out)
    return out.reshape(a.shape)
