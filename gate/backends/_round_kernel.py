"""The compiled rounding loop of :func:`gate.backends.base.numpy_quantize` (this module imports
Numba; only ``gate.backends.base`` imports it, lazily, for large arrays).

NumPy rounds a float64 array to float16 at ~3 ns an element here and to bfloat16 (float32 first,
then the bits rounded to even: seven whole-array passes) at ~12 ns; a search evaluates one
candidate of a million elements many times a second, so those passes were 1.5-5x the operator's
own call. One loop does it in place of all of them, with the same arithmetic:

* float16: every finite value rounded to nearest, ties to even, on the grid of its binade
  (``ulp = 2^(max(e, emin) - (p - 1))``: x / ulp, a product by a power of two, is exact, ``rint`` rounds to even, the product is
  exact), beyond the largest finite value an infinity of its sign; NaN and infinities kept. That is
  a correctly rounded conversion from float64, as NumPy's ``astype(float16)`` (``npy_double_to_half``).
* bfloat16: the float64 value rounded to float32 first (the cast NumPy and the frameworks make),
  then that value rounded as above to 8 bits: the double rounding of ``numpy_quantize``, bit for bit.
* float32: the float32 cast and back.

``tests/test_round_kernel.py`` holds each to NumPy's path bit for bit on adversarial values (ties,
the subnormal range, the overflow boundary, ±0, NaN, ±inf)."""
import numba
import numpy as np

_EXP = np.uint64(0x7FF0000000000000)


@numba.njit(cache=True, nogil=True, inline="always")
def _pow2(e):
    """2.0 ** e for a normal float64 exponent ``e``."""
    return np.uint64((e + 1023) << 52).view(np.float64)


@numba.njit(cache=True, nogil=True, inline="always")
def _round(x, p, emin, big):
    """``x`` (finite or not) rounded to nearest even on a format of ``p`` bits and smallest normal
    exponent ``emin`` whose largest finite value is ``big``."""
    if not np.isfinite(x):
        return x
    e = np.int64((np.float64(x).view(np.uint64) & _EXP) >> np.uint64(52)) - 1023
    if e < emin:
        e = emin
    r = np.rint(x * _pow2(p - 1 - e)) * _pow2(e - (p - 1))  # both powers of two: exact
    if abs(r) > big:
        return np.inf if r > 0 else -np.inf
    return r


@numba.njit(cache=True, nogil=True)
def round_to(a, out, p, emin, big, via_float32, ext):
    """``out[i]`` = ``a[i]`` rounded (see the module); ``via_float32``: round to float32 first.
    ``ext``: the least and greatest rounded value (NaN both if one is NaN, as ``ndarray.min`` and
    ``max`` propagate it), taken in the same loop."""
    lo = np.inf
    hi = -np.inf
    nan = False
    for i in range(a.shape[0]):
        x = a[i]
        if via_float32:
            x = np.float64(np.float32(x))
        v = _round(x, p, emin, big)
        out[i] = v
        nan |= v != v
        lo = min(lo, v)
        hi = max(hi, v)
    ext[0] = np.nan if nan else lo
    ext[1] = np.nan if nan else hi


@numba.njit(cache=True, nogil=True)
def round_float32(a, out):
    for i in range(a.shape[0]):
        out[i] = np.float64(np.float32(a[i]))


#: order keys of float32 bit patterns (``b ^ ((b >> 31) & 0x7FFFFFFF)`` as int32): the integers
#: sort as the values do (-NaN < -inf < ... < -0 < +0 < ... < +inf < +NaN), so the least and the
#: greatest value are an integer minimum and maximum, which the compiler vectorises (a float
#: minimum that has to propagate NaN does not: ~0.45 ms of a million-element pass)
_KEY_POS_INF = np.int32(0x7F800000)
_KEY_NEG_INF = np.int32(-0x7F800001)
_MASK31 = np.int32(0x7FFFFFFF)


@numba.njit(cache=True, nogil=True, inline="always")
def _key(b):
    return b ^ ((b >> np.int32(31)) & _MASK31)


@numba.njit(cache=True, nogil=True, inline="always")
def _extremes_of_keys(n, mn, mx, ext):
    """``ext`` = the least and greatest float32 value of a pass whose least and greatest keys
    were ``mn`` and ``mx`` (NaN both if a key is a NaN's; +inf, -inf for no values, as the float
    reductions' start)."""
    if n == 0:
        ext[0] = np.inf
        ext[1] = -np.inf
    elif mx > _KEY_POS_INF or mn < _KEY_NEG_INF:
        ext[0] = np.nan
        ext[1] = np.nan
    else:
        ext[0] = np.float64(np.int32(_key(mn)).view(np.float32))  # the map is its own inverse
        ext[1] = np.float64(np.int32(_key(mx)).view(np.float32))


@numba.njit(cache=True, nogil=True)
def round_float32_twin(a, out, out32, ext):
    """:func:`round_float32`, and the float32 values themselves into ``out32`` (what the
    operator's float32 call is given: no second conversion of the candidate); ``ext`` as
    :func:`round_to`'s (a zero's sign aside: -0 is taken as below +0)."""
    mn = np.int32(0x7FFFFFFF)
    mx = np.int32(-0x80000000)
    bits = out32.view(np.int32)
    for i in range(a.shape[0]):
        x = np.float32(a[i])
        out32[i] = x
        out[i] = np.float64(x)
        k = _key(bits[i])
        mn = min(mn, k)
        mx = max(mx, k)
    _extremes_of_keys(a.shape[0], mn, mx, ext)


@numba.njit(cache=True, nogil=True)
def round_float32_twin_counts(a, out, out32, ext, t, g):
    """:func:`round_float32_twin`, and in the same pass ``g[j]`` = how many rounded magnitudes
    have a bit pattern at or above ``t[j]`` (eight int32 patterns of non-negative float32
    values): for a finite float32 magnitude ``m`` and a float64 threshold ``u > 0``,
    ``m >= u`` exactly when ``m >= c``, ``c`` the least float32 at or above ``u``, and
    non-negative float32 values order as their bit patterns do (a NaN's pattern lies above
    every threshold: the counts mean something only when every value is finite)."""
    mn = np.int32(0x7FFFFFFF)
    mx = np.int32(-0x80000000)
    bits = out32.view(np.int32)
    t0, t1, t2, t3, t4, t5, t6, t7 = t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7]
    g0 = g1 = g2 = g3 = g4 = g5 = g6 = g7 = 0
    for i in range(a.shape[0]):
        x = np.float32(a[i])
        out32[i] = x
        out[i] = np.float64(x)
        b = bits[i]
        k = _key(b)
        mn = min(mn, k)
        mx = max(mx, k)
        m = b & _MASK31
        g0 += m >= t0
        g1 += m >= t1
        g2 += m >= t2
        g3 += m >= t3
        g4 += m >= t4
        g5 += m >= t5
        g6 += m >= t6
        g7 += m >= t7
    _extremes_of_keys(a.shape[0], mn, mx, ext)
    g[0] = g0
    g[1] = g1
    g[2] = g2
    g[3] = g3
    g[4] = g4
    g[5] = g5
    g[6] = g6
    g[7] = g7
