"""NaN/Inf search (Audee) on real torch: guidance ``spread`` with overflow-edge mutators finds
the overflow of a naively written softplus (log(1 + exp(x))) where the float64 reference is
finite, and finds nothing in torch's own softplus."""
from __future__ import annotations

import math

import numpy as np

from gate.fuzz import GUIDANCES, fuzz_task
from gate.oracles.nansearch import edge_values, overflow_mutators
from gate.ops.catalog import load_builtin
from gate.oracles.precision import Metrics, fitness

from tests.oracle_support import task, user_ops

OPS = """
- name: planted.naive_softplus
  callable: planted_ops:naive_softplus
  kind: activation
  dims: {N: [1, 8], D: [1, 16]}
  inputs: [{name: x, shape: [N, D], domain: {name: real, scale: 3}}]
  dtypes: [float16, float32]
  modes: [input]
"""


def test_naive_softplus_overflow_found(tmp_path):
    spec = user_ops(tmp_path, OPS)["planted.naive_softplus"]
    for dtype in ("float32", "float16"):
        f = fuzz_task(task(spec, "nan", dtype=dtype, evals=200))
        assert f.status == "ok" and f.metrics.nonfinite > 0, (dtype, f.metrics)
        assert f.strategy == "spread"  # the oracle imposes its guidance
        assert not math.isfinite(f.extra["nonfinite_value"]) and math.isfinite(f.extra["reference_value"])
        assert f.evals < 200  # the search stops at the first NaN/Inf


def test_stable_softplus_has_none():
    spec = {s.name: s for s in load_builtin(("torch",))}["torch.softplus"]
    f = fuzz_task(task(spec, "nan", evals=150))
    assert f.status == "ok" and f.metrics.nonfinite == 0, f.extra
    assert f.metrics.spread > 1e3  # the search did climb towards overflow
    used = f.coverage["mutators"]
    assert {"overflow_edge", "scale_to_edge", "grow"} <= set(used)


def test_spread_guidance_and_edges():
    assert "spread" in GUIDANCES
    assert fitness(Metrics(spread=5.0, ulp=1.0), "spread") == 5.0
    assert fitness(Metrics(spread=5.0, nonfinite=1), "spread") == math.inf
    e16 = edge_values("float16")
    assert 65504.0 in e16 and any(abs(v - math.log(65504.0)) < 1e-9 for v in e16)
    muts = overflow_mutators("float16")
    spec = {s.name: s for s in load_builtin(("torch",))}["torch.log"]  # positive domain
    from gate.search.inputs import draw

    rng = np.random.default_rng(0)
    cand = draw(spec, rng)
    for _ in range(20):
        new = muts["overflow_edge"](cand, spec, rng)
        assert (new.arrays["input"] > 0).all()  # edges stay inside the input's domain
