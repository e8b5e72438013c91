"""The search stays inside what a variant can represent (issue 31): a value domain is
intersected with the dtype's finite range. A ``real`` input drawn at scale 1e6 for a float16
variant was cast to +-inf, and NaN from inf - inf on it counted as "new NaN" against a benign
refactor; now such draws are clipped to +-65504 before the cast. Exhaustive sets (every value of
the dtype, inf and NaN included, on purpose) are left as they are."""
from __future__ import annotations

import numpy as np
import pytest

from gate.backends import get_backend
from gate.fuzz import fuzz_task
from gate.ops.catalog import load_catalog
from gate.oracles.runner import quantize_inputs, within_dtype, within_spread
from gate.ops.spec import Domain
from gate.plan import Budget, Task, Variant
from gate.search.inputs import Candidate

from tests.oracle_support import user_ops


@pytest.mark.parametrize("dtype,big", [("float16", 65504.0), ("bfloat16", 3.3895313892515355e38),
                                       ("float32", 3.4028234663852886e38)])
def test_finite_values_beyond_the_dtype_are_its_largest_finite_value(dtype, big):
    a = np.array([-8e5, 1.5, 7e4, -1e39, 1e300, np.inf, np.nan])
    out = within_dtype(a, dtype)
    expect_clip = np.abs(a) > big
    fin = np.isfinite(a)
    assert np.array_equal(out[fin & expect_clip], np.sign(a[fin & expect_clip]) * big)
    assert np.array_equal(out[fin & ~expect_clip], a[fin & ~expect_clip])
    assert np.isposinf(out[5]) and np.isnan(out[6])  # a non-finite value the row put there stays


def test_quantized_inputs_of_a_float16_variant_hold_no_infinity_the_row_did_not_ask_for():
    spec = load_catalog([], builtin=("torch",)).get("torch.tanh")
    backend = get_backend("torch")
    cand = Candidate(dims={}, params={}, arrays={spec.inputs[0].name: np.array([-8e5, 3.0, 1e5, 65519.0, 65520.0])})
    q = quantize_inputs(spec, backend, cand, "float16").arrays[spec.inputs[0].name]
    # clipped to +-65504, then (spanning twice the range) halved: see the spread tests below
    assert np.isfinite(q).all() and q.max() == 32752.0 and q.min() == -32752.0 and q[1] == 1.5
    one_sided = Candidate(dims={}, params={}, arrays={spec.inputs[0].name: np.array([3.0, 1e5, 65519.0])})
    q = quantize_inputs(spec, backend, one_sided, "float16").arrays[spec.inputs[0].name]
    assert np.isfinite(q).all() and q.max() == 65504.0 and q.min() == 3.0
    sweep = Candidate(dims={}, params={}, arrays={spec.inputs[0].name: np.array([np.inf, 1e5])}, origin="exhaustive")
    assert np.isinf(quantize_inputs(spec, backend, sweep, "float16").arrays[spec.inputs[0].name]).all()


OPS = """
- name: planted.wide
  callable: torch:tanh
  dims: {N: [1, 16]}
  inputs: [{name: x, shape: [N], domain: {name: real, scale: 1000000.0}}]
  dtypes: [float16]
  modes: [input]
"""


def test_a_search_on_a_wide_domain_never_feeds_float16_an_infinity(tmp_path):
    spec = user_ops(tmp_path, OPS)["planted.wide"]
    seen = []
    f = fuzz_task(Task(op=spec, variant=Variant("float16"), budget=Budget(evals=60), seed=0),
                  on_best=lambda q, ev, fit: seen.append(q.arrays["x"].copy()))
    assert f.evals == 60 and seen and f.best is not None
    for x in seen + [f.best.arrays["x"]]:
        assert np.isfinite(x).all() and np.abs(x).max() <= 65504.0, x


def _same_bits(x, y) -> bool:
    nx, ny = np.isnan(x), np.isnan(y)
    return bool((nx == ny).all() and (x[~nx].view(np.uint64) == y[~ny].view(np.uint64)).all())


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_rounding_first_gives_the_values_of_the_range_check_then_rounding(dtype):
    """quantize_inputs rounds first and checks the range only where the rounded values are not
    all finite (rounding is monotone: a finite value beyond the range rounds to the largest finite
    value, as its clipped value does, or to an infinity): the values are those of clipping first."""
    from gate.oracles.runner import _rounded_within

    backend = get_backend("torch")
    rng = np.random.default_rng(7)
    big = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38, "float32": 3.4028234663852886e38,
           "float64": 1.7976931348623157e308}[dtype]
    specials = np.array([big, -big, big * (1 + 2.0 ** -12), -big * (1 + 2.0 ** -9), big * 2, 1e300, -1e300,
                         np.inf, -np.inf, np.nan, 0.0, -0.0, 5e-324, 65519.0, 65520.0, 3.3961e38, 3.41e38])
    for n in (5, 1 << 15, 40_000):
        for mix in ("normal", "beyond", "beyond, rounds to big", "nonfinite"):
            a = rng.standard_normal(n) * 10.0 ** rng.integers(-3, 3, n)
            k = rng.integers(0, n, max(1, n // 100))
            if mix == "beyond":
                a[k] = rng.choice(specials[:7], k.size)
            elif mix == "beyond, rounds to big":
                a[k] = big * (1 + 2.0 ** -30) * rng.choice([-1.0, 1.0], k.size)
            elif mix == "nonfinite":
                a[k] = rng.choice(specials, k.size)
            with np.errstate(all="ignore"):
                want = backend.quantize(within_dtype(a, dtype), dtype)
                got, extremes = _rounded_within(backend, a, dtype)
            assert _same_bits(got, want), (n, mix)
            if extremes is not None:
                assert dtype != "float64" and np.isfinite(got).all() and extremes == (got.min(), got.max())


def test_a_large_quantized_input_hands_its_extremes_to_coverage():
    """Rounding a large input reads its least and greatest rounded values (the range check);
    coverage's value features of that very array take them from there, and give the classes of
    its own passes."""
    from gate.search import coverage

    spec = load_catalog([], builtin=("torch",)).get("torch.tanh")
    backend = get_backend("torch")
    name = spec.inputs[0].name
    rng = np.random.default_rng(3)
    for dtype in ("float16", "bfloat16", "float32"):
        for a in (rng.standard_normal(1 << 16), -np.abs(rng.standard_normal(1 << 16)) * 1e-3 - 7.0,
                  np.full(1 << 16, 2.5), rng.standard_normal(1 << 16) * 1e-42):
            q = quantize_inputs(spec, backend, Candidate(dims={}, params={}, arrays={name: a}), dtype).arrays[name]
            assert coverage._remembered(q, dtype) == (float(q.min()), float(q.max()))
            assert coverage._remembered(q.copy(), dtype) is None and coverage._remembered(q, "float64") is None
            assert coverage.value_features(q, dtype) == coverage.value_features(q, dtype, kernel="numpy")
        nan = rng.standard_normal(1 << 16)
        nan[5] = np.nan
        q = quantize_inputs(spec, backend, Candidate(dims={}, params={}, arrays={name: nan}), dtype).arrays[name]
        assert coverage._remembered(q, dtype) is None  # not all finite: coverage reads it itself
        assert "nonfinite" in coverage.value_features(q, dtype)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_an_input_spanning_more_than_the_range_is_halved_until_its_differences_are_representable(dtype):
    """kornia's focal loss fix (b8f341163, log(softmax(x) + eps) -> log_softmax(x)) failed as a
    "new NaN" on logits [0, 2e38, -2e38]: the shift x - max(x) = -4e38 is -inf in float32 in any
    stable implementation. An input whose values span more than the dtype's largest finite value
    is halved (exact: signs, ratios and the search's structure kept) where the row left its domain
    unbounded on a side; a row that bounds both sides gets what it asked for, and a span within
    the range (one-sided large values: a sum of two still overflows) is left alone."""
    backend = get_backend("torch")
    big = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38, "float32": 3.4028234663852886e38}[dtype]
    tiny = {"float16": 2.0 ** -24, "bfloat16": 2.0 ** -133, "float32": 2.0 ** -149}[dtype]
    q = backend.quantize(np.array([0.0, 0.6 * big, -0.6 * big, 1.5, 3 * tiny, -tiny]), dtype)
    for extremes in (None, (float(q.min()), float(q.max()))):
        h, ext = within_spread(backend, q, dtype, Domain(), extremes)
        assert float(h.max()) - float(h.min()) <= big
        assert np.array_equal(h[:4], q[:4] / 2)  # exact
        assert np.array_equal(h, backend.quantize(q / 2, dtype))  # subnormals rounded to the dtype again
        assert ext == (None if extremes is None else (float(h.min()), float(h.max())))
    one_sided = backend.quantize(np.array([0.6 * big, 0.9 * big, 1.0]), dtype)
    assert within_spread(backend, one_sided, dtype, Domain(), None)[0] is one_sided
    assert within_spread(backend, q, dtype, Domain(lo=-big, hi=big), None)[0] is q  # the row asked for it
    assert within_spread(backend, q, dtype, Domain(lo=-big), None)[0] is not q  # unbounded above
    assert within_spread(backend, q, "float64", Domain(), None)[0] is q


def test_a_search_on_a_wide_domain_never_feeds_an_input_spanning_more_than_the_range(tmp_path):
    spec = user_ops(tmp_path, OPS)["planted.wide"]
    seen = []
    f = fuzz_task(Task(op=spec, variant=Variant("float16"), budget=Budget(evals=60), seed=1),
                  on_best=lambda q, ev, fit: seen.append(q.arrays["x"].copy()))
    assert f.evals == 60 and seen
    spans = [float(x.max() - x.min()) for x in seen + [f.best.arrays["x"]]]
    assert max(spans) <= 65504.0 and max(np.abs(x).max() for x in seen) > 1e4, spans  # large values still drawn


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_an_input_a_mutation_left_as_it_was_is_not_rounded_again(dtype, monkeypatch):
    """A child shares its parent's arrays but the one its mutation changed: quantising the child
    rounds that one only, and the shared ones come back as the very arrays (with the values a
    second rounding would give). Another domain, or another dtype, rounds again."""
    spec = load_catalog([], builtin=("torch",)).get("torch.matmul")
    backend = get_backend("torch")
    a, b = (t.name for t in spec.inputs[:2])
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 256)) * 1e3
    x[0, 0] = 1e39  # beyond float32's range too: clipped, then rounded
    parent = quantize_inputs(spec, backend, Candidate(dims={}, params={}, arrays={a: x, b: rng.standard_normal((256, 256))}),
                             dtype)
    rounded = []
    real = backend.quantize
    monkeypatch.setattr(backend, "quantize", lambda arr, d: rounded.append(arr.size) or real(arr, d))
    child = parent.derive("noise", **{b: rng.standard_normal((256, 256))})
    q = quantize_inputs(spec, backend, child, dtype)
    assert q.arrays[a] is parent.arrays[a] and rounded == [256 * 256]  # only the mutated input
    again = quantize_inputs(spec, backend, Candidate(dims={}, params={}, arrays={a: parent.arrays[a].copy()}), dtype)
    np.testing.assert_array_equal(again.arrays[a], q.arrays[a])  # what rounding it again gives
    rounded.clear()
    quantize_inputs(spec, backend, Candidate(dims={}, params={}, arrays={a: parent.arrays[a]}),
                    "bfloat16" if dtype == "float32" else "float32")
    assert rounded  # another dtype: rounded
