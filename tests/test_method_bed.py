"""A method of a class as the operator, end to end: modelled on geoopt/geoopt 71c7f63 ("fix: SPD
manifold norm fn"). geoopt's manifolds are ``nn.Module`` subclasses with no forward; their
operators are methods. ``Manifold.norm`` is ``sqrt(inner(x, u))``, whose gradient at a zero
tangent vector is 0 x inf = NaN; the fix gave ``SymmetricPositiveDefinite`` its own ``norm`` that
takes the square root of 1 where the inner product is 0 and returns 0 there. Its revert deletes
the override: the changed code is a method, and the row's callable ``lib.ops:SPD.norm`` runs the
inherited one on head.

The PRs: the revert fails (a new NaN in the gradient, on an all-zero tangent vector), its repro
exits 1 on head and 0 on base; the fix passes."""
import subprocess
import sys

import pytest

from tests.test_gate_run import by_op, commit_pr, git, make_repo
from tests.test_verdict_bed import BED_HEADER, PASSED, PASSING, outcomes, run_gate
from tests.helpers.repro import run_script

MANIFOLD = '''
import torch


class Manifold(torch.nn.Module):
    def __init__(self, ndim=2):
        super().__init__()
        self.ndim = ndim

    def inner(self, x, u):
        dims = tuple(range(-self.ndim, 0))
        return (u * u / (x * x + 1)).sum(dim=dims)

    def norm(self, x, u):
        return self.inner(x, u).sqrt()
'''

FIXED = '''
class SPD(Manifold):
    def norm(self, x, u):
        inner_prod = self.inner(x, u)
        is_zero = torch.eq(inner_prod, 0)
        safe_inner = torch.where(is_zero, torch.ones_like(inner_prod), inner_prod)
        norm = torch.sqrt(safe_inner)
        return torch.where(is_zero, torch.zeros_like(norm), norm)
'''
BUGGY = '''
class SPD(Manifold):
    pass
'''
OPS = MANIFOLD + FIXED

CONFIG = BED_HEADER + '''ops:
  - {name: lib.spd_norm, callable: "lib.ops:SPD.norm", construct: {ndim: 2}, sources: [lib/ops.py],
     dims: {N: [1, 4], D: [2, 3]}, inputs: [{name: x, shape: [N, D, D]}, {name: u, shape: [N, D, D]}]}
'''

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    return make_repo(tmp_path_factory.mktemp("methods"), OPS, config=CONFIG, package="lib")


def test_the_revert_of_a_method_override_fails_and_its_repro_says_so(bed, tmp_path):
    commit_pr(bed, "revert-norm", "main", FIXED, BUGGY)
    code, report = run_gate(bed, tmp_path / "revert", "main", "lib.spd_norm")
    regs = [v for v in by_op(report, "lib.spd_norm") if v.outcome == "regression"]
    assert code == 1 and regs, outcomes(report, "lib.spd_norm")
    grad = [v for v in regs if v.variant.get("oracle") == "grad"]
    assert grad and all("new NaN/Inf" in v.reason for v in grad), outcomes(report, "lib.spd_norm")
    # forward: sqrt(0) is 0 either way; the gradient alone tells the two apart
    assert not [v for v in regs if v.variant.get("oracle") != "grad"], outcomes(report, "lib.spd_norm")
    script = grad[0].diagnosis["repro_script"]

    def repro():
        return run_script([script, "--repo", str(bed)])

    on_head = repro()
    assert on_head.returncode == 1, on_head.stdout + on_head.stderr
    git(bed, "checkout", "-q", "main")
    on_base = repro()
    assert on_base.returncode == 0, on_base.stdout + on_base.stderr


def test_the_fix_passes(bed, tmp_path):
    commit_pr(bed, "buggy", "main", FIXED, BUGGY)
    commit_pr(bed, "fix-norm", "buggy", BUGGY, FIXED)
    code, report = run_gate(bed, tmp_path / "fix", "buggy", "lib.spd_norm")
    vs = by_op(report, "lib.spd_norm")
    assert code in PASSED and vs and all(v.outcome in PASSING for v in vs), outcomes(report, "lib.spd_norm")


# geoopt's manifold is defined on SPD points only: a random x is not one, and every input the
# search ranks highest is NaN on both sides. The one call that tells the revert apart is the
# library's own test (test_spd_norm: an SPD point, a zero tangent vector), recorded by init.
POSITIVE = '''
import torch


class Manifold(torch.nn.Module):
    def inner(self, x, u):
        # defined where every x > 0 (an SPD point's role): NaN elsewhere, on both sides
        return (u * u / x).sum(dim=-1) + torch.log(x).sum(dim=-1) * 0

    def norm(self, x, u):
        return self.inner(x, u).sqrt()
'''
POSITIVE_CONFIG = BED_HEADER + '''ops:
  - {name: lib.pos_norm, callable: "lib.ops:SPD.norm", sources: [lib/ops.py], dims: {N: [1, 4], D: [2, 3]},
     inputs: [{name: x, shape: [N, D]}, {name: u, shape: [N, D]}]}
'''


def test_the_tests_own_call_is_judged_when_every_input_the_search_ranks_is_nan_on_both_sides(tmp_path):
    import numpy as np

    from gate.search.inputs import Candidate
    from gate.search.seeds import SeedStore
    from tests.test_gate_run import refresh

    repo = make_repo(tmp_path, POSITIVE + FIXED, config=POSITIVE_CONFIG, package="lib", baselines=False)
    x = np.array([[1.0, 2.0], [0.5, 3.0]])
    SeedStore(repo / "baselines" / "seeds", opinfo=False).add(  # what init stores from the tests' calls
        "lib.pos_norm", Candidate(dims={"N": 2, "D": 2}, params={}, arrays={"x": x, "u": np.zeros_like(x)},
                                  origin="seed:tests/test_norm.py::test_zero_tangent"),
        source="tests/test_norm.py::test_zero_tangent")
    refresh(repo)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "baselines and the tests' calls")
    commit_pr(repo, "revert-norm", "main", FIXED, BUGGY)
    code, report = run_gate(repo, tmp_path / "revert", "main", "lib.pos_norm")
    grad = [v for v in by_op(report, "lib.pos_norm") if v.variant.get("oracle") == "grad"]
    assert code == 1 and grad and all(v.outcome == "regression" and "new NaN/Inf" in v.reason for v in grad), \
        outcomes(report, "lib.pos_norm")
    commit_pr(repo, "fix-norm", "revert-norm", BUGGY, FIXED)
    code, report = run_gate(repo, tmp_path / "fix", "revert-norm", "lib.pos_norm")
    vs = by_op(report, "lib.pos_norm")
    assert code in PASSED and vs and all(v.outcome in PASSING for v in vs), outcomes(report, "lib.pos_norm")
