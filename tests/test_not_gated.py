"""A change to an operator that is not gated is said, not passed in silence (issue 28).

`dl-gate init` lists what it could not build a row for under ``not_gated:`` (name, callable,
why). Before, the list was a comment: a pull request that changed such an operator (nflows'
splines left out when the library's test dependency was missing, a loss built from a tensor)
passed with "no operator changed", the same words as a docs-only change. Now the selection
follows the change to the operator, the run passes (nothing it could judge changed) and says
which operator changed and why it is not gated: in the reason, the report's warnings, and a
warning annotation at the changed line."""
from __future__ import annotations

import pytest

from tests.test_gate_run import commit_pr, gate, git, make_repo

OPS = '''import torch


def scaled(x):
    return x * 2.0


def weighted(x, weights):
    """Takes a list of tensors: init cannot infer a row for it."""
    return x * sum(w.sum() for w in weights)
'''

HELPERS = '''def mix(x, w):
    return x * w
'''

CONFIG = '''version: 1
framework: torch
python_path: ["."]
builtin: false
ops:
  - {name: mylib.scaled, callable: "mylib.ops:scaled", sources: [mylib/ops.py], dims: {N: [1, 8]},
     inputs: [{name: x, shape: [N]}]}
not_gated:
  - {name: mylib.weighted, callable: "mylib.ops:weighted", why: "parameter weights: a list of tensors"}
  - {name: mylib.blend, callable: "mylib.extra:blend", why: "constructor needs w and no test constructs it"}
'''

EXTRA = '''from .helpers import mix


def blend(x, w):
    return mix(x, w)
'''


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One repository (its baselines refreshed once); each test opens its PR from main."""
    repo = make_repo(tmp_path_factory.mktemp("not-gated"), ops_src=OPS, config=CONFIG)
    (repo / "mylib" / "extra.py").write_text(EXTRA)
    (repo / "mylib" / "helpers.py").write_text(HELPERS)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "extra")
    return repo


def test_a_change_reaching_only_an_operator_that_is_not_gated_is_named_with_why(shared, tmp_path):
    repo = shared
    # a helper two calls below the operator that is not gated
    commit_pr(repo, "pr-helper", "main", "return x * w", "return x * w * 0.5", path="mylib/helpers.py")
    code, report = gate(repo, tmp_path)
    assert code == 0 and report.outcome == "pass", report.reason
    assert report.reason == "no gated operator changed; changed but not gated: mylib.blend"
    (warn,) = [w for w in report.warnings if "mylib.blend" in w]
    assert "mylib/helpers.py:2" in warn and "constructor needs w and no test constructs it" in warn
    assert "reaches a change (mylib/helpers.py:2" in warn and "code it calls or inherits" in warn  # not its own file
    (ng,) = report.env["selection"]["not_gated"]
    assert (ng["op"], ng["file"], ng["line"]) == ("mylib.blend", "mylib/helpers.py", 2)
    assert not any(c["file"] == "mylib/helpers.py" for c in report.env["selection"]["cleared"])  # not "reaches nothing"
    from gate.report.annotations import build_annotations

    notes = [n for n in build_annotations(report) if n.level == "warning"]
    assert [(n.file, n.line) for n in notes] == [("mylib/helpers.py", 2)], notes
    assert "mylib.blend, which is not gated" in notes[0].message
    # what to do: the command that adds the row (test_the_hinted_init_adds_the_row runs it)
    assert "`dl-gate init --ops mylib.blend`" in notes[0].message and "`dl-gate init --ops mylib.blend`" in warn
    md = (tmp_path / "out-0" / "report.md").read_text()
    assert "mylib.blend" in md and "not gated" in md


def test_a_change_beside_a_gated_operator_gates_it_and_names_the_one_that_is_not(shared, tmp_path):
    repo = shared
    commit_pr(repo, "pr-beside", "main", "return x * sum(w.sum() for w in weights)",
              "return x * sum(w.mean() for w in weights)", path="mylib/ops.py")
    code, report = gate(repo, tmp_path)
    # the row's sources (its file) still pick the change up: mylib.scaled is fuzzed, unchanged, passes
    assert code == 0 and {v.op for v in report.verdicts} == {"mylib.scaled"}, report.reason
    assert any(w.startswith("not gated: mylib.weighted reaches a change (mylib/ops.py:10") for w in report.warnings), \
        report.warnings
    # the pass's own line says so, not only a warning below it
    assert report.reason.endswith("no regression; changed but not gated: mylib.weighted"), report.reason


def test_a_docs_change_says_no_operator_changed(shared, tmp_path):
    repo = shared
    git(repo, "checkout", "-q", "-B", "docs", "main")
    (repo / "README.md").write_text("docs\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "docs")
    code, report = gate(repo, tmp_path)
    assert code == 0 and report.reason.startswith("no operator changed"), report.reason
    assert not any("not gated" in w for w in report.warnings)


def test_the_hinted_init_adds_the_row_and_keeps_the_others(tmp_path, capsys, monkeypatch):
    """The hint a not-gated warning gives (`dl-gate init --ops NAME`) on a repository whose
    config already has rows: the operator gets its row, taken off not_gated; the rows already
    there are kept as they were."""

    import yaml

    from gate.cli import main

    repo = tmp_path / "repo"
    (repo / "mylib").mkdir(parents=True)
    (repo / "mylib" / "__init__.py").write_text("")
    (repo / "mylib" / "ops.py").write_text("def scaled(x):\n    return x * 2.0\n")
    (repo / "mylib" / "extra.py").write_text("import torch\n\n\ndef blend(x, w):\n    return x * w + torch.sin(x)\n")
    (repo / ".dl-gate.yml").write_text(CONFIG.replace("  - {name: mylib.weighted, callable: \"mylib.ops:weighted\", "
                                                      "why: \"parameter weights: a list of tensors\"}\n", ""))
    git(tmp_path, "init", "-q", "-b", "main", str(repo))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    before = yaml.safe_load((repo / ".dl-gate.yml").read_text())
    monkeypatch.chdir(repo)
    code = main(["init", "--ops", "mylib.blend", "--no-workflows", "--no-tests"])
    after = yaml.safe_load((repo / ".dl-gate.yml").read_text())
    out = capsys.readouterr().out
    assert code == 0
    # what the next step costs: the config's two rows at its budget.per_op (10 s by default)
    assert "dl-gate baseline refresh          # measure the baselines: 2 operators x 10s, at least 20s" in out, out
    assert "gate the part of the library" not in out
    assert after["ops"][0] == before["ops"][0]
    assert [r["name"] for r in after["ops"]] == ["mylib.scaled", "mylib.blend"]
    assert not any(n["name"] == "mylib.blend" for n in after.get("not_gated") or [])
