"""An upcast fix that returns the wider dtype, gated end to end (issues 31 and 28). Modelled on
facebookresearch/fvcore bfff2ef ("don't use fp16 in focal loss"): ``sigmoid_focal_loss`` and
``sigmoid_focal_loss_star`` begin with ``inputs = inputs.float()`` (and the targets), so a float16
caller gets a float32 loss computed in float32. The acceptance run on fvcore failed the fix as a
behaviour change ("the output dtype changed") and, where a float32 sum went beyond float16's range,
as a 3e7-ulp regression (the error of a float32 value of 2.6e10 counted in ulps of 65504).

The model: a side that returns a wider dtype is judged as it is (what its callers get) in the
variant's ulps, beyond the dtype's range too (the same digits as if its exponent went on), against
the other side's output on the same inputs; the changed dtype is reported with what to do once
merged. The fix passes with that warning; its revert, computing the loss in float16 again, fails."""
from __future__ import annotations

import pytest

from tests.helpers.repro import assert_repro_head_then_base
from tests.test_gate_run import gate, git, make_repo

FIXED = '''import torch
import torch.nn.functional as F


def sigmoid_focal_loss(inputs, targets, alpha: float = 0.25, gamma: float = 2, reduction: str = "none"):
    inputs = inputs.float()
    targets = targets.float()
    p = torch.sigmoid(inputs)
    ce_loss = F.binary_cross_entropy_with_logits(inputs, targets, reduction="none")
    p_t = p * targets + (1 - p) * (1 - targets)
    loss = ce_loss * ((1 - p_t) ** gamma)
    if alpha >= 0:
        alpha_t = alpha * targets + (1 - alpha) * (1 - targets)
        loss = alpha_t * loss
    if reduction == "mean":
        loss = loss.mean()
    elif reduction == "sum":
        loss = loss.sum()
    return loss


def sigmoid_focal_loss_star(inputs, targets, alpha: float = -1, gamma: float = 1, reduction: str = "none"):
    inputs = inputs.float()
    targets = targets.float()
    shifted_inputs = gamma * (inputs * (2 * targets - 1))
    loss = -(F.logsigmoid(shifted_inputs)) / gamma
    if alpha >= 0:
        alpha_t = alpha * targets + (1 - alpha) * (1 - targets)
        loss *= alpha_t
    if reduction == "mean":
        loss = loss.mean()
    elif reduction == "sum":
        loss = loss.sum()
    return loss
'''

UPCAST = "    inputs = inputs.float()\n    targets = targets.float()\n"
REVERTED = FIXED.replace(UPCAST, "")
assert REVERTED.count("float()") == 0 and FIXED.count(UPCAST) == 2

# what `dl-gate init` writes for fvcore (its tests pass 0/1 targets and logits of a few units)
CONFIG = '''version: 1
framework: torch
python_path: ["."]
builtin: false
budget: {localise: 8}
gate: {dtypes: [float16, bfloat16], behaviour_change: fail}
ops:
''' + "".join(f'''  - name: mylib.{fn}
    callable: mylib.ops:{fn}
    kind: composite
    sources: [mylib/ops.py]
    params: {{alpha: {{choices: [-1, 0.25, 1]}}, gamma: {{choices: [1, 2, 4]}}, reduction: {{choices: [none, mean, sum]}}}}
    dims: {{N: [1, 64]}}
    inputs:
      - {{name: inputs, shape: [4, N], domain: {{name: real, scale: 2.1}}}}
      - {{name: targets, shape: [4, N], domain: {{name: prob, lo: 0.0, hi: 1.0}}}}
''' for fn in ("sigmoid_focal_loss", "sigmoid_focal_loss_star"))


def _pr(tmp_path, base_src, head_src, name):
    repo = make_repo(tmp_path / name, ops_src=base_src, config=CONFIG)
    git(repo, "checkout", "-q", "-b", f"pr-{name}")
    (repo / "mylib" / "ops.py").write_text(head_src)
    git(repo, "commit", "-q", "-am", name)
    return repo


def _why(report):
    return [(v.key, v.outcome, v.reason) for v in report.verdicts]


def test_the_upcast_fix_passes_and_says_the_output_dtype_changed(tmp_path):
    repo = _pr(tmp_path, REVERTED, FIXED, "fix")
    code, report = gate(repo, tmp_path, evals=40)
    assert code == 0, _why(report)
    low = [v for v in report.verdicts if "/grad" not in v.key]
    assert low and all(v.outcome in ("pass", "improvement") for v in low), _why(report)
    changed = [v for v in low if v.details.get("output_dtype_changed")]
    assert changed and all("drop " in v.details["warning"] for v in changed), _why(report)
    # measured as they are: a float32 loss errs by well under one float16 ulp, beyond 65504 too
    assert all(v.head_error is not None and v.head_error < 1.0 for v in changed), \
        [(v.key, v.head_error) for v in changed]


def test_its_revert_fails_and_the_repro_agrees(tmp_path):
    repo = _pr(tmp_path, FIXED, REVERTED, "revert")
    code, report = gate(repo, tmp_path, evals=40)
    assert code == 1, _why(report)
    failed = [v for v in report.verdicts if v.outcome == "regression"]
    assert any(v.key.startswith("float16") for v in failed), _why(report)
    assert not any(v.outcome == "behaviour-change" for v in report.verdicts), _why(report)
    for op in sorted({v.op for v in failed}):  # one repro per operator (the suite's time)
        v = next(v for v in failed if v.op == op)
        git(repo, "checkout", "-q", "pr-revert")
        assert_repro_head_then_base(v.diagnosis["repro_script"], repo)
