"""What real callers pass, by default (issue 12): non-contiguous tensors and gradients, with no
opt-in in the operator's row.

* ``view`` vs ``reshape``: a row-normalising helper that flattens with ``reshape`` (a common
  fix in operator libraries, e.g. timm's and kornia's "use reshape: the input may be
  non-contiguous") reverted to ``view`` raises on a transposed or sliced input, which the old
  default search never fed. The default ``noncontiguous`` layout variant finds it.
* ``eps`` under a ``sqrt`` (a "safe norm", as in pytorch3d/e3nn): removing it leaves the forward
  pass bit-identical wherever ``x*x`` dwarfs ``eps`` and makes the gradient 0/0 = NaN at zero.
  The default gradient variant finds it (replayed on base: base's gradient is finite there).
Each fix passes; each revert fails with the right outcome."""
from __future__ import annotations

import pytest

from tests.test_gate_run import by_op, gate, git, make_repo, commit_pr
from tests.helpers.repro import run_script

OPS = '''
import torch


def flatten_norm(x):
    flat = x.reshape(-1)
    return (flat / flat.norm().clamp_min(1e-12)).reshape(x.shape)


def safe_norm(x, eps=1e-12):
    return torch.sqrt((x * x).sum(-1) + eps)
'''

CONFIG = '''
version: 1
framework: torch
python_path: ["."]
builtin: false
gate: {dtypes: [float32]}
ops:
  - name: lib.flatten_norm
    callable: lib.ops:flatten_norm
    sources: [lib/ops.py]
    dims: {N: [1, 8], D: [1, 16]}
    inputs: [{name: x, shape: [N, D]}]
  - name: lib.safe_norm
    callable: lib.ops:safe_norm
    sources: [lib/ops.py]
    dims: {N: [1, 8], D: [1, 16]}
    inputs: [{name: x, shape: [N, D]}]
'''

PRS = {
    "view": ("flat = x.reshape(-1)", "flat = x.view(-1)"),
    "noeps": ("torch.sqrt((x * x).sum(-1) + eps)", "torch.sqrt((x * x).sum(-1))"),
    "refactor": ("    return torch.sqrt((x * x).sum(-1) + eps)", "    ss = (x * x).sum(-1)\n    return torch.sqrt(ss + eps)"),
}


@pytest.fixture(scope="module")
def lib_repo(tmp_path_factory):
    return make_repo(tmp_path_factory.mktemp("defaults"), OPS, config=CONFIG, package="lib")


def pr(repo, name, reverse=False):
    old, new = PRS[name]
    if reverse:  # the fix: the PR taken back out of its own branch
        commit_pr(repo, f"pr-{name}-fix", f"pr-{name}", new, old)
    else:
        commit_pr(repo, f"pr-{name}", "main", old, new)


def test_default_variants_include_a_non_contiguous_layout_and_a_gradient(lib_repo):
    from gate.config import load_config
    from gate.plan import variants_for

    spec = next(s for s in load_config(lib_repo / ".dl-gate.yml").ops if s.name == "lib.flatten_norm")
    keys = [v.key for v in variants_for(spec, dtypes=["float32"])]
    assert any("noncontiguous" in k for k in keys) and any(k.endswith("grad") for k in keys), keys


def test_view_on_a_non_contiguous_input_fails_by_default(lib_repo, tmp_path):
    pr(lib_repo, "view")
    code, report = gate(lib_repo, tmp_path, "--ops", "lib.flatten_norm", evals=30)
    regs = [v for v in by_op(report, "lib.flatten_norm") if v.outcome == "regression"]
    assert code == 1 and regs, [(v.id, v.outcome, v.reason) for v in report.verdicts]
    assert all(v.variant.get("layout") == "noncontiguous" for v in regs), [v.id for v in regs]
    assert "new crash" in regs[0].reason and "view" in regs[0].reason, regs[0].reason
    pr(lib_repo, "view", reverse=True)  # the fix, onto the broken code
    code, report = gate(lib_repo, tmp_path, "--ops", "lib.flatten_norm", "--base", "pr-view", seed=1, evals=30)
    assert code in (0, 3) and not any(v.outcome == "regression" for v in report.verdicts), report.reason


def test_a_backward_only_nan_fails_by_default(lib_repo, tmp_path):
    pr(lib_repo, "noeps")
    code, report = gate(lib_repo, tmp_path, "--ops", "lib.safe_norm", evals=30)
    regs = [v for v in by_op(report, "lib.safe_norm") if v.outcome == "regression"]
    assert code == 1 and regs, [(v.id, v.outcome, v.reason) for v in report.verdicts]
    grad = [v for v in regs if v.variant.get("oracle") == "grad" and "NaN" in v.reason]
    assert grad, [(v.id, v.reason) for v in regs]
    # its repro script reproduces it on this checkout (1), not on base's (0), and says when the
    # library cannot be imported at all (2)
    script = (grad[0].diagnosis or {}).get("repro_script")
    assert script, grad[0].diagnosis
    assert repro(script) == 1
    base_tree = tmp_path / "base-tree"
    git(lib_repo, "worktree", "add", "-q", "--detach", str(base_tree), "main")
    assert repro(script, "--repo", str(base_tree)) == 0
    assert repro(script, "--repo", str(tmp_path / "nowhere")) == 2


def repro(script, *args) -> int:
    import subprocess
    import sys

    res = run_script([script, *args], timeout=120)
    return res.returncode


def test_a_refactor_passes_with_the_default_variants(lib_repo, tmp_path):
    pr(lib_repo, "refactor")
    for seed in range(2):
        code, report = gate(lib_repo, tmp_path, "--ops", "lib.safe_norm,lib.flatten_norm", seed=seed, evals=30)
        assert code == 0, [(v.id, v.outcome, v.reason) for v in report.verdicts]


def test_structured_rows_are_replayed_on_both_sides_and_stay_in_the_domain(lib_repo):
    """Peaked rows, ties and a wide dynamic range join the all-zeros and constant inputs that
    every variant is judged on (random draws almost never produce them)."""
    import numpy as np

    from gate.config import load_config
    from gate.search.inputs import draw, structured_inputs
    from gate.ops.spec import Domain

    spec = next(s for s in load_config(lib_repo / ".dl-gate.yml").ops if s.name == "lib.safe_norm")
    like = draw(spec, np.random.default_rng(0))
    peaked, ties, wide = structured_inputs(spec, like)
    rows = peaked.arrays["x"].reshape(-1, peaked.arrays["x"].shape[-1])
    if rows.shape[1] > 1:
        top2 = np.sort(rows, axis=-1)[:, -2:]
        assert np.all(top2[:, 1] - top2[:, 0] > 10)  # one dominant value per row
    assert all(len(np.unique(r)) <= 2 for r in ties.arrays["x"].reshape(-1, ties.arrays["x"].shape[-1]))
    mags = np.abs(wide.arrays["x"])
    assert mags.size < 4 or mags.max() / mags.min() > 1e3
    positive = spec.replace(inputs=(spec.inputs[0].__class__(name="x", shape=spec.inputs[0].shape,
                                                              domain=Domain(lo=0.0, hi=1.0)),))
    for c in structured_inputs(positive, like):
        assert np.all((c.arrays["x"] > 0) & (c.arrays["x"] < 1)), c.origin


def test_neighbours_move_each_value_by_a_few_ulps_of_its_dtype_and_keep_what_must_stay():
    """The worst input's roundings (gate.search.inputs.neighbours): each finite nonzero float
    element moved by a whole number of ulps within the steps, zeros, NaN/Inf, integer tensors and
    a move out of the domain kept; reproducible for a seed."""
    import numpy as np

    from gate.ops.spec import OpSpec
    from gate.search.inputs import Candidate, neighbours
    from gate.search.score import ulp

    spec = OpSpec.from_dict({"name": "t.f", "framework": "torch", "callable": "m:f", "inputs": [
        {"name": "x", "shape": [6]}, {"name": "p", "shape": [3], "domain": "positive"},
        {"name": "i", "shape": [2], "kind": "index", "high": 4}]})
    x = np.array([1.0, -3.5, 0.0, np.inf, np.nan, 1e-3])
    p = np.array([ulp(np.array([0.0]), "float16")[0], 2.0, 7.0])  # the smallest positive: a move down leaves the domain
    cand = Candidate(dims={}, params={}, arrays={"x": x, "p": p, "i": np.array([1, 3])})
    got = neighbours(spec, cand, "float16", np.random.default_rng(0), n=16)
    assert len(got) == 16 and all(c.origin.startswith("neighbour:") for c in got)
    moved = False
    for c in got:
        k = (c.arrays["x"] - x)[[0, 1, 5]] / ulp(x[[0, 1, 5]], "float16")
        assert np.all(np.abs(k) <= 2) and np.allclose(k, np.round(k))
        moved |= bool(np.any(k != 0))
        assert c.arrays["x"][2] == 0 and np.isinf(c.arrays["x"][3]) and np.isnan(c.arrays["x"][4])
        assert np.all(c.arrays["p"] > 0) and c.arrays["i"] is cand.arrays["i"]
    assert moved
    again = neighbours(spec, cand, "float16", np.random.default_rng(0), n=16)
    assert all(np.array_equal(a.arrays["p"], b.arrays["p"]) for a, b in zip(got, again))
