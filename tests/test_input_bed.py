"""Inputs real callers pass, and gradients by default (issue 12, items 3 and 4), end to end:
a real git repository with an operator library, a real base replay in a worktree process, real
torch. Each case is modelled on a real fix in an operator library (cited per case); on a
repository whose ``main`` has the bug, the fix PR passes, and the revert of the fix (a PR on
the fixed branch) fails with the right outcome."""
import json
import os
import subprocess
from pathlib import Path

import pytest

from gate.cli import main
from gate.judge.verdict import GateReport
from tests.test_gate_run import git, make_repo

# main carries each bug; FIXES[name] = (bug, fix) is the PR that fixes it
BUGGY_OPS = '''
import enum

import torch


def max_response(x):
    """Strongest response per batch item."""
    return x.view(x.size(0), -1).amax(dim=1)


def l2_normalize(x, eps: float = 2.0 ** -20):
    sq = (x * x).sum(dim=-1, keepdim=True)
    inv = torch.minimum(torch.rsqrt(sq), torch.full_like(sq, 1.0 / eps))
    return x * inv


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(q, angles):
    a = angles.to(q.dtype)
    return q * a.cos() + _rotate_half(q) * a.sin()


class QuaternionCoeffOrder(enum.Enum):
    XYZW = "xyzw"
    WXYZ = "wxyz"


def quaternion_to_matrix(quaternion, order=QuaternionCoeffOrder.XYZW):
    q = quaternion / quaternion.norm(dim=-1, keepdim=True)
    if order.name == "XYZW":
        x, y, z, w = q.unbind(-1)
    else:
        w, x, y, z = q.unbind(-1)
    return torch.stack([
        1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w),
        2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w),
        2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)], dim=-1)


def masked_log_softmax(x, mask):
    return torch.log_softmax(x + torch.log(mask.to(x.dtype)), dim=-1)
'''

FIXES = {
    # kornia/kornia#1597 (scale_space_detector: `response_max.view(B, -1)` raised "view size is
    # not compatible with input tensor's size and stride" on a non-contiguous response; fixed by
    # `.reshape`); the revert is a crash on transposed/strided inputs only
    "view": ("x.view(x.size(0), -1)", "x.reshape(x.size(0), -1)"),
    # keras-team/keras#23093 (fixes #23075): L2 normalize clamped rsqrt's *output*
    # (`minimum(rsqrt(sq), 1/eps)`), so a zero vector's forward is right and its gradient NaN
    # (0 * inf in rsqrt's backward); the fix clamps the input (`rsqrt(max(sq, eps**2))`).
    # Forward bit-identical (eps = 2^-20: rsqrt(eps^2) = 1/eps exactly), backward only.
    "eps": ("torch.minimum(torch.rsqrt(sq), torch.full_like(sq, 1.0 / eps))",
            "torch.rsqrt(torch.clamp(sq, min=eps * eps))"),
    # huggingface/diffusers#13922 and EleutherAI/gpt-neox#1003: rotary angles rounded to the
    # model's bfloat16 before cos/sin (bf16 spacing at 1000 rad is 8 rad); the fix computes
    # cos/sin in float32 and rounds the result. Only expressible with `dtype: float32` on the
    # angles input (otherwise the gate itself rounds them to bfloat16 for both versions).
    "rotary": ("    a = angles.to(q.dtype)\n    return q * a.cos() + _rotate_half(q) * a.sin()",
               "    cos, sin = angles.cos().to(q.dtype), angles.sin().to(q.dtype)\n"
               "    return q * cos + _rotate_half(q) * sin"),
    # kornia's quaternion_to_rotation_matrix(quaternion, order: QuaternionCoeffOrder) (the enum
    # parameter of kornia/kornia#926 and #2437) normalises with normalize_quaternion, i.e.
    # F.normalize(q, p=2, eps=1e-12) in kornia/geometry/conversions.py; dividing by the bare norm
    # makes a zero quaternion NaN. The enum parameter is given by import path: before, every
    # evaluation failed with "'str' object has no attribute 'name'".
    "enum": ("q = quaternion / quaternion.norm(dim=-1, keepdim=True)",
             "q = torch.nn.functional.normalize(quaternion, p=2.0, dim=-1, eps=1e-12)"),
    # allenai/allennlp#890: masked_log_softmax returned NaN for a fully masked row (log of an
    # all-zero mask); a boolean mask input with a fully masked row is a structured row
    "mask": ("    return torch.log_softmax(x + torch.log(mask.to(x.dtype)), dim=-1)\n",
             "    out = torch.log_softmax(x + torch.log(mask.to(x.dtype)), dim=-1)\n"
             "    return out.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)\n"),
}

OPS_OF = {"view": "bed.max_response", "eps": "bed.l2_normalize", "rotary": "bed.apply_rotary",
          "enum": "bed.quaternion_to_matrix", "mask": "bed.masked_log_softmax"}

CONFIG = '''
version: 1
framework: torch
python_path: ["."]
builtin: false
budget: {localise: 20}  # the bed judges verdicts: localisation gets a short share
gate: {dtypes: [float32]}
ops:
  - name: bed.max_response
    callable: bedlib.ops:max_response
    kind: reduction
    dims: {N: [2, 4], C: [2, 4], D: [2, 6]}
    inputs: [{name: x, shape: [N, C, D]}]
  - name: bed.l2_normalize
    callable: bedlib.ops:l2_normalize
    kind: normalization
    dims: {N: [1, 4], D: [1, 8]}
    inputs: [{name: x, shape: [N, D], domain: {name: real, scale: 2}}]
  - name: bed.apply_rotary
    callable: bedlib.ops:apply_rotary
    kind: composite
    dtypes: [bfloat16]
    dims: {N: [1, 8], H: [1, 8]}
    inputs:
      - {name: q, shape: [N, "2*H"]}
      - {name: angles, shape: [N, "2*H"], dtype: float32, domain: {lo: 0, hi: 4096}}
  - name: bed.quaternion_to_matrix
    callable: bedlib.ops:quaternion_to_matrix
    kind: composite
    params:
      order: {choices: [{import: bedlib.ops.QuaternionCoeffOrder.XYZW}, {import: bedlib.ops.QuaternionCoeffOrder.WXYZ}]}
    dims: {N: [1, 8]}
    inputs: [{name: quaternion, shape: [N, 4], domain: {name: real, scale: 1}}]
  - name: bed.masked_log_softmax
    callable: bedlib.ops:masked_log_softmax
    kind: normalization
    dims: {N: [2, 6], D: [2, 12]}
    inputs:
      - {name: x, shape: [N, D], domain: {name: real, scale: 3}}
      - {name: mask, shape: [N, D], kind: bool}
'''


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    return make_repo(tmp_path_factory.mktemp("bed"), ops_src=BUGGY_OPS, config=CONFIG, package="bedlib")


def branch(repo: Path, name: str, start: str, old: str, new: str):
    git(repo, "checkout", "-q", "-B", name, start)
    path = repo / "bedlib" / "ops.py"
    src = path.read_text()
    assert old in src, (name, old)
    path.write_text(src.replace(old, new, 1))
    git(repo, "commit", "-q", "-am", name)


def run_gate(repo: Path, out: Path, base: str, evals: int = 30, seed: int = 0):
    old = os.getcwd()
    os.chdir(repo)
    try:
        code = main(["run", "--base", base, "--out", str(out), "--evals", str(evals), "--seed", str(seed)])
    finally:
        os.chdir(old)
    report = GateReport.from_dict(json.loads((out / "report.json").read_text()))
    assert report.exit_code == code
    return code, report


def clone(bed: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(bed), str(dst)], check=True)
    git(dst, "checkout", "-q", "main")
    return dst


def summary(report):
    return [(v.id, v.outcome, v.reason, v.input_summary) for v in report.verdicts]


@pytest.mark.parametrize("case,variant,outcome,needle", [
    ("view", "float32/cpu/input/noncontiguous", "regression", "crash"),
    ("eps", "float32/cpu/input/grad", "regression", "NaN/Inf"),
    ("rotary", "bfloat16/cpu/input", "regression", "ulp >"),
    ("enum", "float32/cpu/input", "regression", "NaN/Inf"),
    ("mask", "float32/cpu/input", "regression", "NaN/Inf"),
])
def test_fix_passes_and_its_revert_fails(bed, tmp_path, case, variant, outcome, needle):
    repo = clone(bed, tmp_path)
    old, new = FIXES[case]
    branch(repo, f"fix-{case}", "main", old, new)
    code, report = run_gate(repo, tmp_path / "fix", "main")
    assert {s["op"] for s in report.selected} == {OPS_OF[case]}
    assert code == 0 and report.outcome == "pass", summary(report)
    branch(repo, f"revert-{case}", f"fix-{case}", new, old)
    code, report = run_gate(repo, tmp_path / "revert", f"fix-{case}")
    assert code == 1, summary(report)
    hit = [v for v in report.verdicts if v.op == OPS_OF[case] and Variant_key(v) == variant]
    assert hit and hit[0].outcome == outcome and needle in hit[0].reason, summary(report)
    if case == "rotary":  # the cast is blamed, not the cos that amplifies its rounding
        sub = (hit[0].diagnosis or {}).get("suboperation") or {}
        assert sub.get("call") == "to" and "amplifies" in sub.get("how", ""), hit[0].diagnosis
    if case == "eps":  # a backward-only bug: the forward verdict is not what fails
        fwd = [v for v in report.verdicts if Variant_key(v) == "float32/cpu/input"]
        assert fwd and fwd[0].outcome not in ("regression", "behaviour-change"), summary(report)


def Variant_key(v) -> str:
    from gate.plan import Variant

    return Variant.from_dict(v.variant).key


def test_benign_refactor_passes(bed, tmp_path):
    repo = clone(bed, tmp_path)
    old, new = FIXES["view"]
    branch(repo, "fix-view", "main", old, new)
    branch(repo, "refactor", "fix-view", new, "torch.flatten(x, 1)")
    code, report = run_gate(repo, tmp_path / "refactor", "fix-view", seed=3)
    assert code == 0 and report.outcome == "pass", summary(report)
    assert any(Variant_key(v).endswith("/grad") for v in report.verdicts)  # gradients judged by default


def test_a_parameter_import_that_fails_is_a_one_line_error_not_fewer_evaluations(bed, tmp_path):
    repo = clone(bed, tmp_path)
    cfg = repo / ".dl-gate.yml"
    cfg.write_text(cfg.read_text().replace("QuaternionCoeffOrder.WXYZ}", "QuaternionCoeffOrder.WXZY}"))
    git(repo, "commit", "-q", "-am", "typo")
    # and a change of the operator, so that it is selected and its parameters are needed
    branch(repo, "typo-and-fix", "HEAD", *FIXES["enum"])
    out = tmp_path / "out"
    old = os.getcwd()
    os.chdir(repo)
    try:
        code = main(["run", "--base", "main", "--out", str(out), "--evals", "5"])
    finally:
        os.chdir(old)
    report = json.loads((out / "report.json").read_text())
    assert code == 2 and report["outcome"] == "error"
    reason = report["reason"]
    assert "\n" not in reason
    assert "bed.quaternion_to_matrix" in reason and "parameter order" in reason
    assert "bedlib.ops.QuaternionCoeffOrder.WXZY" in reason
