"""The compiled rounding loop (gate/backends/_round_kernel.py) against NumPy's rounding it
replaces (gate.backends.base._quantize), bit for bit, on the values that break rounding code: ties
at every binade, the subnormal range of each format and its boundary with the normal range, the
overflow boundary (the largest finite value, the tie above it), float64 subnormals, ±0, NaN, ±inf,
and values far outside every format's range."""
import math

import numpy as np
import pytest

from gate.backends import base
from gate.backends.base import FLOAT_FORMATS, ROUND_KERNEL_MIN, kernel_quantize, numpy_quantize

kernel = base._round_kernel()
pytestmark = pytest.mark.skipif(kernel is None, reason="Numba is not installed: NumPy rounds every array")

DTYPES = ("float16", "bfloat16", "float32")


def adversarial(dtype: str, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    p, emin, emax = FLOAT_FORMATS[dtype]
    big = math.ldexp(2.0 - math.ldexp(1.0, 1 - p), emax)
    e = rng.integers(emin - p - 3, emax + 2, n)
    m = rng.integers(1 << (p - 1), 1 << p, n).astype(np.float64)
    grid = np.ldexp(m, e - (p - 1))                      # values of the format (and a binade beyond)
    half = np.ldexp(np.ones(n), np.maximum(e, emin) - p)  # half an ulp of each: the ties
    kind = rng.integers(0, 10, n)
    x = grid.copy()
    x[kind == 1] += half[kind == 1]                       # exact ties
    x[kind == 2] += half[kind == 2] * (1 + 2.0 ** -40)    # just above a tie
    x[kind == 3] -= half[kind == 3] * (1 + 2.0 ** -40)    # just below one
    x[kind == 4] = rng.standard_normal((kind == 4).sum()) * 10.0 ** rng.integers(-45, 45, (kind == 4).sum())
    special = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 5e-324, -2.2e-308, big, -big, big + half.max(),
                        math.ldexp(big, 1), 1e300, -1e300, math.ldexp(1.0, emin), math.ldexp(1.0, emin - p + 1),
                        math.ldexp(1.0, emin - p), math.ldexp(3.0, emin - p), 65520.0, 65519.99, 3.3895e38])
    x[kind == 5] = rng.choice(special, (kind == 5).sum())
    x[rng.random(n) < 0.5] *= -1
    return x


def same_bits(x: np.ndarray, y: np.ndarray) -> bool:
    """Equal to the bit, NaN (any payload) equal to NaN."""
    nx, ny = np.isnan(x), np.isnan(y)
    return bool((nx == ny).all() and (x[~nx].view(np.uint64) == y[~ny].view(np.uint64)).all())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", range(4))
def test_kernel_rounds_as_numpy(dtype, seed):
    x = adversarial(dtype, 200_000, seed)
    with np.errstate(over="ignore", invalid="ignore"):
        want = base._quantize(x, dtype)
    got = kernel_quantize(kernel, x, dtype)
    bad = np.flatnonzero(~((got == want) | (np.isnan(got) & np.isnan(want))))
    assert bad.size == 0, [(float(x[i]), float(want[i]), float(got[i])) for i in bad[:5]]
    assert same_bits(got, want)


def test_large_arrays_take_the_kernel_and_keep_their_shape():
    x = adversarial("float16", 4 * ROUND_KERNEL_MIN, 9).reshape(4, -1)
    q = numpy_quantize(x, "float16")
    assert q.shape == x.shape and q.dtype == np.float64
    with np.errstate(over="ignore", invalid="ignore"):
        assert same_bits(q.reshape(-1), x.astype(np.float16).astype(np.float64).reshape(-1))


def test_float32_rounding_hands_its_float32_values_to_the_next_float32_call_once():
    """torch's backend rounds a large array to float32 in one pass that also keeps the float32
    values; the first float32 call of that very array is given them (no second conversion), a
    later one converts again (a tensor of its own)."""
    torch = pytest.importorskip("torch")
    from gate.backends import get_backend

    b = get_backend("torch")
    x = adversarial("float32", 1 << 16, 5).reshape(256, 256)
    with np.errstate(over="ignore", invalid="ignore"):
        want = base._quantize(x, "float32")
    q = b.quantize(x, "float32")
    assert same_bits(q, want) and q.shape == x.shape
    assert b._twin[0] is not None and b._twin[0]() is q
    assert b._take_twin(q.copy()) is None  # another array of the same values: not this one's
    t64 = b.to_native(q, "float64", "cpu")  # the reference's call: no float32 values
    t1 = b.to_native(q, "float32", "cpu")
    assert b._twin == (None, None)
    t2 = b.to_native(q, "float32", "cpu")
    assert t1.dtype == t2.dtype == torch.float32 and t1.shape == t2.shape == x.shape
    assert t1.data_ptr() != t2.data_ptr()
    assert same_bits(t1.numpy().astype(np.float64), want) and torch.equal(t1.nan_to_num(0.0), t2.nan_to_num(0.0))
    assert same_bits(t64.numpy(), want)


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_rounding_loop_takes_the_extremes_as_it_goes(dtype):
    # what quantize_inputs reads next (two reductions of a million elements a candidate before)
    from gate.backends.base import float32_twin, known_extremes

    for seed, nan in ((0, False), (1, True)):
        x = adversarial(dtype, ROUND_KERNEL_MIN + 5, seed)
        x = np.where(np.isnan(x), 1.0, x) if not nan else x
        q = float32_twin(x)[0] if dtype == "float32" else numpy_quantize(x, dtype)
        lo, hi = known_extremes(q)
        if nan:
            assert math.isnan(lo) and math.isnan(hi)
        else:
            assert (lo, hi) == (float(q.min()), float(q.max())), (lo, hi, q.min(), q.max())
        assert known_extremes(q.copy()) is None  # another array: not known
