"""`dl-gate baseline refresh` measures one operator per core (issue 28: init + refresh of a library
within minutes on a 2-core runner): the same rows as one process, every message relayed, and an
operator that cannot be measured costs only its own rows."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gate.commands.baseline import refresh_jobs
from gate.errors import GateError
from tests.helpers.gitrepo import GitRepo

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "gate" / "example"
MISSING = """  - name: oplib.missing
    callable: oplib.nothere:fn
    inputs:
      - {name: x, shape: [N]}
    dims: {N: [1, 8]}
"""


def _library(path: Path, extra: str = "") -> Path:
    """The bundled example library (five operators) as a user's repository."""
    repo = GitRepo.init(path)
    shutil.copytree(EXAMPLE / "oplib", path / "oplib")
    (path / ".dl-gate.yml").write_text((EXAMPLE / "dl-gate.yml").read_text() + extra)
    repo.commit("oplib")
    return path


def _refresh(repo: Path, *flags: str, jobs_env=None):
    env = {k: v for k, v in os.environ.items() if k != "DL_GATE_JOBS"}
    if jobs_env is not None:
        env["DL_GATE_JOBS"] = jobs_env
    env["PYTHONPATH"] = str(ROOT)
    # the refresh says at its end whether it imported torch itself (its operators run in workers)
    code = ("import sys; from gate.cli import main; rc = main(sys.argv[1:]); "
            "print('imported torch:', 'torch' in sys.modules); sys.exit(rc)")
    return subprocess.run([sys.executable, "-W", "ignore", "-c", code, "baseline", "refresh", "--evals", "12",
                           "--dtype", "float32", *flags], cwd=repo, capture_output=True, text=True, env=env)


def _rows(repo: Path) -> dict:
    """Every baseline row, less the seconds it took (the one figure a second process changes)."""
    out = {}
    for f in sorted((repo / "baselines").glob("*.json")):
        doc = json.loads(f.read_text())
        for r in doc["rows"]:
            r.pop("seconds", None)
        out[f.name] = doc
    return out


def test_two_processes_write_the_rows_one_writes(tmp_path):
    one = _library(tmp_path / "one")
    two = _library(tmp_path / "two")
    a = _refresh(one, "--jobs", "1")
    assert a.returncode == 0, a.stderr[-2000:]
    b = _refresh(two, "--jobs", "2")
    assert b.returncode == 0, b.stderr[-2000:]
    assert "5 operator(s), 2 at a time (--jobs)" in b.stderr and "at a time" not in a.stderr
    # the measuring process asks a worker which devices there are: it never imports torch (~1.2 s of CPU)
    assert "imported torch: False" in a.stdout and "imported torch: False" in b.stdout, a.stdout[-500:]
    rows = _rows(one)
    assert len(rows) == 5 and rows == _rows(two)  # the same inputs searched with the same seeds
    # every variant's progress line reaches the user from the pool's processes, each once
    said = [ln for ln in b.stderr.splitlines() if " measuring " in ln]
    assert sorted(said) == sorted(ln for ln in a.stderr.splitlines() if " measuring " in ln) and len(said) == 15  # 3 float32 variants each
    assert sorted(p.name for p in (one / "baselines" / "corpus").iterdir()) == \
        sorted(p.name for p in (two / "baselines" / "corpus").iterdir())


def test_by_default_one_operator_per_core_and_a_failed_operator_costs_only_its_rows(tmp_path):
    repo = _library(tmp_path / "lib", MISSING)
    res = _refresh(repo)  # no --jobs, no DL_GATE_JOBS: the cores this process may use, at most 4
    cores = len(os.sched_getaffinity(0))
    jobs = min(4, cores, 6)
    assert (f"6 operator(s), {jobs} at a time" in res.stderr) == (jobs > 1), res.stderr[-2000:]
    assert res.returncode == 2, res.stderr[-2000:]
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("dl-gate: error: 1 operator(s) could not be measured, e.g. oplib.missing: cannot import"), last
    assert "(the other rows were written)" in last
    assert sorted(p.name for p in (repo / "baselines").glob("*.json")) == [
        f"oplib.{n}.json" for n in ("gelu", "layer_norm", "log_softmax", "rms_norm", "softmax")]


def test_how_many_processes(monkeypatch):
    monkeypatch.delenv("DL_GATE_JOBS", raising=False)
    monkeypatch.setenv("DL_GATE_THREADS", "1")
    cores = len(os.sched_getaffinity(0))
    assert refresh_jobs(None, 100, isolate=True) == min(4, cores)
    assert refresh_jobs(None, 1, isolate=True) == 1  # never more processes than operators
    assert refresh_jobs(8, 3, isolate=True) == 3 and refresh_jobs(2, 3, isolate=True) == 2
    assert refresh_jobs(2, 3, isolate=None) == 1  # without isolation the library runs in the measuring process
    monkeypatch.setenv("DL_GATE_THREADS", "0")  # every call on every core: one at a time
    assert refresh_jobs(None, 100, isolate=True) == 1
    monkeypatch.setenv("DL_GATE_THREADS", str(2 * cores))
    assert refresh_jobs(None, 100, isolate=True) == 1
    monkeypatch.setenv("DL_GATE_JOBS", "3")
    assert refresh_jobs(None, 100, isolate=True) == 3
    monkeypatch.setenv("DL_GATE_JOBS", "many")
    with pytest.raises(GateError, match="DL_GATE_JOBS must be a whole number"):
        refresh_jobs(None, 100, isolate=True)
    with pytest.raises(GateError, match="at least 1"):
        refresh_jobs(0, 100, isolate=True)


def test_a_bad_jobs_variable_leaves_inits_plan_at_one_process(monkeypatch):
    from gate.commands.init import refresh_plan

    monkeypatch.setenv("DL_GATE_JOBS", "many")  # the refresh says so itself; init has written its file by then
    assert refresh_plan(22, 10.0) == ("22 operators x 10s, at least 4 min", None)


def test_a_config_that_cannot_be_sent_to_another_process_is_measured_in_this_one(tmp_path, monkeypatch):
    from gate.commands.baseline import _OpJob, _measure_all

    measured = []
    monkeypatch.setattr("gate.commands.baseline._measure_op",
                        lambda job, k, name, say: measured.append(name) or ({name: "torch"}, []))
    said = []
    job = _OpJob(cfg=lambda: None, catalog=None, kernels=None, per_op=None, evals=1, seed=0, dtypes=None, devices=None,
                 modes=None, oracles=None, seed_store=None, isolate=True, n=2)  # a lambda: not picklable
    out = list(_measure_all(job, ["a", "b"], 2, said.append))
    assert [n for n, _ in out] == ["a", "b"] == measured
    assert said and said[0].startswith("measuring in one process: the config cannot be sent"), said
