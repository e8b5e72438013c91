"""The bundled example: a tiny PyTorch operator library (``oplib``) and two pull requests.

``dl-gate run --example [improve|regression]`` builds a real git repository in a temporary
directory from these files, records baselines on the base commit as the scheduled refresh would,
applies the PR on a branch and runs the gate on it.
"""
from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=dl-gate", "-c", "user.email=dl-gate@example.invalid",
                    "-c", "commit.gpgsign=false", *args], check=True, capture_output=True)


def build_repo(scenario: str, dest: Path) -> Path:
    repo = dest / "oplib-repo"
    shutil.copytree(HERE / "oplib", repo / "oplib", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(HERE / "dl-gate.yml", repo / ".dl-gate.yml")
    _git(repo.parent, "init", "-q", "-b", "main", str(repo))
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "oplib: initial operators")
    return repo


def apply_pr(repo: Path, scenario: str) -> None:
    pr = HERE / "prs" / scenario
    _git(repo, "checkout", "-q", "-b", f"pr/{scenario}")
    for f in (pr / "oplib").rglob("*.py"):
        shutil.copy(f, repo / "oplib" / f.relative_to(pr / "oplib"))
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", (pr / "PR.md").read_text().strip().splitlines()[0][:72])


def prepare_example(scenario: str, opts, say):
    """Build the example repo, refresh its baselines on main, check out the PR: options for run_gate."""
    import os
    import sys

    tmp = Path(tempfile.mkdtemp(prefix="dl-gate-example-"))
    repo = build_repo(scenario, tmp)
    say(f"example repository: {repo} (PR: {(HERE / 'prs' / scenario / 'PR.md').read_text().strip()})")
    # a separate process, as the scheduled refresh job is: the gate then imports the PR's code fresh
    env = {**os.environ, "PYTHONPATH": str(HERE.parent.parent) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    # with --evals the baselines are searched with the same deterministic budget as the PR
    # (before: 3 s in all whatever --evals said: rows that hung on the machine's speed)
    budget = ["--evals", str(opts.evals)] if opts.evals else ["--budget", "3"]
    say(f"recording baselines on main (what the scheduled refresh does): "
        + (f"{opts.evals} evaluations a variant" if opts.evals else "3s in all"))
    res = subprocess.run([sys.executable, "-m", "gate.cli", "baseline", "refresh", *budget],
                         cwd=repo, capture_output=True, text=True, env=env)
    if res.returncode != 0:
        from ..errors import GateError

        raise GateError(f"example baseline refresh failed: {(res.stderr.strip().splitlines() or ['?'])[-1]}")
    say(res.stdout.strip().splitlines()[-1])
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "baselines: refresh")
    apply_pr(repo, scenario)
    return replace(opts, repo=repo, base="main", head="HEAD", config=None,
                   budget_per_op=opts.budget_per_op or 5.0, budget_total=opts.budget_total or 60.0)
