"""Value-class coverage: Opera's classes, exact accounting on small specs, generation that
covers what is reachable, and edge values / regimes that land in the class they aim at."""
import itertools
import math

import numpy as np
import pytest

from gate.backends.base import numpy_quantize
from gate.search.coverage import (CoverageMap, Universe, classify, feasible_values, size_class, value_class,
                                value_features)
from gate.search.inputs import Candidate, edge_values, float_facts, inside_after_rounding, regime_values
from gate.ops.spec import Domain, OpSpec

TINY = {
    "name": "tiny.op",
    "framework": "torch",
    "callable": "torch.tanh",
    "params": {"mode": {"choices": ["a", "b"]}, "k": {"range": [-1, 2]}},
    "dims": {"N": [1, 8]},
    "inputs": [{"name": "x", "shape": ["N"], "domain": "prob"}],
}


def tiny_spec() -> OpSpec:
    return OpSpec.from_dict(TINY)


def test_opera_value_classes():
    assert [value_class(v) for v in (-5, -2, -1, 0, 1, 2, 7)] == ["<=-2", "<=-2", "-1", "0", "1", ">=2", ">=2"]
    assert [value_class(v) for v in (-0.5, 0.0, 3.0, math.inf, -math.inf)] == ["<0", "0", ">0", "+inf", "-inf"]
    assert value_class(float("nan")) == "nan"
    assert value_class("tanh") == "'tanh'"
    assert value_class(True) == "True" and value_class(None) == "None"
    assert value_class((2, 1)) == "(>=2,1)"
    assert value_class(np.int64(-1)) == "-1" and value_class(np.float32(0.25)) == ">0"


def test_size_classes_mark_length_paths():
    assert [size_class(n) for n in (0, 1, 2, 6, 7, 8, 9, 10, 63, 64, 4095, 4096, 10**6)] == [
        "0", "1", "2-6", "2-6", "7", "8", "9", "10-63", "10-63", "64-4095", "64-4095", ">=4096", ">=4096"]


def test_universe_of_a_tiny_spec_is_exact():
    uni = Universe(tiny_spec(), "float32")
    assert uni.keys["param:mode"] == ["'a'", "'b'"]
    assert uni.keys["param:k"] == ["-1", "0", "1", ">=2"]
    assert uni.keys["dim:N"] == ["1", "2-6", "7", "8"]
    # open (0, 1): no zero, no negatives, nothing large; tiny, subnormal and near-one values exist
    assert uni.keys["values:x"] == ["bulk", "subnormal", "tiny", "all_tiny", "near_one", "constant", "shifted"]
    sizes = [len(v) for v in uni.keys.values()]
    assert uni.singles() == sum(sizes) == 17
    assert uni.pairs() == sum(a * b for a, b in itertools.combinations(sizes, 2))
    assert uni.shapes["x"] == (4, True)


def _expected_pairs(classes):
    keys = sorted(classes)
    out = set()
    for k1, k2 in itertools.combinations(keys, 2):
        for a in classes[k1]:
            for b in classes[k2]:
                out.add((k1, a, k2, b))
    return out


def test_observe_counts_singles_and_pairs_exactly():
    spec = tiny_spec()
    cov = CoverageMap(spec, "float32")
    c1 = Candidate(dims={"N": 1}, params={"mode": "a", "k": 0}, arrays={"x": np.array([0.5])})
    assert cov.observe(c1) == (4, 6)  # 4 classes, C(4, 2) pairs
    c2 = Candidate(dims={"N": 3}, params={"mode": "a", "k": 0}, arrays={"x": np.array([0.5, 0.5, 0.5])})
    cls1, _ = classify(spec, c1)
    cls2, _ = classify(spec, c2)
    assert cls2["values:x"] == {"bulk", "constant"}
    before = _expected_pairs(cls1)
    after = before | _expected_pairs(cls2)
    new_singles, new_pairs = cov.observe(c2)
    assert new_singles == 2  # N in 2-6, constant values
    assert new_pairs == len(after) - len(before)
    rep = cov.report()
    assert rep["singles"] == {"covered": 6, "total": 17}
    assert rep["pairs"] == {"covered": len(after), "total": Universe(spec).pairs()}
    assert rep["keys"]["dim:N"] == {"covered": ["1", "2-6"], "missing": ["7", "8"]}
    assert rep["shapes"]["x"]["covered"] == ["r1:1", "r1:2-6"]
    assert cov.observe(c2) == (0, 0)  # nothing new the second time


def test_values_outside_the_universe_are_reported_as_extra():
    spec = tiny_spec()
    cov = CoverageMap(spec, "float32")
    cov.observe(Candidate(dims={"N": 2}, params={"mode": "c", "k": 5}, arrays={"x": np.array([-3.0, 2.0])}))
    rep = cov.report()
    assert rep["keys"]["param:mode"]["extra"] == ["'c'"]
    assert "negative" not in rep["keys"]["values:x"]["covered"]
    assert rep["singles"]["covered"] == 3  # k>=2, N 2-6, bulk


def test_generation_covers_every_reachable_class_and_pair():
    spec = tiny_spec()
    cov = CoverageMap(spec, "float32")
    rng = np.random.default_rng(0)
    for _ in range(400):
        cov.observe(cov.draw(rng))
    uni = cov.universe
    assert cov.covered_singles() == uni.singles()
    # a single element cannot be constant nor have a spread: the only unreachable pairs
    infeasible = {("dim:N", "1", "values:x", c) for c in ("constant", "shifted")}
    keys = list(uni.keys)
    reachable = {(k1, a, k2, b) for k1, k2 in itertools.combinations(keys, 2)
                 for a in uni.keys[k1] for b in uni.keys[k2]} - infeasible
    covered = {(keys[i], a, keys[j], b) for i, a, j, b in cov.pairs}
    assert covered == reachable
    assert not cov.extra


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("domain", ["real", "positive", "unit", "gt_minus1", "prob"])
def test_regimes_land_in_the_class_they_aim_at(dtype, domain):
    dom = Domain.parse(domain)
    rng = np.random.default_rng(1)
    for cls in feasible_values(dom, dtype, (1, 64)):
        if cls == "empty":
            continue
        for _ in range(3):
            arr = regime_values(cls, dom, (4, 16), rng, dtype)
            assert arr is not None, cls
            q = inside_after_rounding(numpy_quantize(arr, dtype), dom, dtype)  # as the runner does
            assert cls in value_features(q, dtype), (cls, dtype, domain)
            inside = np.ones(q.shape, bool)
            if dom.lo is not None:
                inside &= q > dom.lo
            if dom.hi is not None:
                inside &= q < dom.hi
            assert inside.all(), (cls, dtype, domain)


def test_infeasible_regimes_are_refused():
    assert regime_values("negative", Domain.parse("positive"), (3,), np.random.default_rng(0)) is None
    assert regime_values("large", Domain.parse("unit"), (3,), np.random.default_rng(0)) is None
    assert "large" not in feasible_values(Domain.parse("unit"), "float32", (1, 8))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_edge_values_follow_the_dtype_and_the_domain(dtype):
    f = float_facts(dtype)
    real = edge_values(Domain.parse("real"), dtype)
    for must in (f["below_one"], -f["below_one"], f["min_subnormal"], f["min_normal"], f["max"], f["log_max"], 1e-8):
        assert np.any(real == must), must
    assert np.all(np.abs(real) <= f["max"])
    assert np.all(numpy_quantize(real, dtype) == numpy_quantize(numpy_quantize(real, dtype), dtype))
    unit = edge_values(Domain.parse("unit"), dtype)
    assert np.all((unit > -1) & (unit < 1)) and np.any(unit == f["below_one"])
    pos = edge_values(Domain.parse("positive"), dtype)
    assert np.all(pos > 0)


def _features_by_element(a, dtype):
    """value_features by definition, one element at a time (the reference for the fast path)."""
    from gate.search.inputs import element_bands

    bands = element_bands(dtype)
    a = np.asarray(a, dtype=float).reshape(-1)
    if a.size == 0:
        return {"empty"}
    out = set()
    fin = [x for x in a if math.isfinite(x)]
    if len(fin) < a.size:
        out.add("nonfinite")
    for x in fin:
        m = abs(x)
        if m == 0:
            out.add("zero")
        for name in ("subnormal", "tiny", "large", "near_max"):
            if bands[name][0] <= m < bands[name][1]:
                out.add(name)
        near = bands["near_one"][0] <= m < bands["near_one"][1]
        if near:
            out.add("near_one")
        elif bands["bulk"][0] <= m < bands["bulk"][1]:
            out.add("bulk")
    if fin and len(fin) == a.size:
        f = np.array(fin)
        if np.all(np.abs(f) < 1e-3):
            out.add("all_tiny")
        if a.size >= 2 and f.min() == f.max():
            out.add("constant")
        elif a.size >= 2 and (f.min() > 0 or f.max() < 0) and f.std() > 0 and abs(f.mean()) >= 30 * f.std():
            out.add("shifted")
        if f.max() < 0:
            out.add("negative")
    return out


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_value_features_match_their_definition(dtype):
    rng = np.random.default_rng(5)
    from gate.search.inputs import REGIMES

    for domain in ("real", "positive", "unit"):
        dom = Domain.parse(domain)
        for regime in REGIMES:
            for _ in range(8):
                arr = regime_values(regime, dom, (int(rng.integers(1, 4)), int(rng.integers(1, 9))), rng, dtype)
                if arr is None:
                    continue
                arr = numpy_quantize(arr, dtype)
                if rng.random() < 0.2:
                    arr.flat[int(rng.integers(arr.size))] = np.nan
                assert value_features(arr, dtype) == _features_by_element(arr, dtype), (regime, domain)


def _feature_tensors(dtype: str, seed: int):
    """Large tensors (the compiled loop's size) with the values that decide each class: every
    band and both sides of each edge, near one and both its ends, ±0, one-signed, shifted,
    constant, all-tiny, and (NumPy's path) NaN/Inf."""
    from gate.search.coverage import BANDS_KERNEL_MIN, _band_edges

    rng = np.random.default_rng(seed)
    n = BANDS_KERNEL_MIN + 17
    edges, nlo, nhi = _band_edges(dtype)
    marks = np.concatenate([edges, np.nextafter(edges, 0), np.nextafter(edges, np.inf),
                            [nlo, nhi, np.nextafter(nlo, 0), np.nextafter(nhi, 0), 1.0, 0.0, -0.0]])
    mixed = rng.standard_normal(n) * 10.0 ** rng.integers(-40, 40, n)
    pick = rng.random(n) < 0.2
    mixed[pick] = rng.choice(marks, pick.sum()) * rng.choice([-1, 1], pick.sum())
    yield mixed
    holes = mixed.copy()
    holes[rng.integers(0, n, 5)] = rng.choice([np.nan, np.inf, -np.inf], 5)
    yield holes
    yield np.full(n, -3.0)                                              # constant, negative
    yield 1e4 + rng.standard_normal(n) * 1e-3                           # shifted
    yield 1.0 + rng.integers(-3, 4, n) * float(np.finfo(np.float32).eps)  # near one only
    yield np.abs(rng.standard_normal(n)) * edges[2] * 0.5               # all tiny
    for b in range(len(edges) - 1):  # one band at a time; with a few near one; with one value at each end of it
        band = rng.uniform(edges[b], edges[b + 1], n) * rng.choice([-1, 1], n)
        yield band
        near = band.copy()
        near[:3] = [nlo, 1.0, -1.0]
        yield near
        ends = near.copy()
        ends[3:5] = [nhi, np.nextafter(nlo, 0)]
        yield ends


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_compiled_value_features_match_numpy(dtype):
    from gate.search import coverage

    if coverage._bands_kernel() is None:
        pytest.skip("Numba is not installed: NumPy classifies every tensor")
    for seed in range(3):
        for a in _feature_tensors(dtype, seed):
            for x in (a, a.astype(np.float32)):
                want = value_features(x, dtype, kernel="numpy")
                assert value_features(x, dtype) == want, (dtype, seed, x[:4], want)


def test_value_features_of_a_float32_rounded_array_take_the_rounding_passs_counts(monkeypatch):
    """A float32 coverage map has the float32 rounding count its band edges in the rounding's own
    pass; the value features of the very array that pass made take those counts (no counting pass
    of their own) and give the classes of NumPy's passes, for every tensor the kernel test uses."""
    from gate.backends import base
    from gate.search import coverage

    if coverage._bands_kernel() is None or base._round_kernel() is None:
        pytest.skip("Numba is not installed: NumPy classifies every tensor")
    spec = tiny_spec()
    try:
        CoverageMap(spec, "float32")  # registers the edges
        counted = []
        real = coverage._bands_kernel().at_or_above

        class Spy:
            def at_or_above(self, *a):
                counted.append(1)
                return real(*a)

        monkeypatch.setattr(coverage, "_KERNEL", [Spy()])
        for seed in range(3):
            for a in _feature_tensors("float32", seed):
                a = np.resize(a, max(a.size, coverage.BANDS_KERNEL_MIN))
                q, _ = base.float32_twin(a)
                lo, hi = base.known_extremes(q)
                if math.isfinite(lo) and math.isfinite(hi):
                    coverage.remember(q, "float32", lo, hi)
                counted.clear()
                assert value_features(q, "float32") == value_features(q, "float32", kernel="numpy")
                assert not counted
                assert value_features(q.copy(), "float32") == value_features(q, "float32", kernel="numpy")
    finally:
        base.count_magnitudes_at("float32", None)
