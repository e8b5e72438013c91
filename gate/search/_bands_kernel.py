"""The compiled loop of :func:`gate.search.coverage.value_features` (this module imports Numba;
only ``gate.search.coverage`` imports it, lazily, for tensors of 32768+ elements).

For a tensor whose values are all finite (two NumPy reductions tell), the value bands its
magnitudes fall in come from one loop that counts, for each band edge, the magnitudes at or above
it (a band's count is the difference of two): eight counters and no branch, which the compiler
vectorises; the NumPy path takes |x| once and then one comparison pass per band between the
smallest and the largest magnitude and two or three for the band near one. Every value is
finite here, so ``fastmath`` (which assumes it) holds; tensors with NaN/Inf keep the NumPy path.
``tests/test_search_coverage.py`` holds the classes it gives to the NumPy path's."""
import numba
import numpy as np


@numba.njit(cache=True, nogil=True, fastmath=True)
def at_or_above(a, t0, t1, t2, t3, t4, t5, t6, t7):
    """How many |a[i]| are >= each of the eight thresholds (``a`` finite)."""
    g0 = g1 = g2 = g3 = g4 = g5 = g6 = g7 = 0
    for i in range(a.shape[0]):
        m = abs(a[i])
        g0 += np.int64(m >= t0)
        g1 += np.int64(m >= t1)
        g2 += np.int64(m >= t2)
        g3 += np.int64(m >= t3)
        g4 += np.int64(m >= t4)
        g5 += np.int64(m >= t5)
        g6 += np.int64(m >= t6)
        g7 += np.int64(m >= t7)
    return g0, g1, g2, g3, g4, g5, g6, g7
