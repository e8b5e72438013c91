import math

import numpy as np
import pytest

from gate.backends.base import Output, numpy_quantize
from gate.oracles.precision import compare, fitness, overflow_bound, ulp


def out(a, dtype="float32"):
    return Output(np.asarray(a, dtype=np.float64), dtype)


@pytest.mark.parametrize("dtype,one_ulp", [("float16", 2.0**-10), ("bfloat16", 2.0**-7), ("float32", 2.0**-23), ("float64", 2.0**-52)])
def test_ulp_of_one_and_subnormal_spacing(dtype, one_ulp):
    assert ulp(np.array(1.0), dtype) == one_ulp
    assert ulp(np.array(1.5), dtype) == one_ulp
    assert ulp(np.array(2.0), dtype) == 2 * one_ulp
    p = {"float16": 11, "bfloat16": 8, "float32": 24, "float64": 53}[dtype]
    emin = {"float16": -14, "bfloat16": -126, "float32": -126, "float64": -1022}[dtype]
    assert ulp(np.array(0.0), dtype) == math.ldexp(1.0, emin - p + 1)


def test_ulp_matches_numpy_spacing():
    x = np.array([1e-3, 0.3, 7.0, 1234.5, 6e4])
    np.testing.assert_array_equal(ulp(x, "float16"), np.spacing(x.astype(np.float16)).astype(np.float64))
    np.testing.assert_array_equal(ulp(x, "float32"), np.spacing(x.astype(np.float32)).astype(np.float64))


def test_quantize_is_exactly_representable_and_bf16_round_trips():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(1000) * 100
    for dt in ("float16", "float32", "bfloat16"):
        q = numpy_quantize(x, dt)
        np.testing.assert_array_equal(numpy_quantize(q, dt), q)
    q = numpy_quantize(x, "bfloat16")
    bits = q.astype(np.float32).view(np.uint32)
    assert np.all(bits & 0xFFFF == 0)
    np.testing.assert_array_equal(numpy_quantize(x, "float16"), x.astype(np.float16).astype(np.float64))


def test_exact_output_has_zero_error():
    m = compare([out([1.0, 2.0, 0.0])], [out([1.0, 2.0, 0.0], "float64")], "float16")
    assert m.ulp == 0 and m.abs == 0 and m.nonfinite == 0


def test_one_ulp_error_in_float16():
    m = compare([out([1.0 + 2.0**-10])], [out([1.0], "float64")], "float16", ulp_floor="dtype")
    assert m.ulp == pytest.approx(1.0)
    assert m.abs == pytest.approx(2.0**-10)
    assert m.worst_index == (0,)


def test_floor_near_zero_of_the_function():
    # ref tiny next to large outputs: 'output' floor measures in ulps of the output's scale
    ref = np.array([1e-10, 1.0])
    o = np.array([4e-7, 1.0])
    m_out = compare([out(o)], [out(ref, "float64")], "float32", ulp_floor="output")
    m_dtype = compare([out(o)], [out(ref, "float64")], "float32", ulp_floor="dtype")
    assert m_out.ulp < 10
    assert m_dtype.ulp > 1e6


def test_nonfinite_only_where_reference_is_representable():
    ovf = overflow_bound("float16")
    assert ovf == 65520.0
    # reference overflows fp16: +inf is the correctly rounded answer
    m = compare([out([np.inf, 1.0], "float16")], [out([1e5, 1.0], "float64")], "float16")
    assert m.nonfinite == 0 and m.ulp == 0
    # reference finite and representable: NaN/Inf is a finding
    m = compare([out([np.nan, np.inf], "float16")], [out([1.0, 2.0], "float64")], "float16")
    assert m.nonfinite == 2 and fitness(m, "linf") == math.inf
    # reference NaN (input outside the function's domain): not judged
    m = compare([out([np.nan])], [out([np.nan], "float64")], "float16")
    assert m.nonfinite == 0


def test_shape_and_integer_mismatch():
    m = compare([out([1.0, 2.0])], [out([1.0], "float64")], "float32")
    assert m.shape_mismatch
    m = compare([Output(np.array([1, 2]), "int64")], [Output(np.array([1, 3]), "int64")], "float32")
    assert m.int_mismatch == 1 and m.severity == math.inf


def test_l1_and_mean():
    m = compare([out([1.0 + 2.0**-10, 2.0 + 2.0**-9])], [out([1.0, 2.0], "float64")], "float16", ulp_floor="dtype")
    assert m.l1 == pytest.approx(2.0**-10 + 2.0**-9)
    assert m.mean_ulp == pytest.approx(1.0)
    assert fitness(m, "l1") == pytest.approx(1.0)


def test_scalar_outputs():
    m = compare([out(np.float64(1.0 + 2.0**-10))], [out(np.float64(1.0), "float64")], "float16", ulp_floor="dtype")
    assert m.ulp == pytest.approx(1.0) and m.worst_index == ()


def test_float64_variant_against_a_declared_reference():
    # a float64 variant (an op with its own reference) has no finite overflow bound
    assert overflow_bound("float64") == math.inf
    ref = np.array([1.0, 1e300, -2.5])
    out = ref.copy()
    out[0] = np.nextafter(1.0, 2.0)
    m = compare([Output(out, "float64")], [Output(ref, "float64")], "float64", "dtype")
    assert m.ulp == 1.0 and m.nonfinite == 0
    out[2] = np.inf
    m = compare([Output(out, "float64")], [Output(ref, "float64")], "float64", "dtype")
    assert m.nonfinite == 1 and m.worst_index == (0,)


def test_output_floor_fast_path_matches_the_elementwise_definition():
    # ulp_floor='output': every element's error is in ulps of the largest reference magnitude
    rng = np.random.default_rng(5)
    ref = rng.standard_normal(1000) * 10.0 ** rng.uniform(-6, 3, 1000)
    out = numpy_quantize(ref, "float32").astype(np.float32)
    m = compare([Output(out, "float32")], [Output(ref, "float64")], "float32", "output")
    floor = ulp(np.abs(ref).max(), "float32")
    per = np.abs(out.astype(np.float64) - ref) / np.maximum(ulp(ref, "float32"), floor)
    assert m.ulp == per.max() and m.worst_index == (int(per.argmax()),)
    assert m.mean_ulp == pytest.approx(per.mean(), rel=1e-12)


def test_an_all_zero_reference_counts_in_ulps_of_one():
    # a variance of constant rows: exactly 0; a kernel returning 1.3e-10 is off by 1.3e-10 on
    # the scale of a normalised output, not by 1e35 smallest subnormals
    ref = np.zeros(4)
    out = np.array([0.0, 1.3e-10, 0.0, 0.0])
    m = compare([Output(out, "float32")], [Output(ref, "float64")], "float32", "output")
    assert m.ulp == pytest.approx(1.3e-10 / 2.0**-23)
    m = compare([Output(out, "float32")], [Output(ref, "float64")], "float32", "dtype")
    assert m.ulp > 1e30  # an elementwise op near its zero keeps relative ULPs (the dtype floor)


def test_results_below_the_smallest_normal_are_not_judged_unless_asked():
    # torch.logaddexp's backward underflows to 0 where the true float32 gradient is 3.15e-40
    # (x = -90): a flush of a subnormal result, which a softplus fix (log(1+exp) -> logaddexp)
    # showed on 5 of 11 seeds as a 2e5-ulp "regression" of its gradient
    ref = [Output(np.array([3.15134e-40, -1.20681e-43]), "float64")]
    flushed = [Output(np.array([0.0, -0.0]), "float32")]
    partial = [Output(np.array([np.float32(1e-40), 0.0]), "float32")]
    assert compare(flushed, ref, "float32").ulp == 0
    assert compare(partial, ref, "float32").ulp == 0
    strict = compare(flushed, ref, "float32", ftz=False)  # exhaustive sweeps measure them
    assert strict.ulp > 1e5
    # a zero where the reference is normal (just above float32's smallest normal) is judged
    normal = [Output(np.array([2.0e-38, 3.0e-40]), "float64")]
    assert compare(flushed, normal, "float32").ulp > 1e6
    # the batched comparison agrees with the single one (two candidates of one row each)
    from gate.oracles.batch import compare_segments
    out = [Output(np.stack([flushed[0].array, flushed[0].array]), "float32")]
    ref2 = [Output(np.stack([ref[0].array, normal[0].array]), "float64")]
    seg = compare_segments(out, ref2, [1, 1], "float32")
    assert seg[0].ulp == 0 and seg[1].ulp == compare(flushed, normal, "float32").ulp


def test_search_figures_are_the_full_figures_a_search_is_guided_by():
    # figures="search" skips the relative error and the spread (six passes over a large output);
    # every other figure must be the one compare gives with all figures, on every path: finite,
    # NaN/Inf outputs, overflowing references, results below the smallest normal, both floors
    rng = np.random.default_rng(11)
    for trial in range(300):
        dtype = ("float16", "bfloat16", "float32")[trial % 3]
        n = int(rng.integers(1, 60))
        ref = rng.standard_normal(n) * 10.0 ** rng.uniform(-45, 40, n)
        out = numpy_quantize(ref * (1 + rng.standard_normal(n) * 10.0 ** rng.uniform(-9, -1)), dtype)
        for _ in range(int(rng.integers(0, 3))):
            out[int(rng.integers(n))] = rng.choice([np.nan, np.inf, -np.inf, 0.0, 1e-42])
        if rng.random() < 0.2:
            ref[int(rng.integers(n))] = rng.choice([np.inf, np.nan, 1e300])
        for floor in ("output", "dtype"):
            outs, refs = [Output(out, dtype)], [Output(ref, "float64")]
            full = compare(outs, refs, dtype, floor).to_dict()
            fast = compare(outs, refs, dtype, floor, figures="search").to_dict()
            assert fast.pop("rel") == "nan" and fast.pop("spread") == "nan"
            full.pop("rel"), full.pop("spread")
            assert fast == full, (trial, floor)
    with pytest.raises(ValueError, match="unknown figures"):
        compare([Output(np.zeros(1), "float32")], [Output(np.zeros(1), "float64")], "float32", figures="fast")


def test_a_search_measures_its_finding_with_every_figure():
    # the loop runs with figures="search"; the finding it reports is measured again alone
    from gate.fuzz import fuzz_task
    from gate.ops.catalog import load_catalog
    from gate.oracles.runner import VariantRunner
    from gate.plan import Budget, Task, Variant

    spec = load_catalog(builtin=("torch",)).get("torch.softmax")
    v = Variant("float16", "cpu")
    runner = VariantRunner(spec, v)
    seen = []
    f = fuzz_task(Task(op=spec, variant=v, budget=Budget(evals=40), seed=3), runner=runner, batch=1,
                  on_best=lambda q, ev, fit: seen.append(ev.metrics))
    assert seen and all(math.isnan(m.rel) for m in seen)  # what the loop measured
    assert f.metrics is not None and math.isfinite(f.metrics.rel) and math.isfinite(f.metrics.spread)
    assert runner.figures == "all"  # the runner is handed back as it came


def test_metrics_read_back_what_they_write():
    # a figure that was not measured (NaN) or is infinite survives a JSON round trip as a float
    from gate.search.score import Metrics

    m = Metrics(ulp=math.inf, rel=math.nan, abs=-math.inf, spread=2.0)
    back = Metrics.from_dict(m.to_dict())
    assert back.ulp == math.inf and math.isnan(back.rel) and back.abs == -math.inf and back.spread == 2.0


def test_a_shifted_tensor_is_told_near_float64s_largest_values():
    from gate.search.coverage import value_features

    assert "shifted" not in value_features(np.array([1e300, 1.5e300]), "float64")  # |mean| = 5 std
    assert "shifted" in value_features(np.array([1e300, 1e300 * (1 + 1e-6)]), "float64")
    assert "shifted" in value_features(100 + np.array([0.0, 0.5, 1.0]), "float32")


def test_a_finding_keeps_the_searchs_figures_and_takes_only_what_it_did_not_measure():
    # the rerun alone gives rel and spread; ulp, abs and the worst element stay the search's (a
    # non-deterministic operator's second run must not rewrite what the search found); a rerun
    # that crashes leaves rel unmeasured (NaN) and is booked as a crash
    from gate.fuzz import _alone
    from gate.search.engine import SearchResult
    from gate.search.evaluation import CRASH, OK, Evaluation
    from gate.search.inputs import Candidate
    from gate.search.score import Metrics

    class Rerun:
        def __init__(self, ev):
            self.ev, self.calls = ev, 0

        def evaluate(self, cand, quantized=False):
            self.calls += 1
            return cand, self.ev

    cand = Candidate(dims={}, params={}, arrays={"x": np.zeros(2)})
    search = Evaluation(OK, metrics=Metrics(ulp=7.0, abs=1.0, rel=math.nan, spread=math.nan, worst_index=(1,)))
    res = SearchResult()
    alone = Evaluation(OK, metrics=Metrics(ulp=3.0, abs=0.5, rel=0.25, spread=4.0, worst_index=(0,)))
    got = _alone(Rerun(alone), cand, search, False, res).metrics
    assert (got.ulp, got.abs, got.worst_index, got.rel, got.spread) == (7.0, 1.0, (1,), 0.25, 4.0)
    full = Evaluation(OK, metrics=Metrics(ulp=7.0, rel=0.5))
    runner = Rerun(alone)
    assert _alone(runner, cand, full, False, res) is full and runner.calls == 0  # nothing to measure
    assert _alone(Rerun(alone), cand, full, True, res) is alone  # batched: the input run alone
    search = Evaluation(OK, metrics=Metrics(ulp=7.0, rel=math.nan, spread=math.nan))
    crash = Evaluation(CRASH, error="SIGSEGV", signature="SIGSEGV in op.py:3")
    assert math.isnan(_alone(Rerun(crash), cand, search, False, res).metrics.rel)
    assert res.crashes["SIGSEGV in op.py:3"].count == 1 and res.crashes["SIGSEGV in op.py:3"].candidate is cand


def test_largest_finite_magnitude_with_and_without_nonfinite_values():
    from gate.oracles.runner import largest

    assert largest([np.array([-3.0, 1.0]), np.array([2.0])]) == 3.0
    assert largest([np.array([-1e-3, -2.0])]) == 2.0
    assert largest([np.array([np.nan, -5.0, 1.0]), np.array([np.inf, 4.0])]) == 5.0
    assert largest([np.array([np.nan, np.inf]), np.zeros(0), np.array([1, 9])]) == 0.0  # ints are not counted


def test_compiled_kernels_load_where_numba_is_installed():
    """The kernels' tests skip where Numba is missing: where it is there, a kernel that does not
    load (an error of its own) must fail here, not skip them."""
    pytest.importorskip("numba")
    from gate.backends import base
    from gate.oracles import fused

    assert fused.available() and base._round_kernel() is not None
