"""Results that are zero in exact arithmetic are judged on the scale of the computation that
made them (issue 31), not in ulps of the float64 run's residue.

Modelled on a real refactor: ``x - x.max(dim, keepdim=True).values`` <-> ``x - x.amax(dim,
keepdim=True)`` in a softmax helper (Hugging Face transformers and PyTorch's own decompositions
went from ``max`` to ``amax``): equal in value; ``max`` routes the gradient of tied values to one
element, ``amax`` spreads it. Softmax is shift-invariant, so the gradient through the shift
cancels: on a constant input the attention gradient with respect to ``k`` is zero in exact
arithmetic. The float64 run returns a residue (3.5e-17), ``max``'s float32 run the rounding of
the O(1) terms that cancelled (1.9e-8), ``amax``'s exactly 0: in ulps of the residue the
refactor read 5.8e15 ulp and failed as a regression. On the computation's scale (the upstream
gradient times the inputs and outputs) it is 0.67 ulp; a real loss of that size's digits
(1e-3 on terms of 1) still reads thousands of ulps.
"""
from __future__ import annotations

import numpy as np
import pytest

from gate.backends.base import Output
from gate.oracles.precision import compare, residue_magnitude

from tests.test_gate_run import by_op, make_repo
from tests.test_verdict_bed import branch, run_gate


def out32(values):
    return [Output(np.asarray(values, np.float32), "float32")]


def ref64(values):
    return [Output(np.asarray(values, np.float64), "float64")]


def test_a_residue_is_judged_on_the_scale_of_its_terms():
    head, ref = out32([0.0, 1.9242304e-08, -7.1e-9]), ref64([0.0, 3.4755477553579554e-17, 1e-17])
    assert compare(head, ref, "float32", "output").ulp > 1e14  # in ulps of the residue
    m = compare(head, ref, "float32", "output", scale=2.0)  # terms of the size of the upstream gradient
    assert m.ulp < 1.0, m.ulp
    # a real cancellation loss: three decimal digits of terms of 1 lost (1e-3) is thousands of ulps
    lost = compare(out32([1e-3, 0.0, 0.0]), ref, "float32", "output", scale=1.0)
    assert lost.ulp > 1000, lost.ulp
    # an elementwise operator's elements are each judged in ulps of their own value
    assert compare(head, ref, "float32", "dtype", scale=2.0).ulp > 1e14


def test_only_an_output_below_one_rounding_unit_of_its_scale_is_a_residue():
    assert residue_magnitude(3.5e-17, 1.0, "float32") == 1.0
    assert residue_magnitude(1e-3, 1.0, "float32") == 1e-3  # a small result, not a residue
    assert residue_magnitude(3.5e-17, 0.0, "float32") == 3.5e-17  # scale unknown
    assert residue_magnitude(1e-5, 1.0, "float16") == 1.0 and residue_magnitude(1e-3, 1.0, "float16") == 1e-3


OPS = '''
import torch


def _row_shift(s):
    return s - s.amax(dim=-1, keepdim=True)


def attention(q, k, v):
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    e = torch.exp(_row_shift(s))
    return (e / e.sum(-1, keepdim=True)) @ v
'''

CONFIG = '''
version: 1
framework: torch
python_path: ["."]
builtin: false
budget: {localise: 10}
ops:
  - {name: lib.attention, callable: "lib.ops:attention", sources: [lib/ops.py], kind: attention,
     dims: {N: [3, 3], D: [5, 5]},
     inputs: [{name: q, shape: [N, D]}, {name: k, shape: [N, D]}, {name: v, shape: [N, D]}]}
'''

AMAX = "s - s.amax(dim=-1, keepdim=True)"
MAX = "s - s.max(dim=-1, keepdim=True).values"


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    repo = make_repo(tmp_path_factory.mktemp("zero"), OPS, config=CONFIG, package="lib")
    branch(repo, "to-max", "main", AMAX, MAX)  # amax -> max: max's float32 gradient has the residue
    branch(repo, "back-to-amax", "to-max", MAX, AMAX)  # and back
    return repo


def run_branch(repo, head, out, base, op, **kw):
    """``dl-gate run`` with ``head`` checked out: (exit code, report, every row as (id, outcome,
    reason), the gradient variants' verdicts)."""
    import subprocess

    subprocess.run(["git", "-C", str(repo), "checkout", "-q", head], check=True)
    code, report = run_gate(repo, out, base, op, evals=20, **kw)
    rows = [(v.id, v.outcome, v.reason) for v in by_op(report, op)]
    return code, report, rows, [v for v in by_op(report, op) if v.variant.get("oracle") == "grad"]


def test_amax_to_max_is_not_a_gradient_regression(bed, tmp_path):
    code, report, rows, grads = run_branch(bed, "to-max", tmp_path / "out", "main", "lib.attention")
    assert grads, rows
    assert code == 0 and report.outcome == "pass", rows


def test_max_to_amax_is_not_an_improvement_of_a_residue_either(bed, tmp_path):
    import subprocess

    subprocess.run(["git", "-C", str(bed), "checkout", "-q", "back-to-amax"], check=True)
    code, report = run_gate(bed, tmp_path / "out", "to-max", "lib.attention", evals=20)
    rows = [(v.id, v.outcome, v.reason) for v in by_op(report, "lib.attention")]
    assert code == 0 and report.outcome == "pass", rows
    grads = [v for v in by_op(report, "lib.attention") if v.variant.get("oracle") == "grad"]
    assert grads and all(v.outcome == "pass" for v in grads), rows


def test_a_normalised_operators_gradient_residue_is_judged_on_the_upstreams_scale(tmp_path, monkeypatch):
    # a mean-centring (x - mean(x)) on a constant row of tiny values: its output is ~0 and its
    # gradient u - mean(u) zero in exact arithmetic for a constant upstream; float32 leaves the
    # rounding of mean(u), terms of the upstream's size (seven times 0.1, summed in float32, rounds). Upstream x
    # max(inputs, outputs) put those terms at 1e-6 of their size (1e6 ulp, a finding on a benign
    # row); a normalised operator's local derivatives are O(1), so its gradient is judged on the
    # upstream's scale
    from gate.oracles.gradients import UPSTREAM
    from gate.oracles.registry import build_runner
    from gate.plan import Variant
    from gate.search.inputs import Candidate

    from tests.oracle_support import user_ops

    rows = '''
  - {name: lib.centre, callable: "lib_zero:centre", kind: KIND, dims: {N: [7, 7]}, inputs: [{name: x, shape: [1, N]}]}
'''
    (tmp_path / "lib_zero.py").write_text("def centre(x):\n    return x - x.mean(dim=-1, keepdim=True)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    figures = {}
    for kind in ("normalization", "reduction"):
        spec = user_ops(tmp_path, rows.replace("KIND", kind))["lib.centre"]
        runner = build_runner(spec, Variant("float32", oracle="grad"))
        cand = Candidate(dims={"N": 7}, params={}, arrays={"x": np.full((1, 7), 1e-6),
                                                           UPSTREAM.format(0): np.full((1, 7), np.float32(0.1))})
        _, ev = runner.evaluate(cand)
        assert ev.metrics is not None, (ev.status, ev.error)
        figures[kind] = ev.metrics.ulp
    assert figures["normalization"] <= 2, figures
    assert figures["reduction"] > 1e3, figures  # where the inputs and outputs are the only scale
