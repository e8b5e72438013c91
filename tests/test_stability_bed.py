"""Stability fixes that change the function where it was broken (issue 12: "the gate blocked a
genuine stability fix"). Each bed operator is modelled on a real fix; acceptance testing on the
real code found the gate failing both fixes as behaviour changes (and the eps one, in float16,
as a precision loss on the flat input where base's output was exactly 0):

* ``sobel``: kornia PR #513 (3950f42b0) "add epsilon value to sobel to improve backprop
  stability": ``sqrt(gx*gx + gy*gy)`` -> ``sqrt(gx*gx + gy*gy + eps)``. The gradient of the
  magnitude is NaN on a flat image without the eps; with it the forward value moves on small
  gradients (by design) and, in float16, 1e-6 is a subnormal.
* ``artanh``: geoopt PR #100 (de25258) "change bounds for artanh": ``clamp(-1 + 1e-15, 1 - 1e-15)``
  -> ``clamp(-1 + 1e-5, 1 - 1e-5)``. ``1 - 1e-15`` is 1.0 in float32, so artanh was Inf for
  |x| >= 1; the new bound moves the float64 run near +-1.

The fix passes (its behaviour changes are reported alongside the fix, not failed), its revert
fails on the new NaN/Inf, and a PR that changes the function where nothing was broken still
fails as a behaviour change (tests/test_verdict_bed.py, the NewGELU constant)."""
import pytest

from tests.test_gate_run import by_op, make_repo
from tests.test_verdict_bed import PASSED, branch, outcomes, run_gate

OPS = '''
import torch


def sobel(x, eps: float = 1e-6):
    gx = x[:, 1:-1, 2:] - x[:, 1:-1, :-2]
    gy = x[:, 2:, 1:-1] - x[:, :-2, 1:-1]
    return torch.sqrt(gx * gx + gy * gy + eps)


def artanh(x):
    x = x.clamp(-1 + 1e-5, 1 - 1e-5)
    return 0.5 * (torch.log1p(x) - torch.log1p(-x))
'''

CONFIG = '''
version: 1
framework: torch
python_path: ["."]
builtin: false
budget: {localise: 15}
ops:
  - {name: lib.sobel, callable: "lib.ops:sobel", sources: [lib/ops.py], dims: {N: [1, 3], H: [3, 6], W: [3, 6]},
     inputs: [{name: x, shape: [N, H, W]}]}
  - {name: lib.artanh, callable: "lib.ops:artanh", sources: [lib/ops.py], dims: {N: [1, 32]},
     inputs: [{name: x, shape: [N], domain: {lo: -1.5, hi: 1.5}}]}
'''

CASES = {  # name -> (fixed, buggy)
    "sobel": ("torch.sqrt(gx * gx + gy * gy + eps)", "torch.sqrt(gx * gx + gy * gy)"),
    "artanh": ("x.clamp(-1 + 1e-5, 1 - 1e-5)", "x.clamp(-1 + 1e-15, 1 - 1e-15)"),
}


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    return make_repo(tmp_path_factory.mktemp("stability"), OPS, config=CONFIG, package="lib")


@pytest.mark.parametrize("case,dtype", [("sobel", "float32"), ("sobel", "float16"), ("artanh", "float32"),
                                        ("artanh", "float16")])
def test_a_stability_fix_passes_with_its_changes_reported_and_its_revert_fails(bed, tmp_path, case, dtype):
    fixed, buggy = CASES[case]
    op = f"lib.{case}"
    branch(bed, f"buggy-{case}-{dtype}", "main", fixed, buggy)
    branch(bed, f"fix-{case}-{dtype}", f"buggy-{case}-{dtype}", buggy, fixed)
    code, report = run_gate(bed, tmp_path / "fix", f"buggy-{case}-{dtype}", op, dtype)
    rows = by_op(report, op)
    assert code in PASSED and all(v.outcome != "regression" for v in rows), outcomes(report, op)
    assert any(int(v.details.get("fixed_inputs") or 0) for v in rows), outcomes(report, op)  # the fix was seen
    changed = [v for v in rows if v.outcome == "behaviour-change"]
    assert all(v.details.get("with_fix") and "reported, not failed" in v.reason for v in changed), outcomes(report, op)
    if case == "sobel":  # the eps moves the forward value on every small gradient: the rule is what passes it
        assert changed and any("alongside a stability fix" in w for w in report.warnings), outcomes(report, op)
    # the revert: the same fix taken back out of a base that has it
    branch(bed, f"revert-{case}-{dtype}", "main", fixed, buggy)
    code, report = run_gate(bed, tmp_path / "revert", "main", op, dtype)
    regs = [v for v in by_op(report, op) if v.outcome == "regression"]
    assert code == 1 and regs and any("new NaN/Inf" in v.reason for v in regs), outcomes(report, op)
