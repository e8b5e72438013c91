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


@numba.njit(cache=True, nogil=True)
def round_float32_twin(a, out, out32, ext):
    """:func:`round_float32`, and the float32 values themselves into ``out32`` (what the
    operator's float32 call is given: no second conversion of the candidate); ``ext`` as
    :func:`round_to`'s."""
    lo = np.inf
    hi = -np.inf
    nan = False
    for i in range(a.shape[0]):
        x = np.float32(a[i])
        out32[i] = x
        v = np.float64(x)
        out[i] = v
        nan |= v != v
        lo = min(lo, v)
        hi = max(hi, v)
    ext[0] = np.nan if nan else lo
    ext[1] = np.nan if nan else hi
