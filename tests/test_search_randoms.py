"""The random numbers of large candidates (gate/search/randoms.py): the compiled loops give the
NumPy path's numbers bit for bit, the numbers have the distributions they stand for, a seed fixes
them, small arrays keep NumPy's own draws, and candidates stay inside their domains."""
import statistics

import numpy as np
import pytest

from gate.backends.base import numpy_quantize
from gate.ops.spec import Domain
from gate.search import randoms as R
from gate.search.coverage import feasible_values, value_features
from gate.search.inputs import Candidate, draw_values, inside_after_rounding, regime_values, sample_band
from gate.search.mutate import edge, noise
from gate.ops.catalog import load_catalog

BIG = R.MIN_ELEMENTS * 2 + 3  # large, not a multiple of a vector width
K = R.kernel()
needs_kernel = pytest.mark.skipif(K is None, reason="Numba not available")
SEEDS = [np.uint64(0), np.uint64(1), np.uint64(0xFFFFFFFFFFFFFFFF), np.uint64(0x243F6A8885A308D3)]


@needs_kernel
@pytest.mark.parametrize("seed", SEEDS)
def test_compiled_loops_give_the_numpy_numbers_bit_for_bit(seed):
    qd, tt = R.packed_tables()  # the kernel reads the tables interleaved
    n = 1 << 18
    out = np.empty(n)
    K.normals(seed, qd, tt, out)
    ref = R.numpy_normal(seed, n)
    assert np.array_equal(out.view(np.uint64), ref.view(np.uint64))
    K.uniforms(seed, -3.0, 7.5, out)
    assert np.array_equal(out.view(np.uint64), R.numpy_uniform(seed, n, -3.0, 7.5).view(np.uint64))
    idx = np.empty(n, dtype=np.intp)
    K.indices(seed, 1000003, idx)
    assert np.array_equal(idx, R.numpy_indices(seed, n, 1000003))
    a = np.random.default_rng(5).standard_normal(n) * 10.0 ** np.random.default_rng(6).uniform(-30, 30, n)
    a[:8] = [0.0, -0.0, 1e-310, -1e-310, np.inf, -np.inf, np.nan, 1e308]
    with np.errstate(all="ignore"):
        K.noise(seed, qd, tt, a, 0.0123, out)
        ref = R.numpy_noise(seed, a, 0.0123)
    assert np.array_equal(out.view(np.uint64), ref.view(np.uint64))
    K.signed(seed, a, out)
    assert np.array_equal(out.view(np.uint64), R.numpy_signed(seed, a).view(np.uint64))
    K.gather(seed, a, out)
    assert np.array_equal(out.view(np.uint64), a[R.numpy_indices(seed, n, n)].view(np.uint64))


def test_the_tail_tables_are_reached_and_continuous():
    q, d, t, td = R.tables()
    assert t[-1] == q[1]  # the tail table ends where the first interval begins
    assert np.array_equal(q[1:32768], -q[65535:32768:-1])  # exactly symmetric
    z = R.mix(np.uint64(11), 1 << 20)
    x = R.normal_of(z)
    tail = np.abs(x) > -q[1]
    assert 0 < tail.sum() < 100  # 2^-15 of the values: ~32
    assert (x[tail] > 0).any() and (x[tail] < 0).any()
    assert np.abs(x).max() <= -t[1]


def test_normals_have_the_normal_quantiles():
    x = np.sort(R.numpy_normal(np.uint64(12345), 1 << 20))
    nd = statistics.NormalDist()
    for p in (1e-4, 1e-3, 0.01, 0.1, 0.3, 0.5, 0.7, 0.9, 0.99, 0.999, 1 - 1e-4):
        got = x[int(p * x.size)]
        assert abs(got - nd.inv_cdf(p)) < 0.02 + 0.1 * (min(p, 1 - p) < 1e-3), p
    assert abs(x.mean()) < 5e-3 and abs(x.std() - 1.0) < 5e-3
    assert np.unique(x).size > 0.999 * x.size  # values spread, not a table's 65536


def test_uniforms_indices_and_signs():
    u = R.numpy_uniform(np.uint64(3), 1 << 18, -1.0, 2.0)
    assert u.min() >= -1.0 and u.max() < 2.0
    assert np.allclose(np.histogram(u, bins=10, range=(-1, 2))[0] / u.size, 0.1, atol=0.005)
    i = R.numpy_indices(np.uint64(4), 1 << 18, 7)
    assert i.min() == 0 and i.max() == 6
    assert np.allclose(np.bincount(i) / i.size, 1 / 7, atol=0.005)
    s = R.numpy_signed(np.uint64(5), np.ones(1 << 18))
    assert set(np.unique(s)) == {-1.0, 1.0} and abs(s.mean()) < 0.01


def test_a_seed_fixes_large_draws_and_small_ones_are_numpys():
    a = R.standard_normal(np.random.default_rng(9), (BIG,))
    b = R.standard_normal(np.random.default_rng(9), (BIG,))
    c = R.standard_normal(np.random.default_rng(10), (BIG,))
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    small = (R.MIN_ELEMENTS - 1,)
    assert np.array_equal(R.standard_normal(np.random.default_rng(9), small), np.random.default_rng(9).standard_normal(small))
    assert np.array_equal(R.uniform(np.random.default_rng(9), 1, 2, small), np.random.default_rng(9).uniform(1, 2, small))
    assert np.array_equal(draw_values(Domain.parse("real"), (3, 5), np.random.default_rng(2)),
                          np.random.default_rng(2).standard_normal((3, 5)))
    # a large draw takes one 64-bit seed from the search's generator, not one number an element
    g = np.random.default_rng(9)
    R.standard_normal(g, (BIG,))
    h = np.random.default_rng(9)
    h.integers(0, 1 << 64, dtype=np.uint64)
    assert g.random() == h.random()


def test_without_the_compiled_loops_the_candidates_are_the_same(monkeypatch):
    dom = Domain.parse("real")
    with_k = [draw_values(dom, (BIG,), np.random.default_rng(1)),
              R.noise(np.random.default_rng(2), np.linspace(-5, 5, BIG), 0.01),
              R.resample(np.random.default_rng(3), np.arange(BIG, dtype=float), (7, BIG // 7)),
              R.signed(np.random.default_rng(4), np.ones(BIG)),
              R.uniform(np.random.default_rng(5), -1, 1, (BIG,)),
              R.integers(np.random.default_rng(6), 13, BIG)]
    monkeypatch.setattr(R, "_KERNEL", [None])
    without = [draw_values(dom, (BIG,), np.random.default_rng(1)),
               R.noise(np.random.default_rng(2), np.linspace(-5, 5, BIG), 0.01),
               R.resample(np.random.default_rng(3), np.arange(BIG, dtype=float), (7, BIG // 7)),
               R.signed(np.random.default_rng(4), np.ones(BIG)),
               R.uniform(np.random.default_rng(5), -1, 1, (BIG,)),
               R.integers(np.random.default_rng(6), 13, BIG)]
    for a, b in zip(with_k, without):
        assert a.shape == b.shape and np.array_equal(a, b)


@pytest.mark.parametrize("domain", ["real", "positive", "nonneg", "unit", "gt_minus1", "prob", "ge1"])
def test_large_draws_stay_in_their_domain(domain):
    dom = Domain.parse(domain)
    x = draw_values(dom, (256, 256), np.random.default_rng(0))
    assert x.shape == (256, 256) and np.isfinite(x).all()
    assert (dom.lo is None or (x > dom.lo).all()) and (dom.hi is None or (x < dom.hi).all())
    assert np.unique(x).size > 0.99 * x.size


def test_large_noise_is_relative_and_inside_the_domain():
    spec = load_catalog(builtin=("torch",)).get("torch.sqrt")
    name = spec.inputs[0].name
    a = draw_values(spec.inputs[0].domain, (300, 300), np.random.default_rng(0))
    cand = Candidate(dims={}, params={}, arrays={name: a})
    for s in range(5):
        out = noise(cand, spec, np.random.default_rng(s)).arrays[name]
        assert out.shape == a.shape and (out > spec.inputs[0].domain.lo).all()
        rel = np.abs(out - a) / (np.abs(a) + 1e-12)
        assert 0 < np.median(rel) < 0.1 and rel.max() < 0.1 * 6.3 + 1e-9  # |N(0,1)| <= 6.23
        assert np.count_nonzero(out != a) > 0.99 * a.size  # every element moves, as before
        assert np.array_equal(out, noise(cand, spec, np.random.default_rng(s)).arrays[name])


def test_large_edge_mutation_uses_only_edge_values():
    spec = load_catalog(builtin=("torch",)).get("torch.sqrt")
    name = spec.inputs[0].name
    a = draw_values(spec.inputs[0].domain, (300, 300), np.random.default_rng(0))
    cand = Candidate(dims={}, params={}, arrays={name: a})
    from gate.search.inputs import edge_values

    vals = set(edge_values(spec.inputs[0].domain, "float32").tolist())
    for s in range(8):
        out = edge(cand, spec, np.random.default_rng(s), dtype="float32").arrays[name]
        changed = out != a
        assert changed.any() and set(np.unique(out[changed]).tolist()) <= vals


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("domain", ["real", "positive", "unit", "gt_minus1", "prob"])
def test_large_regimes_land_in_the_class_they_aim_at(dtype, domain):
    """As tests/test_search_coverage.py's test for small tensors, at a size the randoms module
    draws itself (its sign, band and whole-tensor paths)."""
    dom = Domain.parse(domain)
    rng = np.random.default_rng(1)
    shape = (128, 300)
    for cls in feasible_values(dom, dtype, (1, 64)):
        if cls == "empty":
            continue
        for base in (None, draw_values(dom, shape, rng)):
            arr = regime_values(cls, dom, shape, rng, dtype, base=base)
            assert arr is not None and arr.shape == shape, cls
            if base is not None:
                assert arr is not base and np.isfinite(base).all()  # the base is not written
            q = inside_after_rounding(numpy_quantize(arr, dtype), dom, dtype)
            assert cls in value_features(q, dtype), (cls, dtype, domain)
            assert (dom.lo is None or (q > dom.lo).all()) and (dom.hi is None or (q < dom.hi).all())


def test_large_band_samples_take_both_signs_and_stay_in_the_band():
    x = sample_band(1e-3, 1e4, Domain.parse("real"), np.random.default_rng(0), BIG)
    m = np.abs(x)
    assert (m >= 1e-3).all() and (m < 1e4).all()
    assert 0.45 < (x > 0).mean() < 0.55
    y = sample_band(1e-3, 1e4, Domain.parse("positive"), np.random.default_rng(0), BIG)
    assert (y > 0).all()


def test_constant_regime_of_a_large_tensor_takes_one_of_its_values_or_an_edge():
    dom = Domain.parse("real")
    base = np.arange(1.0, BIG + 1.0)
    seen_base = seen_edge = False
    for s in range(40):
        arr = regime_values("constant", dom, (BIG,), np.random.default_rng(s), "float32", base=base)
        v = arr[0]
        assert (arr == v).all()
        seen_base |= bool(v in base)
        seen_edge |= bool(v not in base)
    assert seen_base
    # the pick is the one the filtered pool gives: the same value as a pool of the base and the edges
    from gate.search.inputs import edge_values, inside

    pool = np.concatenate([inside(base, dom), edge_values(dom, "float32")])
    rng = np.random.default_rng(3)
    want = pool[int(np.random.default_rng(3).integers(pool.size))]
    assert regime_values("constant", dom, (BIG,), rng, "float32", base=base)[0] == want


def test_large_index_and_mask_draws_are_in_range():
    rng = np.random.default_rng(0)
    m = R.random(rng, (BIG,)) < 0.5
    assert 0.45 < m.mean() < 0.55
    i = R.integers_shaped(rng, 5, (3, BIG))
    assert i.shape == (3, BIG) and i.min() == 0 and i.max() == 4


def test_warm_compiles_every_loop_or_says_it_cannot(monkeypatch):
    assert R.warm() is (K is not None)
    monkeypatch.setattr(R, "_KERNEL", [None])
    assert R.warm() is False
