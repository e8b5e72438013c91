"""Batched evaluation: the same figures as one-at-a-time evaluation on the same candidates,
non-separable settings detected, crashes attributed to the candidate that caused them."""
import sys
import textwrap

import numpy as np
import pytest

from gate.backends.base import Output
from gate.fuzz import fuzz_task
from gate.oracles.batch import BatchEvaluator, compare_segments
from gate.search.inputs import draw
from gate.search.mutate import MUTATORS, bind
from gate.oracles.runner import CRASH, OK, VariantRunner
from gate.oracles.precision import compare
from gate.ops.catalog import Catalog, load_builtin
from gate.ops.spec import OpSpec
from gate.plan import Budget, Task, Variant

EXACT = ("ulp", "abs", "rel", "nonfinite", "int_mismatch", "numel", "worst_output", "worst_index", "worst_out",
         "worst_ref")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def catalog():
    return Catalog(load_builtin(("torch",)))


def same_metrics(a, b):
    for f in EXACT:
        assert getattr(a, f) == getattr(b, f), f
    assert a.l1 == pytest.approx(b.l1, rel=1e-12, abs=1e-300)
    assert a.mean_ulp == pytest.approx(b.mean_ulp, rel=1e-12, abs=1e-300)


def family(spec, rng, width, dtype="float32", fixed_params=None):
    """A parent and value mutations of it: what one batched mutation step evaluates."""
    parent = draw(spec, rng, fixed_params=fixed_params)
    muts = [bind(MUTATORS[m], spec, dtype=dtype) for m in ("perturb_1e-4", "noise", "scale", "edge", "regime", "shift")]
    kids = [parent]
    while len(kids) < width:
        c = muts[int(rng.integers(len(muts)))](parent, rng)
        if c is not None:
            kids.append(c)
    return kids


def test_segment_oracle_equals_the_oracle_per_candidate():
    rng = np.random.default_rng(0)
    dtype = "float16"
    for trial in range(40):
        sizes = [int(s) for s in rng.integers(1, 5, size=int(rng.integers(1, 6)))]
        total = sum(sizes)
        ref = rng.standard_normal((total, 7)) * 10.0 ** rng.uniform(-6, 5)
        out = ref * (1 + rng.standard_normal(ref.shape) * 1e-3)
        sub = rng.random(ref.shape) < 0.05  # subnormal in float16 ...
        ref[sub] = 1e-6
        out[sub] = np.where(rng.random(int(sub.sum())) < 0.5, 0.0, 1e-6)  # ... sometimes flushed
        if trial % 3:  # special values (the oracle's masked path); else all finite (its fast path)
            out[rng.random(out.shape) < 0.05] = np.nan  # NaN where the reference is finite
            ref[rng.random(ref.shape) < 0.03] = 1e6  # overflows float16 ...
            out[ref == 1e6] = np.inf  # ... matched by the right infinity
            ref[rng.random(ref.shape) < 0.02] = np.inf
        idx_o = rng.integers(0, 3, size=(total, 2))
        idx_r = idx_o.copy()
        idx_r[rng.random(idx_r.shape) < 0.1] += 1
        outs = [Output(out, "float16"), Output(idx_o, "int64")]
        refs = [Output(ref, "float64"), Output(idx_r, "int64")]
        floor = "output" if trial % 2 else "dtype"
        ftz = trial % 4 == 0
        got = compare_segments(outs, refs, sizes, dtype, floor, ftz=ftz)
        cuts = np.cumsum(sizes)[:-1]
        for i, (o, r, i_o, i_r) in enumerate(zip(np.split(out, cuts), np.split(ref, cuts), np.split(idx_o, cuts),
                                                  np.split(idx_r, cuts))):
            want = compare([Output(o, "float16"), Output(i_o, "int64")],
                           [Output(r, "float64"), Output(i_r, "int64")], dtype, floor, ftz=ftz)
            same_metrics(got[i], want)


@pytest.mark.parametrize("name,params", [("torch.relu", None), ("torch.tanh", None), ("torch.softmax", {"dim": -1}),
                                         ("torch.layer_norm", None)])
def test_batched_evaluation_gives_the_unbatched_figures(catalog, name, params):
    # these kernels compute each row independently of where it sits in memory; ops whose
    # vectorised kernels treat a buffer's tail differently (e.g. CPU sigmoid, float64 gelu) can
    # differ in the last bit, which is why fuzz_task re-runs the best input alone to report it
    spec = catalog.get(name)
    runner = VariantRunner(spec, Variant("float32"))
    batch = BatchEvaluator(runner)
    assert batch.enabled
    rng = np.random.default_rng(1)
    for _ in range(6):
        kids = family(spec, rng, 6, fixed_params=params)
        many = batch.evaluate_many(kids)
        for kid, (q, ev) in zip(kids, many):
            q1, ev1 = runner.evaluate(kid)
            assert ev.status == ev1.status == OK
            for k in q.arrays:
                np.testing.assert_array_equal(q.arrays[k], q1.arrays[k])
            same_metrics(ev.metrics, ev1.metrics)
    assert batch.calls < 6 * 6  # it did batch
    assert all(batch.separable.values())


def test_a_softmax_over_the_batch_dim_is_found_not_separable(catalog):
    spec = catalog.get("torch.softmax")
    runner = VariantRunner(spec, Variant("float32"))
    batch = BatchEvaluator(runner)
    kids = family(spec, np.random.default_rng(2), 5, fixed_params={"dim": 0})
    many = batch.evaluate_many(kids)
    assert list(batch.separable.values()) == [False]
    for kid, (_, ev) in zip(kids, many):
        same_metrics(ev.metrics, runner.evaluate(kid)[1].metrics)


def test_a_crash_is_attributed_to_the_candidate_that_caused_it(tmp_path, monkeypatch):
    (tmp_path / "crashy_op.py").write_text(textwrap.dedent("""
        import torch

        def op(x):
            if x.dtype == torch.float32 and bool((x.abs() > 1e3).any()):
                raise RuntimeError("kernel refused a large value")
            return torch.tanh(x)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = OpSpec.from_dict({"name": "crashy", "framework": "torch", "callable": "crashy_op.op", "batch_dim": 0,
                             "dims": {"N": [1, 4], "D": [1, 8]}, "inputs": [{"name": "x", "shape": ["N", "D"]}]})
    runner = VariantRunner(spec, Variant("float32"))
    batch = BatchEvaluator(runner)
    rng = np.random.default_rng(3)
    parent = draw(spec, rng)
    big = parent.copy()
    big.arrays["x"] = big.arrays["x"] + 1e4
    results = batch.evaluate_many([parent, big, parent.copy()])
    assert [ev.status for _, ev in results] == [OK, CRASH, OK]
    sys.modules.pop("crashy_op", None)


def test_fuzz_task_batches_and_reports_the_best_input_run_alone(catalog):
    spec = catalog.get("torch.tanh")
    task = Task(op=spec, variant=Variant("float32"), budget=Budget(evals=200), seed=1)
    f = fuzz_task(task)
    assert f.coverage["batch"]["width"] == 8 and f.coverage["batch"]["calls"] > 0
    _, alone = VariantRunner(spec, Variant("float32")).evaluate(f.best, quantized=True)
    same_metrics(f.metrics, alone.metrics)
    off = fuzz_task(task, batch=1)
    assert off.coverage["batch"]["calls"] == 0 and off.evals == 200


def test_large_candidates_are_evaluated_alone_and_small_ones_batch(catalog, monkeypatch):
    # a call over more than MAX_BATCHED_ELEMENTS input elements has no per-call overhead worth
    # sharing (bench/batched_eval.py: batching is slower there); smaller ones still batch
    import gate.oracles.batch as B

    spec = catalog.get("torch.softmax")
    runner = VariantRunner(spec, Variant("float32"))
    kids = family(spec, np.random.default_rng(3), 6, fixed_params={"dim": -1})
    size = max(sum(a.size for a in k.arrays.values()) for k in kids)
    for limit, calls in ((size, 1), (size - 1, 6)):
        monkeypatch.setattr(B, "MAX_BATCHED_ELEMENTS", limit)
        batch = BatchEvaluator(runner)
        many = batch.evaluate_many(kids)
        assert batch.calls == calls, (limit, batch.calls)
        for kid, (_, ev) in zip(kids, many):
            same_metrics(ev.metrics, runner.evaluate(kid)[1].metrics)
