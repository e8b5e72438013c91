"""The compiled loops of :mod:`gate.search.randoms` (this module imports Numba; only
``gate.search.randoms`` imports it, lazily, for arrays of 32768+ elements).

Each loop computes, element by element, what the NumPy path of ``gate.search.randoms`` computes
in whole-array passes, with the same operations in the same order (no ``fastmath``: no fused
multiply-add, so the values are the same bit for bit; ``tests/test_search_randoms.py``)."""
import numba
import numpy as np

GAMMA = np.uint64(0x9E3779B97F4A7C15)
C1 = np.uint64(0xBF58476D1CE4E5B9)
C2 = np.uint64(0x94D049BB133111EB)
S11 = np.uint64(11)
S16 = np.uint64(16)
S27 = np.uint64(27)
S30 = np.uint64(30)
S31 = np.uint64(31)
S32 = np.uint64(32)
S48 = np.uint64(48)
ONE = np.uint64(1)
M16 = np.uint64(0xFFFF)
M32 = np.uint64(0xFFFFFFFF)
TOP = np.uint64(65535)
ZERO = np.uint64(0)
SCALE16 = 2.0 ** -16
SCALE32 = 2.0 ** -32
SCALE53 = 2.0 ** -53


@numba.njit(cache=True, nogil=True, inline="always")
def _mix(seed, i):
    z = seed + np.uint64(i + 1) * GAMMA
    z = (z ^ (z >> S30)) * C1
    z = (z ^ (z >> S27)) * C2
    return z ^ (z >> S31)


@numba.njit(cache=True, nogil=True, inline="always")
def _normal(z, qd, tt):
    """gate.search.randoms.normal_of of one value, from the interleaved tables (packed_tables)."""
    j = z >> S48
    if j != ZERO and j != TOP:
        f = (np.float64((z >> S16) & M32) + 0.5) * SCALE32
        jj = np.intp(j) * 2
        return qd[jj + 1] * f + qd[jj]
    m = np.intp((z >> S32) & M16) * 2
    u = (np.float64((z >> S16) & M16) + 0.5) * SCALE16
    v = tt[m + 1] * u + tt[m]
    return v if j == ZERO else -v


@numba.njit(cache=True, nogil=True)
def normals(seed, qd, tt, out):
    for i in range(out.shape[0]):
        out[i] = _normal(_mix(seed, i), qd, tt)


@numba.njit(cache=True, nogil=True)
def noise(seed, qd, tt, a, rel, out):
    """``out[i] = ((|a[i]| + 1e-12) * normal_i) * rel + a[i]``."""
    for i in range(out.shape[0]):
        x = a[i]
        out[i] = ((abs(x) + 1e-12) * _normal(_mix(seed, i), qd, tt)) * rel + x


@numba.njit(cache=True, nogil=True)
def uniforms(seed, lo, hi, out):
    w = hi - lo
    for i in range(out.shape[0]):
        out[i] = ((np.float64(_mix(seed, i) >> S11) + 0.5) * SCALE53) * w + lo


@numba.njit(cache=True, nogil=True)
def indices(seed, below, out):
    b = np.uint64(below)
    for i in range(out.shape[0]):
        out[i] = np.intp(((_mix(seed, i) >> S32) * b) >> S32)


@numba.njit(cache=True, nogil=True)
def gather(seed, src, out):
    b = np.uint64(src.shape[0])
    for i in range(out.shape[0]):
        out[i] = src[np.intp(((_mix(seed, i) >> S32) * b) >> S32)]


@numba.njit(cache=True, nogil=True)
def signed(seed, mags, out):
    for i in range(out.shape[0]):
        x = mags[i]
        out[i] = -x if (_mix(seed, i) & ONE) else x
