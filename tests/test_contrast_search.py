"""The search asks base about the NaN/Inf it finds (gate.judge.contrast), so a NaN base shares
does not hide a new one (issue 12: "search that looks where base is fine").

The bed is modelled on torch.distributions.Categorical.entropy (pytorch/pytorch,
torch/distributions/categorical.py): the entropy is -(p * log p).sum() with log p taken from the
*logits* (log_softmax, clamped to finfo.min) so that a probability that underflows to 0 gives
0 * finite = 0, not 0 * -inf = NaN. The revert takes ``probs.log()`` again: a peaked row (one
logit ~100 above the rest in float32) becomes NaN. Both versions are NaN on rows near overflow
(x - max = -inf): the search reaches those first through its near-overflow mutators, and a
search that keeps the first NaN as its best never replays an input on which base was fine.
"""
from __future__ import annotations

import json

import pytest

from gate.cli import main
from tests.test_gate_run import git, make_repo

FIXED = '''
import torch


def entropy(x):
    logp = torch.log_softmax(x, dim=-1)
    logp = torch.clamp(logp, min=torch.finfo(logp.dtype).min)
    return -(logp.exp() * logp).sum(-1)
'''

REVERT = FIXED.replace("""    logp = torch.log_softmax(x, dim=-1)
    logp = torch.clamp(logp, min=torch.finfo(logp.dtype).min)
    return -(logp.exp() * logp).sum(-1)""", """    p = torch.softmax(x, dim=-1)
    return -(p * p.log()).sum(-1)""")

REFACTOR = FIXED.replace("    return -(logp.exp() * logp).sum(-1)", "    p = logp.exp()\n    return -(p * logp).sum(dim=-1)")

CONFIG = """
version: 1
framework: torch
python_path: ["."]
builtin: false
gate: {dtypes: [float32], modes: [input]}
ops:
  - name: dist.entropy
    callable: dist.ops:entropy
    sources: [dist/ops.py]
    grad: false      # the bed is about the forward search (the default gradient and
    layouts: {}      # non-contiguous variants are tested in test_default_inputs.py)
    dims: {N: [1, 4], D: [2, 16]}
    inputs: [{name: x, shape: [N, D], domain: {name: real, scale: 4}}]
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return make_repo(tmp_path_factory.mktemp("entropy"), ops_src=FIXED, config=CONFIG, package="dist")


def run_pr(repo, tmp_path, monkeypatch, name: str, src: str, seed: int):
    git(repo, "checkout", "-q", "-B", f"pr-{name}", "main")
    (repo / "dist" / "ops.py").write_text(src)
    git(repo, "commit", "-q", "-am", name)
    out = tmp_path / f"{name}-{seed}"
    monkeypatch.chdir(repo)
    code = main(["run", "--base", "main", "--out", str(out), "--evals", "120", "--seed", str(seed)])
    return code, json.loads((out / "report.json").read_text())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_revert_fails_with_new_nan_and_the_search_said_why(repo, tmp_path, monkeypatch, seed):
    code, report = run_pr(repo, tmp_path, monkeypatch, "revert", REVERT, seed)
    (v,) = report["verdicts"]
    assert code == 1 and v["outcome"] == "regression" and "new NaN/Inf" in v["reason"], (v["outcome"], v["reason"])


def test_the_fix_and_a_refactor_pass(repo, tmp_path, monkeypatch):
    # the fix itself, seen as a PR onto the revert (base is the reverted code)
    git(repo, "checkout", "-q", "-B", "reverted", "main")
    (repo / "dist" / "ops.py").write_text(REVERT)
    git(repo, "commit", "-q", "-am", "reverted")
    git(repo, "checkout", "-q", "-B", "pr-fix", "reverted")
    (repo / "dist" / "ops.py").write_text(FIXED)
    git(repo, "commit", "-q", "-am", "fix")
    out = tmp_path / "fix"
    monkeypatch.chdir(repo)
    code = main(["run", "--base", "reverted", "--out", str(out), "--evals", "120", "--seed", "0"])
    report = json.loads((out / "report.json").read_text())
    (v,) = report["verdicts"]
    assert v["outcome"] in ("pass", "improvement", "needs-baseline") and code in (0, 3), (v["outcome"], v["reason"])
    for seed in range(3):
        code, report = run_pr(repo, tmp_path, monkeypatch, "refactor", REFACTOR, seed)
        assert code == 0, report["reason"]


CONTRAST_OPS = '''
import torch


def _scaled(x):
    s = (x * x).sum(-1, keepdim=True)  # inf in float32 past ~1.8e19, finite in float64: NaN on both sides
    return x * (s / s)


def base_norm(x):
    return _scaled(x)


def head_norm(x):
    # the planted bug: a row whose top two values are more than 2 apart becomes NaN, in any
    # dtype (an algorithmic 0/0, like a reverted bisection guard): head's float64 run is NaN too
    top = x.topk(2, dim=-1).values
    gap = (top[..., :1] - top[..., 1:]) > 2
    return torch.where(gap, torch.full_like(x, float("nan")), _scaled(x))
'''


def test_contrast_guidance_promotes_a_new_nan_and_demotes_a_shared_one(tmp_path):
    """The mechanism on its own: head's NaN on overflowing rows is shared with base (it must not
    be the best), head's NaN on peaked rows is new (it must become the best), although the
    plain objective scores the shared one as infinite and the new one not at all (head's own
    float64 run is NaN there too)."""
    import sys

    import numpy as np

    from gate.fuzz import fuzz_task
    from gate.oracles.registry import build_runner
    from gate.judge.contrast import ContrastRunner
    from tests.oracle_support import task, user_ops

    (tmp_path / "contrast_ops.py").write_text(CONTRAST_OPS)
    sys.path.insert(0, str(tmp_path))
    try:
        row = "  dims: {N: [1, 4], D: [2, 8]}\n  inputs: [{name: x, shape: [N, D], domain: {name: real, scale: 1}}]\n"
        specs = user_ops(tmp_path, f"- name: t.head\n  callable: contrast_ops:head_norm\n{row}"
                                   f"- name: t.base\n  callable: contrast_ops:base_norm\n{row}")
        t = task(specs["t.head"], "precision", seconds=None, evals=300)
        head, base = build_runner(specs["t.head"], t.variant), build_runner(specs["t.base"], t.variant)
        runner = ContrastRunner(head, base)
        finding = fuzz_task(t, runner=runner)
        assert runner.stats["new_nonfinite"] > 0, runner.stats
        _, hb = head.evaluate(finding.best, keep_outputs=True, quantized=True)
        _, bb = base.evaluate(finding.best, keep_outputs=True, quantized=True)
        h_out, b_out = np.asarray(hb.outputs[0].array), np.asarray(bb.outputs[0].array)
        assert (np.isnan(h_out) & np.isfinite(b_out)).any(), finding.best.summary()  # a new NaN is the best
    finally:
        sys.path.remove(str(tmp_path))


def test_head_sends_its_outputs_back_only_where_they_hold_a_nan(tmp_path):
    """keep_outputs="nonfinite": what the contrast runner asks of head, so an isolated worker ships
    its two large arrays only for the inputs the contrast looks at."""
    import sys

    import numpy as np

    from gate.oracles.registry import build_runner
    from gate.search.inputs import Candidate
    from tests.oracle_support import task, user_ops

    (tmp_path / "contrast_ops.py").write_text(CONTRAST_OPS)
    sys.path.insert(0, str(tmp_path))
    try:
        row = "  dims: {N: [1, 4], D: [2, 8]}\n  inputs: [{name: x, shape: [N, D], domain: {name: real, scale: 1}}]\n"
        specs = user_ops(tmp_path, f"- name: t.head\n  callable: contrast_ops:head_norm\n{row}")
        head = build_runner(specs["t.head"], task(specs["t.head"], "precision", seconds=None, evals=1).variant)
        flat = Candidate(dims={"N": 1, "D": 3}, params={}, arrays={"x": np.array([[0.5, 0.25, 1.0]])})
        peaked = Candidate(dims={"N": 1, "D": 3}, params={}, arrays={"x": np.array([[9.0, 0.25, 1.0]])})
        _, ev = head.evaluate(flat, keep_outputs="nonfinite")
        assert ev.outputs is None and ev.reference is None
        _, ev = head.evaluate(peaked, keep_outputs="nonfinite")
        assert ev.outputs is not None and np.isnan(ev.outputs[0].array).all()
        _, ev = head.evaluate(flat, keep_outputs=True)
        assert ev.outputs is not None  # asked for: always
    finally:
        sys.path.remove(str(tmp_path))
