"""The action's container entrypoint (``dl-gate action``): inputs -> command mapping, and end to end
in a subprocess with a simulated GITHUB_* environment, an event file and a real HTTP server on
127.0.0.1 implementing the REST endpoints (tests/github_fake.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from junitparser import Error, JUnitXml

from gate.commands.action import ActionInputs, command_for, fix_ownership, get_input, resolve_base_ref, trust_workspace
from gate.errors import GateError
from gate.report.outputs import parse_outputs
from tests.github_fake import FakeGitHub
from tests.report_samples import rich_report

ROOT = Path(__file__).resolve().parents[1]
REPO = "acme/ops"
SHA1, SHA2 = "1" * 40, "2" * 40


# -- inputs and the mode -> command mapping --------------------------------------------------
def inputs(**kw):
    env = {f"INPUT_{k.upper()}": v for k, v in kw.items()}
    return ActionInputs.from_env(env)


def test_inputs_use_the_runner_spelling_with_hyphens():
    env = {"INPUT_BASE-REF": "origin/dev", "INPUT_FAIL-ON": "regression, error", "INPUT_COMMENT": "false",
           "INPUT_COMMENT_KEY": "gpu"}
    inp = ActionInputs.from_env(env)
    assert inp.base_ref == "origin/dev" and inp.fail_on == ["regression", "error"]
    assert inp.comment is False and inp.comment_key == "gpu" and inp.mode == "gate" and inp.out == "dl-gate-out"
    assert get_input({"INPUT_X_Y": " v "}, "x y") == "v"  # spaces become underscores


def test_mode_to_command():
    env = {"GITHUB_BASE_REF": "main"}
    assert command_for(inputs(), env, {}) == ["run", "--base", "origin/main", "--out", "dl-gate-out"]
    inp = ActionInputs.from_env({"INPUT_MODE": "gate", "INPUT_BASE-REF": "v1.2", "INPUT_CONFIG": "ci/gate.yml",
                                 "INPUT_BUDGET": "300", "INPUT_OUT": "out"})
    assert command_for(inp, env, {}) == ["run", "--base", "v1.2", "--out", "out", "--config", "ci/gate.yml",
                                         "--budget", "300"]
    inp = ActionInputs.from_env({"INPUT_MODE": "refresh", "INPUT_CONFIG": "c.yml", "INPUT_BUDGET": "3600"})
    assert command_for(inp, {}, {}) == ["baseline", "refresh", "--config", "c.yml", "--budget", "3600"]
    inp = ActionInputs.from_env({"INPUT_MODE": "refresh", "INPUT_PER-OP": "60"})  # one grammar: --per-op
    assert command_for(inp, {}, {}) == ["baseline", "refresh", "--per-op", "60"]
    assert command_for(inputs(mode="publish", report="r.json"), {}, {}) is None
    inp = ActionInputs.from_env({"INPUT_MODE": "refresh", "INPUT_NIGHTLY": "true"})
    assert command_for(inp, {}, {}) == ["baseline", "refresh", "--nightly"]
    inp = ActionInputs.from_env({"INPUT_MODE": "refresh", "INPUT_NIGHTLY": "true", "INPUT_NIGHTLY-BUDGET": "120"})
    assert command_for(inp, {}, {}) == ["baseline", "refresh", "--nightly", "--nightly-budget", "120"]
    with pytest.raises(GateError, match="input nightly: only with mode: refresh"):
        ActionInputs.from_env({"INPUT_MODE": "gate", "INPUT_NIGHTLY": "true"})
    with pytest.raises(GateError, match="input nightly: expected true or false"):
        ActionInputs.from_env({"INPUT_MODE": "refresh", "INPUT_NIGHTLY": "weekly"})


def test_base_ref_defaults():
    inp = inputs()
    assert resolve_base_ref(inp, {}, {"pull_request": {"base": {"sha": "abc123"}}}) == "abc123"
    assert resolve_base_ref(inp, {}, {"before": SHA1}) == SHA1
    with pytest.raises(GateError, match="base-ref is required"):
        resolve_base_ref(inp, {"GITHUB_EVENT_NAME": "push"}, {"before": "0" * 40})  # a new branch


@pytest.mark.parametrize("env, message", [
    ({"INPUT_MODE": "fuzz"}, "input mode"),
    ({"INPUT_FAIL-ON": "regresion"}, "input fail-on"),
    ({"INPUT_BUDGET": "-5"}, "input budget"),
    ({"INPUT_PER-OP": "nan"}, "input per-op"),
    ({"INPUT_COMMENT": "maybe"}, "input comment"),
    ({"INPUT_MODE": "publish"}, "input report"),
])
def test_bad_inputs_are_one_line_errors(env, message):
    with pytest.raises(GateError, match=message):
        ActionInputs.from_env(env)


def test_fail_on_never():
    assert inputs(**{"fail-on": "never"}).fail_on == []


def test_fail_on_empty_is_the_default_and_lists_may_span_lines():
    # `fail-on: ${{ vars.UNSET }}` must not turn the gate off
    assert ActionInputs.from_env({"INPUT_FAIL-ON": ""}).fail_on == ["regression", "error"]
    assert ActionInputs.from_env({"INPUT_FAIL-ON": "regression\nerror"}).fail_on == ["regression", "error"]


def test_trust_workspace_appends_git_config():
    env = {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "core.x", "GIT_CONFIG_VALUE_0": "y"}
    trust_workspace(env, "/github/workspace")
    assert env["GIT_CONFIG_COUNT"] == "2" and env["GIT_CONFIG_KEY_1"] == "safe.directory"
    assert env["GIT_CONFIG_VALUE_1"] == "/github/workspace"


# -- end to end: the container entrypoint in a subprocess ----------------------------------------
ENTRY = ("import sys, gate.cli\n"
         "rc = gate.cli.main(['action'])\n"
         "print('FRAMEWORKS', 'torch' in sys.modules, 'tensorflow' in sys.modules)\n"
         "sys.exit(rc)\n")


class Action:
    """A simulated Actions job: workspace, event file, command files, and the fake API."""

    def __init__(self, tmp: Path, api: str):
        self.tmp, self.api = tmp, api
        self.ws = tmp / "workspace"
        self.ws.mkdir()
        self.runs = 0

    def run(self, report, head=SHA1, run_id=100, attempt=1, **inputs):
        self.runs += 1
        files = self.tmp / f"run{self.runs}"
        files.mkdir()
        event = {"pull_request": {"number": 7, "head": {"sha": head}, "base": {"ref": "main", "sha": "a" * 40}}}
        (files / "event.json").write_text(json.dumps(event))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "INPUT_", "RUNNER_"))}
        env.update({
            "PYTHONPATH": str(ROOT), "GITHUB_ACTIONS": "true", "CI": "true", "GITHUB_REPOSITORY": REPO,
            "GITHUB_API_URL": self.api, "GITHUB_SERVER_URL": "https://github.com",
            "GITHUB_EVENT_NAME": "pull_request", "GITHUB_EVENT_PATH": str(files / "event.json"),
            "GITHUB_RUN_ID": str(run_id), "GITHUB_RUN_ATTEMPT": str(attempt), "GITHUB_SHA": "f" * 40,
            "GITHUB_WORKSPACE": str(self.ws), "GITHUB_BASE_REF": "main", "GITHUB_HEAD_REF": "feature",
            "GITHUB_OUTPUT": str(files / "output"), "GITHUB_STEP_SUMMARY": str(files / "summary"),
            "INPUT_TOKEN": "tok-bot", "INPUT_COMMENT": "true", "INPUT_FAIL-ON": "regression",
            "INPUT_OUT": "dl-gate-out",
        })
        if report is not None:
            path = self.ws / "artifact" / "report.json"
            path.parent.mkdir(exist_ok=True)
            path.write_text(json.dumps(report.to_dict()))
            env.update({"INPUT_MODE": "publish", "INPUT_REPORT": "artifact/report.json"})
        env.update({f"INPUT_{k.upper().replace('_', '-')}": v for k, v in inputs.items()})
        res = subprocess.run([sys.executable, "-c", ENTRY], cwd=self.ws, env=env, capture_output=True, text=True,
                             timeout=240)
        outputs = parse_outputs((files / "output").read_text()) if (files / "output").exists() else {}
        summary = (files / "summary").read_text() if (files / "summary").exists() else ""
        return res, outputs, summary


@pytest.fixture
def job(tmp_path):
    with FakeGitHub(max_per_page=2) as fake:
        fake.add_pull(7, SHA1)
        for i in range(3):  # a few human comments: the sticky one is on a later page
            fake.add_comment(7, f"looks good {i}", "octocat")
        yield Action(tmp_path, fake.url), fake


def test_entrypoint_first_run_creates_rerun_updates_older_sha_does_not_overwrite(job):
    act, fake = job
    report = rich_report(head_sha=SHA1)
    res, out, summary = act.run(report)
    assert res.returncode == 1, res.stderr  # a regression fails the step
    assert "FRAMEWORKS False False" in res.stdout  # publishing never imports torch / tensorflow
    assert res.stdout.count("::error file=") == 3 and "::warning title=dl-gate harness error" in res.stdout
    assert out["outcome"] == "regression" and out["comment-action"] == "created" and out["exit-code"] == "1"
    assert summary.startswith("## ❌ dl-gate: **regression**")
    xml = JUnitXml.fromfile(str(act.ws / out["junit"]))
    assert sum(s.failures for s in xml) == 2
    mine = [c for c in fake.comments[7] if c["user"]["login"] == "github-actions[bot]"]
    assert len(mine) == 1 and "results for " + SHA1[:12] in mine[0]["body"]

    # the same commit re-run: the comment is updated in place
    report.seed = 4321  # what the re-run found differs
    res, out, _ = act.run(report, attempt=2)
    assert res.returncode == 1 and out["comment-action"] == "updated"
    mine = [c for c in fake.comments[7] if c["user"]["login"] == "github-actions[bot]"]
    assert len(mine) == 1 and "seed `4321`" in mine[0]["body"]

    # a push moved the PR to SHA2 and its run reported first; then the old SHA1 run finishes
    fake.add_pull(7, SHA2)
    res, out, _ = act.run(rich_report(head_sha=SHA2, reason="fixed one", seed=222), head=SHA2, run_id=200)
    assert out["comment-action"] == "updated"
    res, out, _ = act.run(rich_report(head_sha=SHA1, reason="stale result", seed=111), head=SHA1, run_id=150)
    assert out["comment-action"] == "skipped-stale" and res.returncode == 1
    mine = [c for c in fake.comments[7] if c["user"]["login"] == "github-actions[bot]"]
    assert len(mine) == 1 and "seed `222`" in mine[0]["body"] and "seed `111`" not in mine[0]["body"]
    assert len(fake.comments[7]) == 4


def test_entrypoint_read_only_token_and_transient_errors_do_not_fail_the_gate(job):
    act, fake = job
    needs = rich_report(outcome="needs-baseline", reason="3 variants have no baseline yet", head_sha=SHA1)
    fake.read_only = True
    fake.fail = {"GET": 1}
    res, out, _ = act.run(needs)
    assert res.returncode == 0, res.stderr
    assert "::warning title=dl-gate::cannot write the PR comment" in res.stdout
    assert out["comment-action"] == "skipped-readonly" and out["outcome"] == "needs-baseline"
    assert [c for c in fake.comments[7] if c["user"]["login"] != "octocat"] == []
    # fail-on decides: needs-baseline can be made to fail the step
    fake.read_only = False
    res, out, _ = act.run(needs, run_id=101, **{"fail_on": "regression,needs-baseline"})
    assert res.returncode == 3 and out["comment-action"] == "created"


def test_entrypoint_gate_mode_reports_an_error_on_every_outcome(job):
    act, fake = job
    # the workspace is not a git repository: the run is an error, and the action still writes
    # JUnit, summary and outputs; a set-up that can never judge anything fails the step (an
    # error annotation) whatever fail-on says, or the check would stay green on every PR
    res, out, summary = act.run(None, mode="gate", comment="false")
    assert res.returncode == 2, res.stderr
    assert out["outcome"] == "error" and out["exit-code"] == "2"
    assert "::error title=dl-gate setup error::" in res.stdout and "is not a git repository" in res.stdout
    assert summary.startswith("## ⚠️ dl-gate: **error**")
    xml = JUnitXml.fromfile(str(act.ws / "dl-gate-out" / "junit.xml"))
    (case,) = [c for s in xml for c in s]
    assert isinstance(case.result[0], Error)
    res, out, _ = act.run(None, mode="gate", comment="false", fail_on="error")
    assert res.returncode == 2
    assert not fake.requests("POST")


def test_entrypoint_install_runs_the_library_install_first_without_credentials(job):
    act, fake = job
    # the install input runs in the workspace before the gate, with a worker's environment (no
    # token, no runner command file) plus pip's settings; what it prints cannot be a workflow command
    cmd = ("env > installed.env; echo '::error::forged by setup.py'; "
           "python -c \"import os; print('PIP', os.environ.get('PIP_INDEX_URL'))\"")
    res, out, _ = act.run(None, mode="gate", comment="false", install=cmd)
    seen = (act.ws / "installed.env").read_text()
    assert "tok-bot" not in seen and "INPUT_" not in seen and "GITHUB_OUTPUT" not in seen
    assert not any(ln.lstrip().startswith("::error::forged") for ln in res.stderr.splitlines())
    assert ": :error::forged by setup.py" in res.stderr
    assert out["outcome"] == "error"  # the gate itself ran next (this workspace is no git repository)
    # a failing install: one line, a setup error that fails the step, the JUnit file still written
    res, out, _ = act.run(None, mode="gate", comment="true", install="echo 'ERROR: No matching distribution'; exit 3")
    assert res.returncode == 2 and out["outcome"] == "error"
    assert "input install: `echo 'ERROR: No matching distribution'; exit 3` exited 3: ERROR: No matching distribution" in out["reason"]
    assert (act.ws / "dl-gate-out" / "junit.xml").exists() and not fake.requests("POST")


def test_entrypoint_install_gets_pip_settings(job, monkeypatch):
    act, _ = job
    monkeypatch.setenv("PIP_INDEX_URL", "https://pypi.example/simple")
    monkeypatch.setenv("PIP_SECRET_TOKEN", "never")
    act.run(None, mode="gate", comment="false", install="env > installed.env")
    seen = (act.ws / "installed.env").read_text()
    assert "PIP_INDEX_URL=https://pypi.example/simple" in seen and "never" not in seen


def test_entrypoint_a_run_ended_by_the_code_under_test_fails_the_step(job):
    """A PR whose operator calls os._exit(0) in a trusted (not isolated) run ends the gate's run
    process before it writes a report: the supervisor's error report fails the step whatever
    fail-on says. (One that exits when imported no longer reaches the run process: it is an
    operator that does not import on head, a regression; tests/test_redteam.py.)"""
    from tests.test_gate_run import git

    act, fake = job
    (act.ws / "lib").mkdir()
    (act.ws / "lib" / "__init__.py").write_text("")
    (act.ws / "lib" / "ops.py").write_text("import torch\n\n\ndef half(x):\n    return x * 0.5\n")
    (act.ws / ".dl-gate.yml").write_text(
        "version: 1\nframework: torch\nbuiltin: false\ngate: {isolate: false}\nops:\n  - name: lib.half\n"
        "    callable: lib.ops:half\n"
        "    sources: [lib/ops.py]\n    inputs: [{name: x, shape: [4]}]\n")
    git(act.tmp, "init", "-q", "-b", "main", str(act.ws))
    git(act.ws, "add", "-A")
    git(act.ws, "commit", "-q", "-m", "base")
    git(act.ws, "update-ref", "refs/remotes/origin/main", "main")
    git(act.ws, "checkout", "-q", "-b", "pr")
    (act.ws / "lib" / "ops.py").write_text("import os\nimport torch\n\n\ndef half(x):\n    os._exit(0)\n")
    git(act.ws, "commit", "-q", "-am", "exit in a call")
    res, out, _ = act.run(None, mode="gate", comment="false", budget="5")
    assert res.returncode == 2, (res.stdout[-2000:], res.stderr[-2000:])
    assert out["outcome"] == "error" and "before writing its report" in res.stdout + res.stderr
    assert "a run that ended without its report fails the step" in res.stderr
    assert (act.ws / "dl-gate-out" / "junit.xml").exists()


def test_entrypoint_rejects_an_invalid_artifact(job):
    act, fake = job
    forged = rich_report()
    forged.outcome = "pwned"  # not an outcome: the schema rejects the file before anything is rendered
    res, out, _ = act.run(forged)
    assert res.returncode == 2 and "invalid report at outcome" in res.stderr
    assert out["outcome"] == "error" and (act.ws / "dl-gate-out" / "junit.xml").exists()
    assert not fake.requests("POST")
    # a mistake in the workflow fails the step whatever fail-on says, and is reported too
    res, out, summary = act.run(None, mode="fuzz")
    assert res.returncode == 2 and "input mode" in summary and out["outcome"] == "error"


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to chown (as in a Docker action)")
def test_files_left_by_the_root_container_go_back_to_the_workspace_owner(tmp_path):
    ws = tmp_path / "ws"
    (ws / "dl-gate-out" / "sub").mkdir(parents=True)
    (ws / "dl-gate-out" / "sub" / "f.txt").write_text("x")
    os.chown(ws, 4242, 4343)
    keep = ws / "theirs.txt"
    keep.write_text("y")
    os.chown(keep, 5000, 5000)
    assert fix_ownership([ws], ws) == 3
    for p in (ws / "dl-gate-out", ws / "dl-gate-out" / "sub", ws / "dl-gate-out" / "sub" / "f.txt"):
        assert (p.stat().st_uid, p.stat().st_gid) == (4242, 4343)
    assert keep.stat().st_uid == 5000


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to chown (as in a Docker action)")
def test_entrypoint_output_ownership(job):
    act, _ = job
    os.chown(act.ws, 4242, 4242)
    res, out, _ = act.run(rich_report(head_sha=SHA1), comment="false")
    assert res.returncode == 1
    owners = {p.stat().st_uid for p in (act.ws / "dl-gate-out").rglob("*")} | {(act.ws / "dl-gate-out").stat().st_uid}
    assert owners == {4242}
