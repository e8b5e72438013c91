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
from gate.oracles.runner import quantize_inputs, within_dtype
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
    assert np.isfinite(q).all() and q.max() == 65504.0 and q.min() == -65504.0
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
