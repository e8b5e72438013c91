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
import numpy as np
import pytest

from tests.test_gate_run import by_op, make_repo
from tests.test_verdict_bed import BED_HEADER, PASSED, branch, outcomes, run_gate
from tests.helpers.repro import run_script

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

CONFIG = BED_HEADER + '''ops:
  - {name: lib.sobel, callable: "lib.ops:sobel", sources: [lib/ops.py], dims: {N: [1, 3], H: [3, 6], W: [3, 6]},
     inputs: [{name: x, shape: [N, H, W]}]}
  - {name: lib.sobel_composite, callable: "lib.ops:sobel", kind: composite, sources: [lib/ops.py],
     dims: {N: [1, 3], H: [3, 6], W: [3, 6]}, inputs: [{name: x, shape: [N, H, W]}]}
  - {name: lib.artanh, callable: "lib.ops:artanh", sources: [lib/ops.py], dims: {N: [1, 32]},
     inputs: [{name: x, shape: [N], domain: {lo: -1.5, hi: 1.5}}]}
'''

CASES = {  # name -> (fixed, buggy)
    "sobel": ("torch.sqrt(gx * gx + gy * gy + eps)", "torch.sqrt(gx * gx + gy * gy)"),
    "artanh": ("x.clamp(-1 + 1e-5, 1 - 1e-5)", "x.clamp(-1 + 1e-15, 1 - 1e-15)"),
}
# the row `dl-gate init` writes (kind: composite, errors on the output's scale): on the flat
# image base's float64 output is 0 and head's sqrt(1e-6); measured in ulps of 1 (an all-zero
# output's default scale) the function "did not change" there and the fix's float16 rounding of
# eps (a subnormal) failed as "7.42 ulp > 2 (3 x base 0)"
CASES["sobel_composite"] = CASES["sobel"]


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    return make_repo(tmp_path_factory.mktemp("stability"), OPS, config=CONFIG, package="lib")


@pytest.mark.parametrize("case,dtype", [("sobel", "float32"), ("sobel", "float16"), ("sobel_composite", "float16"),
                                        ("artanh", "float32"), ("artanh", "float16")])
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


# kornia PR #2125 (fdb5d39): the binary focal loss's ``probs.log()`` -> ``logsigmoid(input)``.
# On the input below (found by the contrast search in CI: logits near 0, targets of -4e4 and -5e4)
# the two terms of each element are ~3.5e3 and cancel to ~0.2; in float16 base rounds both logs
# to the same value and head (each log correctly rounded) to adjacent ones, so the cancellation
# leaves 1010 ulps of error on base and 3742 on head, while the float64 function did not change.
FOCAL = '''
import torch


def focal_fixed(input, target, alpha: float = 0.5, gamma: float = 2.0):
    probs_pos, probs_neg = input.sigmoid(), (-input).sigmoid()
    log_pos = torch.nn.functional.logsigmoid(input)
    log_neg = torch.nn.functional.logsigmoid(-input)
    loss = -alpha * probs_neg.pow(gamma) * target * log_pos - (1 - alpha) * probs_pos.pow(gamma) * (1.0 - target) * log_neg
    return loss.mean()


def focal_broken(input, target, alpha: float = 0.5, gamma: float = 2.0):
    probs_pos, probs_neg = input.sigmoid(), (-input).sigmoid()
    log_pos, log_neg = probs_pos.log(), probs_neg.log()
    loss = -alpha * probs_neg.pow(gamma) * target * log_pos - (1 - alpha) * probs_pos.pow(gamma) * (1.0 - target) * log_neg
    return loss.mean()
'''


def _focal_verdict(tmp_path, monkeypatch, head_fn, base_fn, target):
    import numpy as np

    from gate.config import parse_config
    from gate.judge.decide import GateSettings, decide
    from gate.judge.replay import replay
    from gate.plan import Variant
    from gate.search.inputs import Candidate

    (tmp_path / "focalbed.py").write_text(FOCAL)
    monkeypatch.syspath_prepend(str(tmp_path))
    rows = "\n".join(f"  - {{name: {fn}, callable: 'focalbed:{fn}', dims: {{N: [2, 2]}}, "
                     f"inputs: [{{name: input, shape: [N, 3]}}, {{name: target, shape: [N, 3]}}]}}"
                     for fn in (head_fn, base_fn))
    cfg = parse_config(f"version: 1\nframework: torch\nbuiltin: false\nops:\n{rows}\n", root=tmp_path)
    spec = {o.name: o for o in cfg.ops}
    cand = Candidate(dims={"N": 2}, params={},
                     arrays={"input": np.array([[0, 0, 0], [1.5997886657714844e-04, -9.0003e-05, 0]]),
                             "target": np.asarray(target, dtype=np.float64)})
    v = Variant("float16")
    head, base = replay(spec[head_fn], v, [cand]), replay(spec[base_fn], v, [cand])
    verdict = decide(spec[head_fn], v, head, base, None, "ok", None, GateSettings(), inputs=["found"], controls=[False])
    return verdict, head[0].metrics.ulp, base[0].metrics.ulp


def test_the_focal_loss_fix_is_not_failed_where_both_sides_cancel_terms_of_1e4(tmp_path, monkeypatch):
    v, head_ulp, base_ulp = _focal_verdict(tmp_path, monkeypatch, "focal_fixed", "focal_broken",
                                           [[0, 0, 0], [-40000.0, -49984.0, 0]])
    # the numbers of the CI failure: head more than 3x base (the ratio rule alone fails this fix)
    assert base_ulp > 500 and head_ulp > 3 * base_ulp, (head_ulp, base_ulp)
    assert v.outcome == "pass" and v.details.get("base_unreliable") == 1, (v.outcome, v.reason)


def test_on_targets_in_their_range_the_focal_loss_is_judged(tmp_path, monkeypatch):
    # the same logits with targets in [0, 1]: nothing cancels, base is accurate, the input is judged
    v, head_ulp, base_ulp = _focal_verdict(tmp_path, monkeypatch, "focal_fixed", "focal_broken",
                                           [[0, 1, 0.5], [1, 0, 0.25]])
    assert base_ulp < 45 and "base_unreliable" not in v.details and v.details["pairs"] == 1, (base_ulp, v.details)
    assert v.outcome in ("pass", "improvement"), (v.outcome, v.reason)


# transformers #4436 ("fp16 fixes for T5"): T5's layer norm computes the variance in float32.
# Before it, a float16 row holding 300 squares to inf, the variance is inf and the row becomes
# 0: base returns -0.0 where the true value is -524032, whose float16 rounding is -inf. Head's
# -inf is the right answer, not a new NaN/Inf; the revert returns -0.0 where base returned it
# and is failed on precision. torchvision #3383 (box_area in float16: 10 x 30000 overflows
# unless upcast) is the counter-case: base's finite float32 area is right, so head's float16
# inf stays a new NaN/Inf.
OVERFLOW = '''
import torch


def t5_norm_fixed(x, weight, eps: float = 1e-6):
    variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
    x = x / torch.sqrt(variance + eps)
    if weight.dtype == torch.float16:
        x = x.to(torch.float16)
    return weight * x


def t5_norm_buggy(x, weight, eps: float = 1e-6):
    variance = x.pow(2).mean(-1, keepdim=True)
    x = x / torch.sqrt(variance + eps)
    return weight * x


def _upcast(t):
    return t if t.is_floating_point() and t.dtype in (torch.float32, torch.float64) else t.float()


def box_area_fixed(boxes):
    boxes = _upcast(boxes)
    return (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])


def box_area_buggy(boxes):
    return (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])


def area_share(boxes):  # each box's area over itself: NaN (inf / inf) once float16 overflows
    area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    return area / area


area_share_base = area_share  # the same code on base (a repro run against base)
'''


def _overflow_verdict(tmp_path, monkeypatch, head_fn, base_fn, dtype="float16", replays=False):
    import numpy as np

    from gate.config import parse_config
    from gate.judge.decide import GateSettings, decide
    from gate.judge.replay import replay
    from gate.plan import Variant
    from gate.search.inputs import Candidate

    (tmp_path / "overflowbed.py").write_text(OVERFLOW)
    monkeypatch.syspath_prepend(str(tmp_path))
    if head_fn.startswith("t5"):
        inputs = "[{name: x, shape: [N, 64]}, {name: weight, shape: [64]}]"
        x = np.zeros((1, 64))
        # float16: 300^2 overflows 65504; float32: 1e20^2 overflows 3.4e38 (the upcast is a no-op)
        x[0, 0], x[0, 1] = (300.0, 1.0) if dtype == "float16" else (1e20, 1e19)
        w = np.ones(64)
        w[0] = -65504.0
        arrays = {"x": x, "weight": w}
    else:
        inputs = "[{name: boxes, shape: [N, 4]}]"
        arrays = {"boxes": np.array([[0.0, 0.0, 10.0, 30000.0], [1.0, 2.0, 3.0, 5.0]])}
    rows = "\n".join(f"  - {{name: {fn}, callable: 'overflowbed:{fn}', dims: {{N: [1, 2]}}, inputs: {inputs}}}"
                     for fn in (head_fn, base_fn))
    cfg = parse_config(f"version: 1\nframework: torch\nbuiltin: false\nops:\n{rows}\n", root=tmp_path)
    spec = {o.name: o for o in cfg.ops}
    cand = Candidate(dims={"N": len(next(iter(arrays.values())))}, params={}, arrays=arrays)
    v = Variant(dtype)
    head, base = replay(spec[head_fn], v, [cand]), replay(spec[base_fn], v, [cand])
    verdict = decide(spec[head_fn], v, head, base, None, "ok", None, GateSettings(), inputs=["found"], controls=[False])
    return (verdict, spec[head_fn], cand, head[0], base[0]) if replays else verdict


def test_a_float16_fix_whose_right_answer_is_inf_passes_and_its_revert_fails_on_precision(tmp_path, monkeypatch):
    fix = _overflow_verdict(tmp_path, monkeypatch, "t5_norm_fixed", "t5_norm_buggy")
    assert fix.outcome in ("pass", "improvement") and not fix.reason.startswith("new NaN/Inf"), (fix.outcome, fix.reason)
    revert = _overflow_verdict(tmp_path, monkeypatch, "t5_norm_buggy", "t5_norm_fixed")
    assert revert.outcome == "regression" and revert.details["kind"] == "precision", (revert.outcome, revert.reason)
    assert not revert.reason.startswith("head fixes"), revert.reason


def test_inf_where_bases_upcast_area_was_right_is_still_new(tmp_path, monkeypatch):
    revert = _overflow_verdict(tmp_path, monkeypatch, "box_area_buggy", "box_area_fixed")
    assert revert.outcome == "regression" and revert.reason.startswith("new NaN/Inf"), (revert.outcome, revert.reason)
    fix = _overflow_verdict(tmp_path, monkeypatch, "box_area_fixed", "box_area_buggy")
    assert fix.outcome == "improvement", (fix.outcome, fix.reason)


def test_in_float32_the_t5_upcast_changes_nothing_and_neither_direction_claims_otherwise(tmp_path, monkeypatch):
    # float32: both versions square 1e20 to inf and return 0, bit for bit. The fixed version's
    # float64 run used to cast to float32 and return 0 too (a 0-ulp figure on one side, 1.7e7 on
    # the other); it computes in float64 throughout now and returns the true value, as the buggy
    # one's does: both sides err alike. The outputs did not change: a pass both ways, the same
    # figure on both sides, no "improvement"
    fix = _overflow_verdict(tmp_path, monkeypatch, "t5_norm_fixed", "t5_norm_buggy", dtype="float32")
    revert = _overflow_verdict(tmp_path, monkeypatch, "t5_norm_buggy", "t5_norm_fixed", dtype="float32")
    for v in (fix, revert):
        assert v.outcome == "pass" and v.details["identical_outputs"] == 1, (v.outcome, v.reason)
        assert v.head_error == v.base_error and not v.details.get("reference_moved"), (v.head_error, v.base_error)


@pytest.mark.parametrize("head_fn, base_fn, reproduces", [
    ("t5_norm_fixed", "t5_norm_buggy", 0),  # head's -inf is the answer: not a new NaN/Inf
    ("box_area_buggy", "box_area_fixed", 1),  # base's float32 area was right: it is one
    # the repro run against base: the NaN is base's own too (stored beside the input), not the
    # finding; it counted every NaN where the float64 run was finite (1.0) and exited 1 on base
    ("area_share", "area_share_base", 0),
])
def test_the_repro_script_counts_new_nan_as_the_judge_does(tmp_path, monkeypatch, head_fn, base_fn, reproduces):
    import os
    import subprocess
    import sys

    from gate.localise.repro import write_repro
    from gate.plan import Variant

    _, spec, cand, head, base = _overflow_verdict(tmp_path, monkeypatch, head_fn, base_fn, replays=True)
    paths = write_repro(tmp_path / "repro", head_fn, spec, Variant("float16"), cand, kind="nonfinite", threshold=2.0,
                        threshold_why="test", repo=tmp_path, python_path=["."], reason="bed",
                        base_reference=base.reference, base_outputs=base.outputs, ftz=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = run_script([paths["script"]], env=env, timeout=120)
    assert res.returncode == reproduces, res.stdout + res.stderr


# vector-quantize-pytorch 6102e37: ``cdist`` clamps the squared distance at 0 before the sqrt
# (``x2 + y2 - 2xy`` rounds below 0 for a point and itself: NaN). On the fixed input head's
# error is large in ulps of the cluster's tiny distances; an improvement's "elsewhere" figure read
# that error ("15.3 -> 1.02e+04 ulp") instead of the other inputs'.
CDIST = '''
import torch


def _sq(x, y):
    x2, y2 = (x ** 2).sum(-1), (y ** 2).sum(-1)
    return x2[..., :, None] + y2[..., None, :] + torch.einsum("b i d, b j d -> b i j", x, y) * -2


def cdist_fixed(x, y):
    return _sq(x, y).clamp(min=0).sqrt()


def cdist_buggy(x, y):
    return _sq(x, y).sqrt()
'''


def _cdist_verdict(tmp_path, monkeypatch, head_fn, base_fn):
    import numpy as np

    from gate.config import parse_config
    from gate.judge.decide import GateSettings, decide
    from gate.judge.replay import replay
    from gate.plan import Variant
    from gate.search.inputs import Candidate

    (tmp_path / "cdistbed.py").write_text(CDIST)
    monkeypatch.syspath_prepend(str(tmp_path))
    rows = "\n".join(f"  - {{name: {fn}, callable: 'cdistbed:{fn}', dims: {{N: [4, 4]}}, "
                     f"inputs: [{{name: x, shape: [1, N, 8]}}, {{name: y, shape: [1, N, 8]}}]}}"
                     for fn in (head_fn, base_fn))
    cfg = parse_config(f"version: 1\nframework: torch\nbuiltin: false\nops:\n{rows}\n", root=tmp_path)
    spec = {o.name: o for o in cfg.ops}
    rng = np.random.default_rng(0)
    cluster = (rng.standard_normal((1, 1, 8)) * 10 + rng.standard_normal((1, 4, 8)) * 1e-3).astype(np.float32)
    apart = rng.standard_normal((2, 1, 4, 8)).astype(np.float32)
    cands = [Candidate(dims={"N": 4}, params={}, arrays={"x": cluster.astype(np.float64), "y": cluster.astype(np.float64)}),
             Candidate(dims={"N": 4}, params={}, arrays={"x": apart[0].astype(np.float64), "y": apart[1].astype(np.float64)})]
    v = Variant("float32")
    head, base = replay(spec[head_fn], v, cands), replay(spec[base_fn], v, cands)
    verdict = decide(spec[head_fn], v, head, base, None, "ok", None, GateSettings(), inputs=["cluster", "apart"],
                     controls=[False, True])
    return verdict, head, base


def test_a_clamp_that_fixes_nan_is_an_improvement_measured_elsewhere_and_its_revert_fails(tmp_path, monkeypatch):
    fix, head, base = _cdist_verdict(tmp_path, monkeypatch, "cdist_fixed", "cdist_buggy")
    assert base[0].metrics.nonfinite or any(np.isnan(np.asarray(o)).any() for o in base[0].outputs)  # the NaN fixed
    assert head[0].metrics.ulp > head[1].metrics.ulp  # the premise: head's error is larger on the fixed input
    assert fix.outcome == "improvement" and fix.reason.startswith("head fixes NaN/Inf"), (fix.outcome, fix.reason)
    assert fix.head_error == head[1].metrics.ulp, (fix.reason, head[0].metrics.ulp, head[1].metrics.ulp)
    revert, _, _ = _cdist_verdict(tmp_path, monkeypatch, "cdist_buggy", "cdist_fixed")
    assert revert.outcome == "regression" and revert.reason.startswith("new NaN/Inf"), (revert.outcome, revert.reason)


# piqa's MDSI gradient map (hypot since piqa 5ac2e7d, the square root of the squares before it):
# the fix removes the forward's float16 overflow (gx*gx beyond 65504); torch's hypot backward
# (grad * x / result) overflows at the range's end, where base's gradient through the
# overflowed square read 0 for a true -2.2. That new Inf, only on inputs where head fixed the
# forward (base's own forward overflowed), is reported, not failed; the revert's new Inf in the
# forward, where base was right, fails.
MAGNITUDE = '''
import torch


def magnitude(x):
    gx = (x[:, :, 1:] - x[:, :, :-1])[:, :-1, :]
    gy = (x[:, 1:, :] - x[:, :-1, :])[:, :, :-1]
    return torch.hypot(gx, gy)
'''
MAG_CONFIG = BED_HEADER + '''ops:
  - {name: lib.magnitude, callable: "lib.ops:magnitude", kind: composite, sources: [lib/ops.py], dtypes: [float16],
     modes: [input], layouts: {}, dims: {N: [1, 2], H: [3, 6], W: [3, 6]}, inputs: [{name: x, shape: [N, H, W]}]}
'''
HYPOT, SQUARES = "torch.hypot(gx, gy)", "torch.sqrt(gx * gx + gy * gy)"


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_hypot_for_the_square_root_of_squares_passes_and_its_revert_fails(tmp_path, dtype):
    # float32: the forward's search does not reach base's overflow at 1.8e19; the gradient's new
    # Inf at 1.7e38, where base's forward overflowed, is judged so on its own (it failed before)
    repo = make_repo(tmp_path / "mag", MAGNITUDE, config=MAG_CONFIG.replace("[float16]", f"[{dtype}]"), package="lib")
    branch(repo, "squares", "main", HYPOT, SQUARES)  # the revert, on a base that has the fix
    branch(repo, "hypot", "squares", SQUARES, HYPOT)  # the fix, on its parent
    import subprocess

    subprocess.run(["git", "-C", str(repo), "checkout", "-q", "squares"], check=True)
    code, report = run_gate(repo, tmp_path / "revert", "main", "lib.magnitude", dtype, evals=30)
    regs = [v for v in by_op(report, "lib.magnitude") if v.outcome == "regression"]
    assert code == 1 and any("new NaN/Inf" in v.reason for v in regs), outcomes(report, "lib.magnitude")
    subprocess.run(["git", "-C", str(repo), "checkout", "-q", "hypot"], check=True)
    code, report = run_gate(repo, tmp_path / "fix", "squares", "lib.magnitude", dtype, evals=30)
    rows = by_op(report, "lib.magnitude")
    assert code in PASSED and all(v.outcome != "regression" for v in rows), outcomes(report, "lib.magnitude")
    grad = [v for v in rows if v.variant.get("oracle") == "grad"]
    assert grad and grad[0].reported_only and grad[0].details.get("gradient_of_a_fix"), \
        outcomes(report, "lib.magnitude")
