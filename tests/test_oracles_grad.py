"""Gradient oracles on real torch: a backward-only precision bug (a custom autograd.Function
whose backward rounds through float16) is invisible to the forward precision oracle and found
by ``grad``; one that rounds even in float64 is found by ``gradcheck``; correct operators score
zero, kinks (relu at 0, max ties) are skipped rather than reported."""
from __future__ import annotations

import pytest

from gate.fuzz import fuzz_task
from gate.ops.catalog import load_builtin
from gate.plan import variants_for

from tests.oracle_support import task, user_ops

OPS = """
- name: planted.square_half_backward
  callable: planted_ops:square_half_backward
  grad: true
  dims: {N: [1, 8], D: [1, 16]}
  inputs: [{name: x, shape: [N, D], domain: {name: real, scale: 3}}]
  dtypes: [float32]
  modes: [input]
- name: planted.square_always_half_backward
  callable: planted_ops:square_always_half_backward
  grad: true
  dims: {N: [1, 4], D: [1, 8]}
  inputs: [{name: x, shape: [N, D], domain: {name: real, scale: 3}}]
  dtypes: [float32]
  modes: [input]
- name: planted.square
  callable: planted_ops:square
  grad: true
  dims: {N: [1, 8], D: [1, 16]}
  inputs: [{name: x, shape: [N, D], domain: {name: real, scale: 3}}]
  dtypes: [float32]
  modes: [input]
"""


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    return user_ops(tmp_path_factory.mktemp("grad"), OPS)


@pytest.fixture(scope="module")
def builtin():
    return {s.name: s for s in load_builtin(("torch",))}


def test_backward_only_bug_found_by_grad_not_by_precision(ops):
    spec = ops["planted.square_half_backward"]
    assert {v.oracle for v in variants_for(spec, oracles=["grad", "gradcheck"])} == {"grad", "gradcheck"}
    fwd = fuzz_task(task(spec, "precision", evals=30))
    assert fwd.status == "ok" and fwd.metrics.ulp <= 0.5, fwd.metrics  # x*x is correctly rounded
    f = fuzz_task(task(spec, "grad", evals=30))
    # float16 rounding (thousands of float32 ulps) or float16 overflow (inf where float64 is finite)
    assert f.status == "ok" and f.metrics.severity > 100, f.metrics
    assert f.extra["worst_input"] == "x"
    # the upstream gradient is part of the saved input, so the finding replays exactly
    assert "__upstream0__" in f.best.arrays
    ok = fuzz_task(task(ops["planted.square"], "grad", evals=30))
    assert ok.status == "ok" and ok.metrics.ulp <= 1.0, ok.metrics


def test_float64_backward_bug_found_by_gradcheck(ops):
    spec = ops["planted.square_always_half_backward"]
    (variant,) = variants_for(spec, oracles=["gradcheck"])
    assert variant.dtype == "float64"
    f = fuzz_task(task(spec, "gradcheck", dtype="float64", evals=15))
    # float16 rounding in backward: ~1e-4 relative, far above float64 central differences' noise
    assert f.status == "ok" and f.metrics.rel > 1e-5 and f.metrics.ulp > 0, f.metrics
    assert f.extra["gradcheck_ratio"] > 0.01 and f.extra["noise"] < f.metrics.abs


@pytest.mark.parametrize("name", ["torch.tanh", "torch.softmax", "torch.layer_norm", "torch.relu", "torch.max_pool2d"])
def test_gradcheck_is_quiet_on_correct_gradients(builtin, name):
    f = fuzz_task(task(builtin[name], "gradcheck", dtype="float64", evals=25))
    assert f.status == "ok", f.message
    assert f.metrics.ulp == 0.0, (f.metrics, f.extra)


def test_gradcheck_skips_kinks(builtin):
    f = fuzz_task(task(builtin["torch.relu"], "gradcheck", dtype="float64", evals=60, seed=3))
    assert f.metrics.ulp == 0.0
    assert f.invalid > 0  # inputs at relu's kink (edge value 0) were skipped, not reported


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_low_precision_backward_is_scored_as_it_came_and_widened_only_when_kept(builtin, dtype):
    """The gradient runner asks the backend for the low run's outputs and gradients as they are
    (float32 for the 32- and 16-bit formats: no float64 copy of each); the figures are those of
    the widened arrays, and the outputs kept for a finding are float64."""
    import numpy as np

    from gate.oracles.precision import compare
    from gate.oracles.registry import build_runner
    from gate.plan import Variant
    from gate.search.inputs import draw

    spec = builtin.get("torch.layer_norm")
    runner = build_runner(spec, Variant(dtype, "cpu", oracle="grad"))
    seen = []
    real = runner.backend.vjp
    runner.backend.vjp = lambda *a, **kw: seen.append((kw["dtype"], kw.get("narrow"))) or real(*a, **kw)
    cand = draw(spec, np.random.default_rng(1))
    q, ev = runner.evaluate(cand, keep_outputs=True)
    assert ev.status == "ok" and seen == [("float64", False), (dtype, True)]
    assert all(o.array.dtype == np.float64 for o in ev.outputs)
    _, low = runner._vjp(q, dtype, runner.fn, dtype)
    assert all(g.array.dtype == np.float32 for g in low)
    wide = [type(g)(g.array.astype(np.float64), g.dtype) for g in low]
    assert compare(low, ev.reference, dtype, spec.ulp_floor, check_dtypes=False) == \
        compare(wide, ev.reference, dtype, spec.ulp_floor, check_dtypes=False)


def test_a_large_upstream_gradient_is_drawn_once_replays_and_its_scale_is_not_read_again(builtin):
    """The upstream gradient of a million-element output comes from the search's counter-based
    normals (NumPy's took ~12 ms, more than layer_norm's forward and backward), seeded by the
    input's content: the same input gets the same upstream in another runner; its largest
    magnitude is noted as it is drawn, and the scale of each evaluation reads it from there."""
    import gc

    import numpy as np

    from gate.oracles import runner as R
    from gate.oracles.registry import build_runner
    from gate.plan import Variant
    from gate.search.inputs import draw

    spec = builtin.get("torch.layer_norm").replace(dims=(("N", (512, 512)), ("D", (256, 256))))
    a = build_runner(spec, Variant("float32", "cpu", oracle="grad"))
    cand = draw(spec, np.random.default_rng(3))
    q1, ev1 = a.evaluate(cand)
    ups = [v for k, v in q1.arrays.items() if k.startswith("__upstream")]
    assert ev1.status == "ok" and len(ups) == 1 and ups[0].size == 512 * 256
    assert R._LARGEST[id(ups[0])][1] == float(np.abs(ups[0]).max())
    b = build_runner(spec, Variant("float32", "cpu", oracle="grad"))
    q2, ev2 = b.evaluate(cand)
    up2 = next(v for k, v in q2.arrays.items() if k.startswith("__upstream"))
    assert np.array_equal(up2, ups[0]) and ev2.metrics.ulp == ev1.metrics.ulp
    # an entry goes with its array
    key = id(ups[0])
    del q1, q2, ups, up2, ev1, ev2
    gc.collect()
    assert key not in R._LARGEST
