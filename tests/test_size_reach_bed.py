"""Sizes past the tests' own, from zero config to verdict (issue 28). Modelled on keras-team/
keras-hub d27a648 (#1508, "Always run the rotary embedding layer in float32"): before it the
positions ``arange(seq_len)`` were cast to the compute dtype, and in float16 every position past
2048 (bfloat16: past 256) is rounded to a neighbour, so the rotation angle of the highest
frequency is off by whole radians. The library's tests call the layer on 3 and 4 positions: a
gate whose dims are the tests' sizes (what `init` wrote, C: [3, 4]) cannot see the revert; the
acceptance run on keras-hub passed it. init now lets each dim that runs at 4096 be aimed there by
the search's size mutation (``dims: {C: [3, 4, 4096]}``), its draws staying the tests' sizes."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from gate.init import run_init
from tests.helpers.repro import assert_repro_head_then_base
from tests.test_gate_run import gate

FIXED_POS = "    pos = torch.arange(seq, dtype=torch.float32)\n"
BUGGY_POS = "    pos = torch.arange(seq).to(x.dtype).to(torch.float32)  # positions in the compute dtype\n"

ROPE = '''import torch


def rope(x, max_wavelength: float = 10000.0):
    """Rotary position embedding of x [batch, positions, features] (features even)."""
    seq, dim = x.shape[-2], x.shape[-1]
    half = dim // 2
    inv_freq = 1.0 / (max_wavelength ** (torch.arange(0, half, dtype=torch.float32) / half))
{POS}    freqs = torch.outer(pos, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rot * sin
'''

TESTS = '''import torch

from ropelib.rope import rope


def test_rope_keeps_norms():
    x = torch.randn(2, 4, 8)
    y = rope(x)
    assert torch.allclose(y.norm(dim=-1), x.norm(dim=-1), atol=1e-5)


def test_rope_first_position_is_identity():
    x = torch.randn(1, 3, 8)
    assert torch.allclose(rope(x)[:, 0], x[:, 0])
'''


def git(repo, *args) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "-c",
                           "commit.gpgsign=false", *args], check=True, capture_output=True, text=True).stdout


def _lib(tmp_path: Path, pos: str) -> Path:
    repo = tmp_path / "repo"
    (repo / "ropelib").mkdir(parents=True)
    (repo / "ropelib" / "__init__.py").write_text("")
    (repo / "ropelib" / "rope.py").write_text(ROPE.replace("{POS}", pos))
    (repo / "tests").mkdir()
    (repo / "tests" / "test_rope.py").write_text(TESTS)
    git(tmp_path, "init", "-q", "-b", "main", str(repo))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "ropelib")
    return repo


def _pr(repo: Path, pos_from: str, pos_to: str) -> None:
    from tests.test_gate_run import refresh

    refresh(repo)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "dl-gate init and baselines")
    git(repo, "checkout", "-q", "-b", "pr")
    src = repo / "ropelib" / "rope.py"
    src.write_text(src.read_text().replace(pos_from, pos_to))
    git(repo, "commit", "-q", "-am", "pr")


@pytest.fixture(scope="module")
def config_text(tmp_path_factory):
    """What `dl-gate init` writes for ropelib (on the fixed version)."""
    repo = _lib(tmp_path_factory.mktemp("rope-init"), FIXED_POS)
    run_init(repo, workflows=False, probe_timeout=20)
    return (repo / ".dl-gate.yml").read_text()


def _row(text: str) -> dict:
    return next(o for o in yaml.safe_load(text)["ops"] if o["callable"].endswith(":rope"))


def test_init_lets_the_search_reach_past_the_tests_sizes(config_text):
    dims = _row(config_text)["dims"]
    # the tests' positions (3, 4) and batch (1, 2) are the drawn range; each dim reaches 4096
    assert any(r[:2] == [3, 4] and r[2:] == [4096] for r in dims.values()), dims
    assert "reaching 4096" in config_text


def _gate_pr(tmp_path: Path, config_text: str, base_pos: str, head_pos: str):
    repo = _lib(tmp_path, base_pos)
    cfg = yaml.safe_load(config_text)
    cfg.setdefault("budget", {})["localise"] = 6  # the suite's time: one finding's repro is what is checked
    cfg.setdefault("gate", {})["dtypes"] = ["float16", "bfloat16"]  # the positions' dtypes (float32 holds 2^24)
    (repo / ".dl-gate.yml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    _pr(repo, base_pos, head_pos)
    return gate(repo, tmp_path, evals=60)


def test_positions_cast_to_the_compute_dtype_fail_past_the_tests_sizes(tmp_path, config_text):
    code, report = _gate_pr(tmp_path, config_text, FIXED_POS, BUGGY_POS)
    repo = tmp_path / "repo"
    why = [(v.key, v.outcome, v.reason) for v in report.verdicts]
    assert code == 1, why
    failed = [v for v in report.verdicts if v.outcome == "regression"]
    assert any(v.variant["dtype"] in ("float16", "bfloat16") for v in failed), why
    # the repro scripts agree with the judge: exit 1 on head, 0 on base
    scripts = [v.diagnosis["repro_script"] for v in failed if v.diagnosis and v.diagnosis.get("repro_script")]
    assert scripts, why
    assert_repro_head_then_base(scripts[0], repo)


def test_the_fix_passes(tmp_path, config_text):
    code, report = _gate_pr(tmp_path, config_text, BUGGY_POS, FIXED_POS)
    assert code == 0, [(v.key, v.outcome, v.reason) for v in report.verdicts]
