"""The gate's main job with isolation (``gate.isolate: true``): a PR whose operator segfaults
is a regression ("head crashes where base returns") and the gate process survives the
fuzzing, the head replay and the base replay of the crashing input; oracles named in
``gate.oracles`` are planned and judged like any other variant."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from gate.cli import main
from gate.judge.verdict import GateReport

ROOT = Path(__file__).resolve().parents[1]

OPS = '''
import ctypes

import torch


def smooth(x):
    return x * torch.sigmoid(x)
'''

CONFIG = '''
version: 1
framework: torch
python_path: ["."]
builtin: false
budget: {localise: 10}
gate: {dtypes: [float32], modes: [input], isolate: true, eval_timeout: 10, oracles: [precision, grad]}
ops:
  - name: mylib.smooth
    callable: mylib.ops:smooth
    kind: activation
    grad: true
    sources: [mylib/ops.py]
    dims: {N: [1, 16]}
    inputs: [{name: x, shape: [N], domain: {name: real, scale: 3}}]
'''


def git(repo, *args):
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false",
                    *args], check=True, capture_output=True)


def test_segfaulting_pr_is_a_regression_and_the_gate_survives(tmp_path):
    repo = tmp_path / "repo"
    (repo / "mylib").mkdir(parents=True)
    (repo / "mylib" / "__init__.py").write_text("")
    (repo / "mylib" / "ops.py").write_text(OPS)
    (repo / ".dl-gate.yml").write_text(CONFIG)
    git(tmp_path, "init", "-q", "-b", "main", str(repo))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-m", "gate.cli", "baseline", "refresh", "--evals", "12", "--seed", "0"],
                         cwd=repo, capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = json.loads((repo / "baselines" / "mylib.smooth.json").read_text())["rows"]
    # (the default non-contiguous layout of a user operator is measured too)
    assert {r["variant"] for r in rows} == {"float32/cpu/input", "float32/cpu/input/grad", "float32/cpu/input/noncontiguous"}
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "baselines")

    git(repo, "checkout", "-q", "-b", "pr")
    src = (repo / "mylib" / "ops.py").read_text()
    (repo / "mylib" / "ops.py").write_text(src.replace(
        "def smooth(x):\n", "def smooth(x):\n    if x.numel() > 3:  # a native fast path that dereferences NULL\n"
                           "        ctypes.string_at(0)\n"))
    git(repo, "commit", "-q", "-am", "fast path")

    out = tmp_path / "out"
    old = os.getcwd()
    os.chdir(repo)
    try:  # in this process: an unisolated head replay of the crashing input would kill pytest
        code = main(["run", "--base", "main", "--out", str(out), "--evals", "12", "--seed", "0"])
    finally:
        os.chdir(old)
    report = GateReport.from_dict(json.loads((out / "report.json").read_text()))
    assert code == 1 and report.outcome == "regression", [(v.key, v.outcome, v.reason) for v in report.verdicts]
    by_key = {v.key: v for v in report.verdicts}
    assert set(by_key) >= {"float32/cpu/input", "float32/cpu/input/grad"}
    for v in by_key.values():
        assert v.outcome == "regression" and "crash" in v.reason, (v.key, v.reason)
        assert v.head_crash and v.head_crash.startswith("SIGSEGV (Segmentation fault) in ops.py:"), v.head_crash
        assert v.diagnosis and not v.diagnosis.get("error"), v.diagnosis  # localised, in workers too
