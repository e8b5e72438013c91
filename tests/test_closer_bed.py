"""The judge's "head's output is the closer one" rule (gate.judge.decide: closer_than_base) on a
gate run, both directions of the fix it was made for: hdmquan/torch_activation 8a95aa8, PSerf's
softplus ``log(1 + exp(x))`` -> ``log1p(exp(x))``.

* the fix must pass: at x = -90 the new formula's float32 output is -8.3e-38 against its float64
  run's, ~200 ulp of float32's subnormals, where base's formula gave 0 in both precisions (its
  error "0"); but head's float64 value moved there (0 -> -8.3e-38), and base's float32 output is
  further from it than head's: head lost nothing base delivered (reported, not failed). At x = -20
  it is an improvement (base's float32 ``log(1 + 2e-9)`` is 0).
* the revert must fail: at x = -20 head's float32 output is 0 where the float64 value is ~2e-8.

The library's tests call it at those two points (as a user's tests of the tail would); init
records the calls, and the run replays them on head and base."""
from __future__ import annotations

import json

import pytest

from tests.test_init import _cli, _refresh_then_run_pr, git

LIB = '''import torch


def pserf(x, a=1.0, b=1.0):
    """x * erf(a * softplus(b * x)) (torch_activation's PSerf)."""
    softplus = {SOFTPLUS}
    return x * torch.erf(a * softplus)
'''
LOG = "torch.log(1 + torch.exp(torch.clamp(b * x, max=20)))"
LOG1P = "torch.log1p(torch.exp(torch.clamp(b * x, max=20)))"
TESTS = '''import torch

from pserflib import pserf


def test_pserf():
    torch.manual_seed(0)
    assert pserf(torch.randn(8)).shape == (8,)


def test_pserf_far_tail():
    for v in (-20.0, -90.0):
        assert torch.isfinite(pserf(torch.tensor([v]))).all()
'''


@pytest.mark.slow
@pytest.mark.parametrize("direction", ["fix", "revert"])
def test_the_log1p_fix_passes_reported_and_its_revert_fails(tmp_path, direction):
    base, head = (LOG, LOG1P) if direction == "fix" else (LOG1P, LOG)
    repo = tmp_path / "pserfrepo"
    (repo / "pserflib").mkdir(parents=True)
    src = repo / "pserflib" / "__init__.py"
    src.write_text(LIB.replace("{SOFTPLUS}", base))
    (repo / "tests").mkdir()
    (repo / "tests" / "test_pserf.py").write_text(TESTS)
    git(tmp_path, "init", "-q", "-b", "main", str(repo))
    res = _cli(repo, "init", "--no-workflows")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    res = _refresh_then_run_pr(repo, tmp_path / "out", 30, src, LIB.replace("{SOFTPLUS}", head), direction)
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    rows = [(v["variant"]["dtype"], v["variant"]["mode"], v["variant"].get("oracle"), v["outcome"], v["reason"])
            for v in report["verdicts"]]
    if direction == "revert":
        assert res.returncode == 1, rows
        assert any(o == "regression" and d == "float32" for d, _, _, o, _ in rows), rows
        return
    assert res.returncode == 0, rows
    closer = [v for v in report["verdicts"] if v["details"].get("closer_than_base")]
    assert closer and all(v["outcome"] == "behaviour-change" for v in closer), rows
    assert any(o == "improvement" for *_, o, _ in rows), rows
