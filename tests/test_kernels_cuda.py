"""C++/CUDA extension operators: a ``CUDAExtension`` library as a real git repository
(tests/beds/cuda_ext.py). Selection through the ``.cu`` file runs everywhere; the build (nvcc),
the baselines and the gate run on CUDA variants run on a GPU runner and are skipped visibly
elsewhere."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gate.judge.verdict import GateReport
from tests.beds import cuda_ext as C
from tests.helpers.gitrepo import GitRepo

ROOT = Path(__file__).resolve().parent.parent


def _lib(path: Path) -> GitRepo:
    repo = GitRepo.init(path)
    repo.write(C.FILES, dedent=False)
    repo.commit("lncuda: layer_norm and rms_norm CUDA kernels")
    return repo


def test_selection_follows_a_device_helper_through_the_kernel_launch_to_the_binding(tmp_path):
    from gate.config import load_config
    from gate.ops.catalog import load_catalog
    from gate.select import select_ops

    repo = _lib(tmp_path / "lib")
    repo.branch("pr")
    C.apply_pr(repo.path, "one_pass_variance")
    repo.commit("one pass")
    cfg = load_config(repo.path / ".dl-gate.yml")
    sel = select_ops(repo.path, "main", "HEAD", load_catalog(cfg.ops, builtin=()), cfg)
    assert sel.op_names() == ["lncuda.layer_norm"]  # rms_norm_kernel shares nothing with it
    path = sel.selected[0].reasons[0].path
    assert path[0].endswith("row_moments") and "pybind::layer_norm_forward" in path, path
    assert path[-2:] == ["lncuda.ops:layer_norm", "lncuda.layer_norm"]


def _cli(repo: Path, cache: Path, *args: str) -> subprocess.CompletedProcess:
    """A fresh process per run, as the CLI runs (two builds of one extension in one process
    would share its symbols); builds cached in one directory for the module."""
    code = f"import sys; from gate.cli import main; sys.exit(main({list(args)!r}))"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DL_GATE_BUILD_CACHE": str(cache)}
    return subprocess.run([sys.executable, "-W", "ignore", "-c", code], cwd=repo, capture_output=True, text=True, env=env)


@pytest.fixture(scope="module")
def cu_repo(tmp_path_factory):
    """``main`` with baselines recorded on CUDA (its extension built by the gate's refresh)."""
    cache = tmp_path_factory.mktemp("cuda-build-cache")
    repo = _lib(tmp_path_factory.mktemp("lncuda") / "lncuda")
    res = _cli(repo.path, cache, "baseline", "refresh", "--evals", "150", "--seed", "0")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    repo.commit("baselines")
    return repo.path, cache


def _pr_run(cu_repo, tmp_path: Path, name: str):
    cu_repo, cache = cu_repo
    dst = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(cu_repo), str(dst)], check=True)
    repo = GitRepo(dst)
    repo.branch(f"pr-{name}")
    C.apply_pr(dst, name)
    repo.commit(name)
    out = tmp_path / "out"
    res = _cli(dst, cache, "run", "--base", "main", "--out", str(out), "--evals", "150", "--seed", "0")
    report = GateReport.from_dict(json.loads((out / "report.json").read_text()))
    assert report.exit_code == res.returncode, res.stderr[-2000:]
    return res.returncode, report


@pytest.mark.gpu
@pytest.mark.slow
def test_on_cuda_the_one_pass_variance_kernel_fails_with_a_repro(cu_repo, tmp_path):
    code, report = _pr_run(cu_repo, tmp_path, "one_pass_variance")
    assert (code, report.outcome) == (1, "regression"), [(v.id, v.outcome, v.reason) for v in report.verdicts]
    assert {v.variant["device"] for v in report.verdicts} == {"cuda"}
    assert {v.op for v in report.verdicts} == {"lncuda.layer_norm"}
    by_key = {v.key: v for v in report.verdicts}
    v = by_key["float32/cuda/input"]
    assert v.outcome == "regression" and ("new NaN/Inf" in v.reason or "ulp >" in v.reason), v.reason
    assert v.diagnosis["changed_code"][0]["symbol"] == "row_moments"
    assert report.env["build"]["head"]["cached"] is False
    script = v.diagnosis["repro_script"]
    res = subprocess.run([sys.executable, "-W", "ignore", script], capture_output=True, text=True)
    assert res.returncode == 1, res.stdout + res.stderr


@pytest.mark.gpu
@pytest.mark.slow
def test_on_cuda_a_benign_kernel_change_passes(cu_repo, tmp_path):
    code, report = _pr_run(cu_repo, tmp_path, "benign")
    assert [s["op"] for s in report.selected] == ["lncuda.layer_norm"]
    assert (code, report.outcome) == (0, "pass"), [(v.id, v.outcome, v.reason) for v in report.verdicts]
    assert {v.variant["device"] for v in report.verdicts} == {"cuda"}
