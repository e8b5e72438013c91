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


def test_the_float32_rounding_counts_magnitudes_at_registered_thresholds():
    """With thresholds registered (gate.search.coverage registers its value bands' edges), the
    float32 rounding pass counts how many rounded magnitudes are at or above each, as NumPy counts
    them on the rounded values: thresholds that are float32 values, between two of them, below
    the smallest subnormal's half, at and beyond the largest finite value; ±0, subnormals, ties,
    values that overflow to an infinity."""
    from gate.backends.base import count_magnitudes_at, float32_twin, known_counts, known_extremes

    f32 = np.finfo(np.float32)
    edges = (float(f32.smallest_subnormal), float(f32.tiny), 1e-3, 1e4, float(f32.max) / 2, float(f32.max),
             1.0 - 4 * float(f32.eps), 1.0 + 4 * float(f32.eps))
    others = (1e-46, float(np.nextafter(np.float32(1e-3), np.float32(1))), 0.1, 1.0, 3.0, 1e38, 3.5e38, 1e300)
    try:
        for thresholds in (edges, others):
            count_magnitudes_at("float32", thresholds)
            for seed in range(3):
                x = adversarial("float32", ROUND_KERNEL_MIN + 17, seed)
                finite = np.where(np.isfinite(x) & (np.abs(x) < 3.4e38), x, -0.0)
                for a in (x, finite):
                    q, q32 = float32_twin(a)
                    with np.errstate(over="ignore", invalid="ignore"):
                        assert same_bits(q, base._quantize(a, "float32"))
                    m = np.abs(q)
                    want = tuple(int(np.count_nonzero(m >= t)) for t in thresholds)
                    got = known_counts(q, thresholds)
                    if a is finite:
                        assert got == want, (thresholds, got, want)
                        assert known_extremes(q) == (float(q.min()), float(q.max()))
                    else:
                        assert got is not None and math.isnan(known_extremes(q)[0])
                    assert known_counts(q, edges if thresholds is others else others) is None
                    assert known_counts(q.copy(), thresholds) is None
        count_magnitudes_at("float32", None)
        q, _ = float32_twin(adversarial("float32", ROUND_KERNEL_MIN, 7))
        assert known_counts(q, others) is None  # nothing registered: extremes only
    finally:
        count_magnitudes_at("float32", None)


def test_extremes_of_zeros_infinities_and_nans_of_either_sign():
    """The float32 pass takes its extremes as integers (bit patterns in the values' order): ±0,
    ±inf, either NaN sign, one value, a tie of the least and the greatest."""
    from gate.backends.base import float32_twin, known_extremes

    n = ROUND_KERNEL_MIN
    for vals, want in (([0.0, -0.0], (0.0, 0.0)), ([np.inf, 1.0], (1.0, np.inf)), ([-np.inf, 1.0], (-np.inf, 1.0)),
                       ([-np.inf, np.inf], (-np.inf, np.inf)), ([5.0], (5.0, 5.0)), ([-1e-45, 1e-45], (-1e-45, 1e-45)),
                       ([1e39, -1e39], (-np.inf, np.inf)), ([3.0, -2.0, 7.0, -2.0], (-2.0, 7.0))):
        a = np.resize(np.array(vals, dtype=np.float64), n)
        q, _ = float32_twin(a)
        assert known_extremes(q) == (float(q.min()), float(q.max())) == tuple(float(np.float32(w)) for w in want)
    for nan in (np.nan, -np.nan, np.float64(np.uint64(0xFFF8000000000001).view(np.float64))):
        a = np.ones(n)
        a[n // 2] = nan
        q, _ = float32_twin(a)
        lo, hi = known_extremes(q)
        assert math.isnan(lo) and math.isnan(hi)
