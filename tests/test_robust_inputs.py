"""What a PR or a repository may hold that the gate must take in its stride (issue 18): a diff in
any encoding, paths with spaces and non-ASCII names, a config outside the repository, damaged
baseline files (one line naming the file and what to do), and a baseline refresh killed between
its writes."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from gate.cli import main
from gate.config import load_config
from gate.errors import ConfigError
from gate.search.inputs import Candidate
from gate.judge import baselines as B

from tests.test_gate_run import git

OPS = "import torch\n\n\ndef scale(x):\n    return x * 2\n"
CONFIG = """version: 1
framework: torch
python_path: ["my lib"]
builtin: false
gate: {dtypes: [float32], modes: [input]}
ops:
  - name: lib.scale
    callable: ops_u:scale
    sources: ["my lib/ops_u.py"]
    dims: {N: [1, 8]}
    inputs: [{name: x, shape: [N]}]
"""


@pytest.fixture
def repo(tmp_path):
    repo = tmp_path / "répo with space"
    (repo / "my lib").mkdir(parents=True)
    (repo / "my lib" / "ops_u.py").write_text(OPS)
    (repo / ".dl-gate.yml").write_text(CONFIG)
    git(tmp_path, "init", "-q", "-b", "main", str(repo))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    git(repo, "checkout", "-q", "-b", "pr")
    return repo


def run(repo: Path, out: Path, *extra: str, monkeypatch=None) -> tuple:
    monkeypatch.chdir(repo)
    code = main(["run", "--base", "main", "--out", str(out), "--evals", "8", "--seed", "0", *extra])
    return code, json.loads((out / "report.json").read_text())


def test_latin1_source_and_unicode_paths_are_gated(repo, tmp_path, monkeypatch, capsys):
    # a latin-1 source file (declared, as Python requires) whose change is a real one
    (repo / "my lib" / "ops_u.py").write_bytes(
        b"# -*- coding: latin-1 -*-\n# caf\xe9\nimport torch\n\n\ndef scale(x):\n    return x * 3\n")
    git(repo, "commit", "-q", "-am", "latin-1 and a change")
    code, report = run(repo, tmp_path / "out", monkeypatch=monkeypatch)
    assert [s["op"] for s in report["selected"]] == ["lib.scale"], report["reason"]
    assert report["outcome"] == "regression" and code == 1, report["reason"]  # x*3 is a behaviour change
    assert "internal error" not in report["reason"]


def test_config_outside_the_repository_judges_both_sides(repo, tmp_path, monkeypatch):
    outside = tmp_path / "ci config" / "gate.yml"
    outside.parent.mkdir()
    outside.write_text(CONFIG)  # python_path and sources are the repository's
    (repo / ".dl-gate.yml").unlink()
    (repo / "my lib" / "ops_u.py").write_text(OPS.replace("x * 2", "x * 2.0"))
    git(repo, "commit", "-q", "-am", "benign, config moved out")
    code, report = run(repo, tmp_path / "out", "--config", str(outside), monkeypatch=monkeypatch)
    # no baselines in this repository: not judged against stored rows, but replayed on base
    # through the same outside config, and found to match it
    assert code == 3 and report["outcome"] == "needs-baseline", report["reason"]
    assert [s["op"] for s in report["selected"]] == ["lib.scale"]
    for v in report["verdicts"]:  # the default layout, the non-contiguous one and the gradient
        assert "head matches base on" in v["reason"], v["reason"]


def test_unknown_key_and_non_utf8_config_name_their_line(tmp_path):
    p = tmp_path / "c.yml"
    p.write_text("version: 1\nframework: torch\ngatee:\n  dtypes: [float32]\nops: []\n")
    with pytest.raises(ConfigError, match=r"c\.yml:3: gatee: unknown key"):
        load_config(p)
    p.write_bytes(b"version: 1\nops: []\n# caf\xe9\n")
    with pytest.raises(ConfigError, match=r"c\.yml:3: not UTF-8 text \(byte 0xe9\)"):
        load_config(p)


def test_damaged_baseline_files_say_what_and_what_to_do(tmp_path):
    root = tmp_path / "baselines"
    root.mkdir()
    (root / "lib.op.json").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    with pytest.raises(B.BaselineError, match=r"lib\.op\.json: not UTF-8 JSON .*binary file.*refresh"):
        B.BaselineStore(B.DirBaselineSource(root)).load()
    (root / "lib.op.json").write_text('{"op": "lib.op",\n "rows": [}')
    with pytest.raises(B.BaselineError, match=r"lib\.op\.json:2: invalid JSON"):
        B.BaselineStore(B.DirBaselineSource(root)).load()
    (root / "lib.op.json").unlink()
    (root / "bad.npz").write_bytes(np.array([1.0]).tobytes())
    row = B.BaselineRow(op="lib.op", variant="float32/cpu/input", env={}, ulp=1.0, corpus=["bad.npz"])
    store = B.BaselineStore(B.DirBaselineSource(root))
    with pytest.raises(B.BaselineError) as err:
        store.corpus(row)
    msg = str(err.value)
    assert "bad.npz" in msg and "not a dl-gate corpus file" in msg and "allow_pickle" not in msg, msg


def _finding(ulp: float, value: float):
    """A Finding for one variant whose worst input holds ``value``."""
    from gate.search.finding import Finding
    from gate.oracles.precision import Metrics
    from gate.plan import Variant

    cand = Candidate(dims={"N": 2}, params={}, arrays={"x": np.full(2, value, np.float32)}, origin="search")
    return Finding(op="lib.op", framework="torch", variant=Variant("float32"), metrics=Metrics(ulp=ulp),
                   best=cand, evals=10, env={"torch": "2.13.0"}), cand


def test_a_refresh_killed_before_its_json_swap_leaves_the_old_rows_whole(tmp_path, monkeypatch):
    root = tmp_path / "baselines"
    f1, c1 = _finding(1.0, 1.5)
    B.write_rows(root, [f1], {"lib.op": "torch"})
    store = B.BaselineStore(B.DirBaselineSource(root)).load()
    (row,) = store.rows["lib.op"]
    before = {rel: (root / rel).read_bytes() for rel in row.corpus}

    f2, c2 = _finding(4.0, -7.25)
    real = B._atomic_write

    def killed_at_the_json(path, data):  # SIGKILL between the data files and the JSON
        if str(path).endswith(".json"):
            raise KeyboardInterrupt("killed")
        real(path, data)

    monkeypatch.setattr(B, "_atomic_write", killed_at_the_json)
    with pytest.raises(KeyboardInterrupt):
        B.write_rows(root, [f2], {"lib.op": "torch"})
    monkeypatch.setattr(B, "_atomic_write", real)

    store = B.BaselineStore(B.DirBaselineSource(root)).load()
    (row,) = store.rows["lib.op"]
    assert row.ulp == 1.0
    assert {rel: (root / rel).read_bytes() for rel in row.corpus} == before  # the old row's data, untouched
    assert float(store.corpus(row)[0].arrays["x"][0]) == 1.5

    B.write_rows(root, [f2], {"lib.op": "torch"})  # the next refresh completes and tidies up
    store = B.BaselineStore(B.DirBaselineSource(root)).load()
    (row,) = store.rows["lib.op"]
    assert row.ulp == 4.0 and float(store.corpus(row)[0].arrays["x"][0]) == -7.25
    npz = {str(p.relative_to(root)) for p in root.rglob("*.npz")}
    assert npz == set(row.corpus), "files of the replaced row are removed once the JSON no longer names them"


def test_baselines_are_committed_whatever_the_repositorys_ignore_patterns_say(tmp_path, monkeypatch):
    """vector-quantize-pytorch (acceptance run, 569b8b0): its .gitignore has ``*.log``, and the
    operator ``...lookup_free_quantization.log`` names a corpus folder; the refresh's rows were
    committed without their inputs, and every run on the PR stopped at "corrupt baseline corpus
    file ... not a dl-gate corpus file". The baselines folder carries its own .gitignore; a stored
    input missing at base costs its variant's stored inputs (a warning), not the run."""
    repo = tmp_path / "vq"
    (repo / "lib").mkdir(parents=True)
    (repo / "lib" / "ops.py").write_text(OPS)
    (repo / ".gitignore").write_text("*.log\n__pycache__/\n")
    (repo / ".dl-gate.yml").write_text(CONFIG.replace('python_path: ["my lib"]', 'python_path: ["lib"]')
                                       .replace("lib.scale", "lib.scale.log").replace("ops_u:", "ops:")
                                       .replace('"my lib/ops_u.py"', "lib/ops.py"))
    git(tmp_path, "init", "-q", "-b", "main", str(repo))
    monkeypatch.chdir(repo)
    assert main(["baseline", "refresh", "--evals", "8", "--seed", "0"]) == 0
    corpus = sorted((repo / "baselines" / "corpus").rglob("*.npz"))
    assert corpus and all(".log" in str(p) for p in corpus)
    assert (repo / "baselines" / ".gitignore").read_text() == B.KEEP_ALL
    assert B.ignored_by_git(repo / "baselines") is None
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base with baselines")
    tracked = subprocess.run(["git", "-C", str(repo), "ls-files", "baselines/corpus"], capture_output=True,
                             text=True).stdout.split()
    assert len(tracked) == len(corpus), tracked
    # a folder the repository ignores as a whole cannot be un-ignored from inside: said
    (repo / ".gitignore").write_text("*.log\nbaselines/\n")
    warning = B.ignored_by_git(repo / "baselines")
    assert warning and "are ignored by git" in warning and "baselines/" in warning, warning
    # a row whose stored input was never committed (as the acceptance run left it)
    (repo / ".gitignore").write_text("*.log\n")
    git(repo, "rm", "-q", "--cached", str(corpus[0].relative_to(repo)))
    git(repo, "commit", "-q", "-m", "lose one stored input")
    store = B.BaselineStore(B.GitBaselineSource(repo, "main")).load()
    lost = str(corpus[0].relative_to(repo / "baselines"))
    (row,) = [r for r in store.rows["lib.scale.log"] if lost in r.corpus]
    with pytest.raises(B.BaselineError, match=r"is missing \(not committed: ignored by a \.gitignore pattern\?\)"):
        store.corpus(row)
    git(repo, "checkout", "-q", "-b", "pr")
    (repo / "lib" / "ops.py").write_text(OPS.replace("x * 2", "2 * x"))
    git(repo, "commit", "-q", "-am", "pr")
    code = main(["run", "--base", "main", "--out", str(tmp_path / "out"), "--evals", "8", "--seed", "0"])
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert code == 0 and report["outcome"] == "pass", report["reason"]
    assert any("is missing" in w and "searched without its stored inputs" in w for w in report["warnings"]), \
        report["warnings"]
