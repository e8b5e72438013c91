"""The compiled loops of :mod:`gate.oracles.fused` (this module imports Numba; only
``gate.oracles.fused`` imports it, lazily). Module-level functions, so that Numba's on-disk cache
(``cache=True``) keeps the machine code between processes; no recursion (Numba's cache does not
keep recursive functions safely: a cached one crashed the next process).

One traversal (:func:`traverse`) visits the output in NumPy's pairwise order: blocks above 128
elements are halved at a multiple of 8, a block of at most 128 is summed in eight lanes (element
i into lane i mod 8), the lanes combined as a tree, the remainder added in order
(numpy/_core/src/umath/loops_utils.h.src, ``pairwise_sum``); so both sums are NumPy's bit for
bit. Each block is scored by one of two leaves:

* the all-finite leaf (:func:`finite_leaf`): what almost every block is. One loop with no branch
  and no reduction (vectorised: errors, ulp errors as products by exact inverse powers of two,
  magnitudes, into scratch of 128), then the sums in NumPy's eight lanes and the maxima and
  minima as integer maxima of the bit patterns (exact in any order, and vectorised where a float
  maximum is not; their results are used only when the sums say every error was finite); where
  the block holds a new maximum, only that block is scanned again for its first index
  (np.argmax's).
* the general leaf (:func:`general_leaf`), for a block that holds a NaN/Inf, a reference beyond
  the dtype's range, or (with a flush to zero) one below its smallest normal number: element by
  element, with every rule of :func:`gate.oracles.precision._slow_errors`. Its counts tell the
  caller whether NumPy would have taken its all-finite branch for the whole output (the figures
  are the same; what differs is which of them ``compare`` reads).

A few NaN/Inf in a million-element output so cost a few blocks, not a second pass over all of it
(the all-finite pass that gave up at the first NaN and began again element by element took 7x
as long as the clean output did)."""
import math

import numba
import numpy as np

_NN = {"nnan", "nsz"}  # the same, where an infinity may occur (an error between two huge float64 values)
_EXP = np.uint64(0x7FF0000000000000)


@numba.njit(cache=True, nogil=True)
def _scales(p, emin, emax):
    """(2^-(p-1), the smallest ulp, the largest ulp) of a format of p bits and exponents emin..:
    above the format's range the ulp goes on growing (gate.search.score.ulp), up to float64's."""
    return math.ldexp(1.0, -(p - 1)), math.ldexp(1.0, emin - (p - 1)), math.ldexp(1.0, 1023 - (p - 1))


@numba.njit(cache=True, nogil=True)
def _tree8(r):
    """NumPy's combination of its eight pairwise lanes."""
    return ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))


@numba.njit(cache=True, nogil=True)
def ulp_of(bi, scl, lo_ulp, hi_ulp):
    """gate.search.score.ulp of one value: its exponent bits as 2^e, scaled by 2^-(p-1), bounded
    (0 and subnormals: the dtype's smallest; inf and NaN: float64's largest exponent's)."""
    bits = np.float64(bi).view(np.uint64) & _EXP
    return min(max(np.uint64(bits).view(np.float64) * scl, lo_ulp), hi_ulp)


@numba.njit(cache=True, nogil=True)
def _u(e, bi, by_dtype, scl, lo_ulp, hi_ulp):
    return e / ulp_of(bi, scl, lo_ulp, hi_ulp) if by_dtype else 0.0


@numba.njit(cache=True, nogil=True)
def _bits_max(v, n):
    """The largest of the non-negative float64 values ``v[:n]`` (0.0 for n = 0), compared as
    their bit patterns: for values >= +0 the order of the patterns is the order of the values,
    and an integer maximum is vectorised where a float one, with NaN to respect, is not (a NaN
    pattern is above +inf: a block holding one is not read, its sums are not finite)."""
    w = v.view(np.int64)
    r = np.int64(0)
    for t in range(n):
        r = max(r, w[t])
    return np.int64(r).view(np.float64)


@numba.njit(cache=True, nogil=True)
def _bits_min(v, n):
    """The least of the non-negative float64 values ``v[:n]`` (+inf for n = 0), as :func:`_bits_max`."""
    w = v.view(np.int64)
    r = np.int64(0x7FF0000000000000)
    for t in range(n):
        r = min(r, w[t])
    return np.int64(r).view(np.float64)


@numba.njit(cache=True, nogil=True)
def finite_leaf(a, b, lo, n, by_dtype, p, emin, sums, e, q, x):
    """(sum err, sum ulp err, max err, max ulp err, max |b|, min |b|) of one block (the sums 0.0
    unless ``sums``), through the
    scratch ``e``, ``q``, ``x`` (errors, ulp errors, magnitudes; 128 each): first one loop with
    no branch and no reduction, which the compiler vectorises; then the sums in NumPy's eight
    lanes (:func:`lane_sum`) and the maxima as integer maxima of the bit patterns.

    The error in ulps is the error times 2^((p-1) - k), k the reference's exponent clamped to
    [emin, 1023] (the exponent of ``ulp_of``'s value, a power of two): a product by the exact
    inverse of a power of two is the quotient, rounded once from the same real number, so the
    figures are ``e / ulp_of(b)``'s bit for bit, without a division an element (2^((p-1) - emin)
    is a normal float64 for the 16- and 32-bit formats the kernel scores in, fused.DTYPES)."""
    av = a[lo:lo + n]
    bv = b[lo:lo + n]
    for t in range(n):
        bt = bv[t]
        e[t] = abs(np.float64(av[t]) - bt)
        x[t] = abs(bt)
    s2 = 0.0
    mu = 0.0
    if by_dtype:
        bu = b.view(np.uint64)[lo:lo + n]
        for t in range(n):
            k = min(max(np.int64((bu[t] >> np.uint64(52)) & np.uint64(0x7FF)) - 1023, emin), 1023)
            q[t] = e[t] * np.uint64((p - 1 - k + 1023) << 52).view(np.float64)
        s2 = lane_sum(q, n) if sums else 0.0
        mu = _bits_max(q, n)
    s1 = lane_sum(e, n) if sums else 0.0
    return s1, s2, _bits_max(e, n), mu, _bits_max(x, n), _bits_min(x, n)


@numba.njit(cache=True, nogil=True)
def lane_sum(e, n):
    """NumPy's pairwise sum of the block ``e[:n]`` (``n`` <= 128): eight lanes (element t into
    lane t mod 8, each lane from 0.0), combined as a tree, then the remainder in order."""
    m = 0 if n < 8 else n - n % 8
    r0 = r1 = r2 = r3 = r4 = r5 = r6 = r7 = 0.0
    for g in range(0, m, 8):
        r0 += e[g]
        r1 += e[g + 1]
        r2 += e[g + 2]
        r3 += e[g + 3]
        r4 += e[g + 4]
        r5 += e[g + 5]
        r6 += e[g + 6]
        r7 += e[g + 7]
    s = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7)) if m else 0.0
    for t in range(m, n):
        s += e[t]
    return s


@numba.njit(cache=True, nogil=True, fastmath=_NN)
def _max_nn(x, y):
    return x if x > y else y


@numba.njit(cache=True, nogil=True, fastmath=_NN)
def _block_max(v, n):
    """The largest of ``v[:n]`` (never NaN; 0.0 for n = 0), in any order (exact): eight lanes,
    which the compiler keeps in vector registers."""
    m0 = m1 = m2 = m3 = m4 = m5 = m6 = m7 = 0.0
    m = n - n % 8
    for g in range(0, m, 8):
        m0 = _max_nn(m0, v[g])
        m1 = _max_nn(m1, v[g + 1])
        m2 = _max_nn(m2, v[g + 2])
        m3 = _max_nn(m3, v[g + 3])
        m4 = _max_nn(m4, v[g + 4])
        m5 = _max_nn(m5, v[g + 5])
        m6 = _max_nn(m6, v[g + 6])
        m7 = _max_nn(m7, v[g + 7])
    r = _max_nn(_max_nn(_max_nn(m0, m1), _max_nn(m2, m3)), _max_nn(_max_nn(m4, m5), _max_nn(m6, m7)))
    for t in range(m, n):
        r = _max_nn(r, v[t])
    return r


@numba.njit(cache=True, nogil=True)
def _first(v, n, target):
    """The first t < n with v[t] == target (0 when none)."""
    for t in range(n):
        if v[t] == target:
            return t
    return 0


@numba.njit(cache=True, nogil=True)
def general_leaf(a, b, lo, n, ovf, mn, ftz, by_dtype, sums, scl, lo_ulp, hi_ulp, st, it, r, q, w):
    """Both sums of one block by every rule of the NumPy path's general branch; the block's
    maxima (first index), NaN/Inf count, largest representable |b| and judged counts are merged
    into ``st``/``it`` once (blocks come in order: strict > keeps the first). ``r``, ``q``, ``w``:
    scratch of 128 for the block's errors, ulp errors and representable magnitudes (reused from
    block to block): the rules are applied element by element first, then the sums and maxima
    taken over the scratch in loops without branches on the data (maxima in eight lanes, then
    the first index of the block's largest only where it beats the running one: as a scan that
    keeps the first strictly greater value finds it). Also counted, for the caller to tell which
    branch NumPy would have taken: non-finite outputs (``it[5]``), references NaN, infinite or
    beyond the range (``it[6]``), and elements both below the smallest normal number that differ
    (``it[7]``: a flush to zero changes their error)."""
    counts = np.int64(0)  # six counts of at most 128, eight bits each: one sum, not six
    # bitwise & ~ on booleans (~ is a logical not on a boolean in Numba): no short-circuit, no
    # branch on the data (outputs here mix NaN/Inf, tiny and normal values at random); no float
    # reduction either (a running maximum kept this loop from being vectorised: 8 ns an element)
    for t in range(n):
        i = lo + t
        ai = np.float64(a[i])
        bi = b[i]
        absa, absb = abs(ai), abs(bi)
        rep = absb < ovf  # False for NaN
        fin_a = absa < np.inf
        fin_b = absb < np.inf
        tiny = ftz & (absb < mn) & (absa < mn)  # a flush to zero: not judged
        judged = fin_a & fin_b & ~tiny
        counts += (np.int64(rep & ~fin_a) | (np.int64(~rep) << 8) | (np.int64(~fin_a) << 16)
                   | (np.int64(tiny & (ai != bi)) << 24) | (np.int64(judged) << 32) | (np.int64(judged & ~rep) << 40))
        w[t] = absb if rep else 0.0  # the largest representable |b|: a maximum of these, from 0
        d = abs(ai - bi)
        r[t] = d if judged else 0.0
    s1 = lane_sum(r, n) if sums else 0.0
    s2 = 0.0
    if by_dtype:  # a loop of its own (in the one above, a select divided for every element)
        for t in range(n):
            q[t] = r[t] / ulp_of(b[lo + t], scl, lo_ulp, hi_ulp)
        s2 = lane_sum(q, n) if sums else 0.0
    # r, q and w hold no NaN (an error is taken only between finite values, 0.0 elsewhere)
    e_max = _block_max(r, n)
    if e_max > st[0]:
        st[0] = e_max
        it[0] = lo + _first(r, n, e_max)
    if by_dtype:
        u_max = _block_max(q, n)
        if u_max > st[1]:
            st[1] = u_max
            it[1] = lo + _first(q, n, u_max)
    st[2] = max(st[2], _block_max(w, n))
    it[2] += counts & 255  # NaN/Inf outputs where the reference is representable
    it[3] += (counts >> 32) & 255  # judged
    it[4] += (counts >> 40) & 255  # judged, the reference beyond the range
    it[5] += (counts >> 16) & 255  # non-finite outputs
    it[6] += (counts >> 8) & 255  # references NaN, infinite or beyond the range
    it[7] += (counts >> 24) & 255  # elements a flush to zero changes
    return s1, s2


@numba.njit(cache=True, nogil=True)
def traverse(a, b, ovf, mn, ftz, by_dtype, p, emin, emax, sums, st, it):
    """Both pairwise sums over the whole output (an explicit stack, not recursion), block by
    block. ``st`` = [max err, max ulp err, max representable |b|], ``it`` = [index of the max
    err, index of the max ulp err, NaN/Inf outputs where the reference is representable, judged
    elements, judged elements whose reference is beyond the range, non-finite outputs,
    references NaN/Inf or beyond the range, elements a flush to zero changes] (the last three
    are 0 when NumPy would take its all-finite branch)."""
    scl, lo_ulp, hi_ulp = _scales(p, emin, emax)
    r = np.zeros(128)
    q = np.zeros(128)
    w = np.zeros(128)
    x = np.zeros(128)
    st[0] = -1.0
    st[1] = -1.0
    st[2] = 0.0
    los = np.zeros(128, dtype=np.int64)
    ns = np.zeros(128, dtype=np.int64)
    phase = np.zeros(128, dtype=np.int64)
    v1 = np.zeros(128)
    v2 = np.zeros(128)
    sp = 1
    vp = 0
    ns[0] = a.shape[0]
    while sp > 0:
        top = sp - 1
        lo = los[top]
        n = ns[top]
        if n <= 128:
            # a block with every value finite and in range, and nothing a flush would change,
            # is scored by the all-finite leaf (the same figures); only the others element by
            # element with every rule (a few NaN/Inf in a large output cost a few blocks)
            s1, s2, mx, mu, mb, nb = finite_leaf(a, b, lo, n, by_dtype, p, emin, sums, r, q, x)
            # with a flush to zero, elements both below the smallest normal number are not
            # judged (an error of 0): the same figures as the all-finite leaf's where each such
            # output equals its reference (zeros on both sides, an exact tiny result)
            tiny = flushed_equal(a, b, lo, n, mn) if (ftz and nb < mn) else 0
            # every error and ulp error finite (a NaN's bit pattern is above +inf's: its maximum
            # compares False), every reference in range, nothing a flush changes
            if mx < np.inf and mu < np.inf and mb < ovf and tiny >= 0:
                if mx > st[0]:  # blocks come in order: strict > keeps the first
                    st[0] = mx
                    it[0] = first_index(a, b, lo, mx, False, p, emin, emax)
                if by_dtype and mu > st[1]:
                    st[1] = mu
                    it[1] = first_index(a, b, lo, mu, True, p, emin, emax)
                st[2] = max(st[2], mb)
                it[3] += n - tiny
            else:
                s1, s2 = general_leaf(a, b, lo, n, ovf, mn, ftz, by_dtype, sums, scl, lo_ulp, hi_ulp, st, it, r, q, w)
            sp -= 1
            v1[vp] = s1
            v2[vp] = s2
            vp += 1
            continue
        n2 = n // 2
        n2 -= n2 % 8
        if phase[top] == 0:
            phase[top] = 1
            los[sp], ns[sp], phase[sp] = lo, n2, 0
            sp += 1
        elif phase[top] == 1:
            phase[top] = 2
            los[sp], ns[sp], phase[sp] = lo + n2, n - n2, 0
            sp += 1
        else:
            sp -= 1
            vp -= 1
            v1[vp - 1] = v1[vp - 1] + v1[vp]
            v2[vp - 1] = v2[vp - 1] + v2[vp]
    return v1[0], v2[0]


@numba.njit(cache=True, nogil=True)
def flushed_equal(a, b, lo, n, mn):
    """Elements of the block ``lo:lo+n`` whose output and reference are both below ``mn`` (a
    flush to zero leaves them unjudged), or -1 when one of them differs (the flush changes its
    error: the block takes the general leaf)."""
    k = 0
    for i in range(lo, lo + n):
        ai, bi = a[i], b[i]
        if abs(bi) < mn and abs(ai) < mn:
            if ai != bi:
                return -1
            k += 1
    return k


@numba.njit(cache=True, nogil=True)
def first_index(a, b, lo, target, by_dtype, p, emin, emax):
    """The first element from ``lo`` whose error (ulp error with ``by_dtype``) is ``target``."""
    scl, lo_ulp, hi_ulp = _scales(p, emin, emax)
    for i in range(lo, a.shape[0]):
        e = abs(a[i] - b[i])
        if (_u(e, b[i], True, scl, lo_ulp, hi_ulp) if by_dtype else e) == target:
            return i
    return lo


@numba.njit(cache=True, nogil=True)
def beyond_max(a, b, ovf, mn, ftz, floor, p, emin, emax):
    """(the largest ulp error, its first index) of an output with ``ulp_floor='output'`` some of
    whose judged references are beyond the dtype's range, as NumPy's path takes them
    (gate.oracles.precision._slow_errors): every judged error over ``floor``, an error whose
    reference is beyond the range over the larger of its own ulp and ``floor``; 0 where an
    element is not judged (a NaN/Inf on either side, or a flush to zero)."""
    scl, lo_ulp, hi_ulp = _scales(p, emin, emax)
    best = -1.0
    idx = 0
    for i in range(a.shape[0]):
        ai = np.float64(a[i])
        bi = b[i]
        absa, absb = abs(ai), abs(bi)
        judged = (absa < np.inf) & (absb < np.inf) & ~(ftz & (absb < mn) & (absa < mn))
        if not judged:
            u = 0.0 / floor
        elif absb < ovf:
            u = abs(ai - bi) / floor
        else:
            u = abs(ai - bi) / max(ulp_of(bi, scl, lo_ulp, hi_ulp), floor)
        if u > best:
            best = u
            idx = i
    return best, idx
