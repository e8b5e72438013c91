"""Running a repro script the gate wrote, as a reviewer does: on head it must exit 1 (the finding
reproduces), on base 0 (checked out in the same repository)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.test_gate_run import git


def assert_repro_head_then_base(script: str, repo: Path, base: str = "main") -> None:
    """``script`` exits 1 where the PR's branch is checked out, then 0 on ``base``."""
    on_head = subprocess.run([sys.executable, "-W", "ignore", script], capture_output=True, text=True)
    assert on_head.returncode == 1, on_head.stdout + on_head.stderr
    git(repo, "checkout", "-q", base)
    on_base = subprocess.run([sys.executable, "-W", "ignore", script, "--repo", str(repo)], capture_output=True,
                             text=True)
    assert on_base.returncode == 0, on_base.stdout + on_base.stderr
