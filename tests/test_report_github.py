"""Annotations, step outputs, job summary and publish_to_github with a simulated Actions
environment (files for GITHUB_OUTPUT / GITHUB_STEP_SUMMARY, an event file, a real HTTP server)."""
from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

from gate.judge.verdict import VariantVerdict
from gate.report.annotations import Annotation, build_annotations, cap, emit_annotations, escape_data
from gate.report.common import SUMMARY_LIMIT
from gate.report.github import GitHubContext, publish_to_github
from gate.report.outputs import format_outputs, parse_outputs
from tests.github_fake import FakeGitHub
from tests.report_samples import pass_report, regression, rich_report, variant

REPO = "acme/ops"
HEAD = "b" * 40


def gh_env(tmp_path: Path, api: str, event: dict, event_name: str = "pull_request", **extra) -> dict:
    (tmp_path / "event.json").write_text(json.dumps(event))
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    env = {
        "GITHUB_ACTIONS": "true", "GITHUB_REPOSITORY": REPO, "GITHUB_API_URL": api,
        "GITHUB_SERVER_URL": "https://github.com", "GITHUB_EVENT_NAME": event_name,
        "GITHUB_EVENT_PATH": str(tmp_path / "event.json"), "GITHUB_RUN_ID": "500", "GITHUB_RUN_ATTEMPT": "1",
        "GITHUB_SHA": "f" * 40, "GITHUB_WORKSPACE": str(ws), "GITHUB_OUTPUT": str(tmp_path / "output.txt"),
        "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md"), "GITHUB_TOKEN": "tok-bot",
    }
    env.update(extra)
    return env


def pr_event(number=7, head=HEAD):
    return {"pull_request": {"number": number, "head": {"sha": head}, "base": {"sha": "a" * 40, "ref": "main"}}}


# -- annotations -----------------------------------------------------------------------------
def test_regressions_are_annotated_at_the_changed_lines_that_reach_them():
    notes = build_annotations(rich_report())
    errors = [n for n in notes if n.level == "error"]
    assert [(n.file, n.line) for n in errors] == [("mylib/ops.py", 30), ("mylib/ops.py", 14), ("mylib/util.py", 7)]
    assert errors[1].message.startswith("this change reaches mylib.softplus[float16/cpu/input]: max error 48 ulp")
    assert errors[0].title == "dl-gate regression: mylib.exp_sum"  # no diagnosis: the operator's source
    warnings = [n for n in notes if n.level == "warning"]
    assert any("worker crashed" in n.message for n in warnings)  # harness error: a warning
    assert any(n.level == "notice" and "no baseline" in n.message for n in notes)


def test_annotation_escaping_cannot_inject_commands():
    v = regression()
    v.reason = "bad\n::add-mask::secret\r%0A"
    v.diagnosis["changed_code"] = [{"file": "a,b:c.py", "line": 3}]
    (cmd,) = [n.command() for n in build_annotations(pass_report(verdicts=[v], outcome="regression"))
              if n.level == "error"]
    assert "\n" not in cmd and "\r" not in cmd
    assert cmd.startswith("::error file=a%2Cb%3Ac.py,line=3,title=dl-gate regression%3A mylib.softplus::")
    assert cmd.endswith("bad ::add-mask::secret %250A (head 48 ulp vs base 1.5 ulp (threshold 4.5 ulp))")
    assert Annotation("error", "a\n::x\r").command() == "::error::a%0A::x%0D"
    assert escape_data("100%") == "100%25"


def test_annotations_are_capped_per_step_most_important_first():
    vs = []
    for i in range(15):
        v = regression(op=f"lib.op{i:02d}", head=100.0 - i)
        v.diagnosis["changed_code"] = [{"file": f"lib/f{i:02d}.py", "line": i + 1}]
        vs.append(v)
    out = io.StringIO()
    kept = emit_annotations(pass_report(verdicts=vs, outcome="regression"), stream=out)
    lines = out.getvalue().splitlines()
    assert len([ln for ln in lines if ln.startswith("::error ")]) == 10 == len(kept)
    assert "file=lib/f00.py" in lines[0]  # the largest ratio first
    assert lines[-1].startswith("dl-gate: 5 more error annotation(s) left out")
    kept, dropped = cap([Annotation("warning", str(i)) for i in range(12)] + [Annotation("error", "e")])
    assert dropped == {"warning": 2} and len(kept) == 11


def test_absolute_paths_outside_the_workspace_are_not_file_annotations(tmp_path):
    v = regression(diagnosis=False)
    v.source_file = "/usr/lib/python3/site-packages/torch/nn/functional.py"
    (n,) = [n for n in build_annotations(pass_report(verdicts=[v], outcome="regression"), root=tmp_path)
            if n.level == "error"]
    assert n.file is None and "file=" not in n.command()
    v.source_file = str(tmp_path / "mylib" / "ops.py")
    (n,) = [n for n in build_annotations(pass_report(verdicts=[v], outcome="regression"), root=tmp_path)
            if n.level == "error"]
    assert n.file == "mylib/ops.py"


# -- outputs ------------------------------------------------------------------------------
def test_outputs_round_trip_multiline_values():
    text = format_outputs({"outcome": "regression", "reason": "line one\nline two", "empty": ""})
    assert parse_outputs(text) == {"outcome": "regression", "reason": "line one\nline two", "empty": ""}
    # a value cannot forge another output
    forged = format_outputs({"reason": "x\noutcome=pass\nghadelimiter_x"})
    assert parse_outputs(forged) == {"reason": "x\noutcome=pass\nghadelimiter_x"}


# -- publish_to_github ----------------------------------------------------------------------
def test_publish_writes_summary_outputs_annotations_and_comment(tmp_path):
    with FakeGitHub() as fake:
        fake.add_pull(7, HEAD)
        env = gh_env(tmp_path, fake.url, pr_event())
        out = io.StringIO()
        done = publish_to_github(rich_report(), env, out_dir=tmp_path / "ws" / "dl-gate-out", stream=out)
        assert done["comment"]["action"] == "created"
        (c,) = fake.comments[7]
        assert "## ❌ dl-gate: **regression**" in c["body"]
        assert '"sha": "' + HEAD in c["body"] and "results for " + HEAD[:12] in c["body"]
        assert "https://github.com/acme/ops/actions/runs/500" in c["body"]
    summary = Path(env["GITHUB_STEP_SUMMARY"]).read_text()
    assert summary.startswith("## ❌ dl-gate: **regression**") and "```mermaid" in summary
    outputs = parse_outputs(Path(env["GITHUB_OUTPUT"]).read_text())
    assert outputs["outcome"] == "regression" and outputs["exit-code"] == "1"
    assert outputs["regressions"] == "2" and outputs["passed"] == "2" and outputs["errors"] == "1"
    assert outputs["needs-baseline"] == "1" and outputs["variants"] == "8"
    assert outputs["junit"] == "dl-gate-out/junit.xml" and outputs["report-json"] == "dl-gate-out/report.json"
    assert outputs["comment-action"] == "created" and outputs["comment-url"].startswith("https://")
    assert out.getvalue().count("::error ") == 3


def test_publish_never_raises_on_a_read_only_token(tmp_path):
    with FakeGitHub() as fake:
        fake.add_pull(7, HEAD)
        fake.read_only = True
        env = gh_env(tmp_path, fake.url, pr_event())
        out = io.StringIO()
        done = publish_to_github(rich_report(), env, out_dir=tmp_path / "o", stream=out)
    assert done["comment"]["action"] == "skipped-readonly"
    assert "::warning title=dl-gate::cannot write the PR comment" in out.getvalue()
    assert parse_outputs(Path(env["GITHUB_OUTPUT"]).read_text())["comment-action"] == "skipped-readonly"


def test_summary_respects_what_the_step_already_wrote(tmp_path):
    env = gh_env(tmp_path, "http://127.0.0.1:9", {}, event_name="push")
    Path(env["GITHUB_STEP_SUMMARY"]).write_text("x" * (SUMMARY_LIMIT - 30_000))
    vs = [VariantVerdict(op=f"lib.op{i}", framework="torch", variant=variant(), outcome="pass", reason="ok " * 30,
                         base_error=1.0, head_error=1.0, threshold=2.0) for i in range(2000)]
    publish_to_github(rich_report(verdicts=vs + [regression()]), env, comment=False, stream=io.StringIO())
    assert Path(env["GITHUB_STEP_SUMMARY"]).stat().st_size <= SUMMARY_LIMIT


def test_no_pr_no_comment_and_outside_actions_nothing_is_written(tmp_path):
    env = gh_env(tmp_path, "http://127.0.0.1:9", {"before": "0" * 40}, event_name="push")
    done = publish_to_github(pass_report(), env, stream=io.StringIO())
    assert done["comment"]["action"] == "skipped-no-pr"
    done = publish_to_github(pass_report(), {}, stream=io.StringIO())
    assert done["summary"] is None and done["outputs"] is None


def test_workflow_run_finds_the_fork_pr_from_the_event_not_the_artifact(tmp_path):
    event = {"workflow_run": {"id": 900, "run_attempt": 1, "event": "pull_request", "head_sha": HEAD,
                              "head_branch": "feature", "pull_requests": [],
                              "html_url": "https://github.com/acme/ops/actions/runs/900",
                              "head_repository": {"full_name": "forker/ops", "owner": {"login": "forker"}}}}
    with FakeGitHub() as fake:
        fake.add_pull(12, HEAD, owner="forker", branch="feature")
        fake.add_pull(13, "c" * 40, owner="other", branch="feature")
        env = gh_env(tmp_path, fake.url, event, event_name="workflow_run")
        ctx = GitHubContext.from_env(env)
        assert ctx.stamp().run_id == 900 and ctx.run_url.endswith("/runs/900")
        report = rich_report(head_sha="e" * 40)  # what the artifact claims does not matter
        done = publish_to_github(report, env, annotations=False, stream=io.StringIO())
        assert done["comment"]["action"] == "created"
        assert list(fake.comments) == [12]
        assert '"sha": "' + HEAD in fake.comments[12][0]["body"]


def test_report_stage_never_imports_a_framework(tmp_path):
    report = tmp_path / "report.json"
    report.write_text(json.dumps(rich_report().to_dict()))
    code = ("import sys, gate.cli\n"
            f"rc = gate.cli.main(['publish', {str(report)!r}, '--out', {str(tmp_path / 'out')!r}])\n"
            "print('FRAMEWORKS', rc, 'torch' in sys.modules, 'tensorflow' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[1])
    assert "FRAMEWORKS 0 False False" in res.stdout, res.stderr
    assert (tmp_path / "out" / "junit.xml").exists()


def test_the_comment_stays_under_6kb_whatever_the_run_and_points_at_the_full_report(tmp_path):
    vs = [regression(op=f"lib.fail{i:03d}") for i in range(300)]
    with FakeGitHub() as fake:
        fake.add_pull(7, HEAD)
        env = gh_env(tmp_path, fake.url, pr_event())
        publish_to_github(rich_report(verdicts=vs), env, annotations=False, summary=False, stream=io.StringIO())
        (c,) = fake.comments[7]
    body = c["body"]
    assert len(body.encode("utf-8")) <= 6 * 1024 + 200  # the digest, plus the marker and stamp lines
    assert "| `lib.fail000` |" in body  # the grid's first rows are shown, whole
    assert "more operator(s) in the full report" in body
    assert "traced to 1 changed line" in body and body.count("**1. ") == 1  # 300 variants, one cause
    assert "gh run download 500 -R acme/ops -n dl-gate-report -D dl-gate-out" in body  # the next step survives
    assert body.rstrip().endswith("</sub>")  # the footer survives the cut
    assert "Full report: [job summary and artifact](https://github.com/acme/ops/actions/runs/500)" in body


def test_a_setup_error_fails_with_an_annotation_and_posts_no_comment(tmp_path):
    from gate.judge.verdict import GateReport

    report = GateReport(outcome="error", reason="base ref origin/main is not in this clone",
                        errors=["base ref origin/main is not in this clone (fetch-depth: 0)"],
                        env={"setup_error": True})
    stream = io.StringIO()
    with FakeGitHub() as fake:
        fake.add_pull(7, HEAD)
        env = gh_env(tmp_path, fake.url, pr_event())
        done = publish_to_github(report, env, summary=False, stream=stream)
        assert not fake.comments.get(7)
    assert done["comment"]["action"] == "skipped-setup-error"
    assert "::error title=dl-gate setup error::base ref origin/main" in stream.getvalue()


def test_one_annotation_per_changed_line_never_a_pile_on_one_line():
    # 30 failing variants (10 operators x 3 dtypes), all reached by the same two changed lines
    vs = [regression(op=f"mylib.op{i}", dtype=dt) for i in range(10) for dt in ("float16", "bfloat16", "float32")]
    errors = [n for n in build_annotations(rich_report(verdicts=vs)) if n.level == "error"]
    assert [(n.file, n.line) for n in errors] == [("mylib/ops.py", 14), ("mylib/util.py", 7)]
    assert all("(+29 more failing variant(s)" in n.message for n in errors)
    assert "mylib.op0, mylib.op1" in errors[0].title


CALLS = []


def _fake_publish(report, env, *, paths, **switches):
    CALLS.append((report.outcome, sorted(paths), switches))
    return {}


def test_a_new_publisher_is_one_registry_line_and_gets_its_publish_switch(tmp_path, monkeypatch, capsys):
    import gate.cli
    import gate.commands.publish as pub
    from gate.report.sinks import Publisher

    monkeypatch.setattr(pub, "PUBLISHERS", pub.PUBLISHERS + (
        Publisher("gitlab", "publish on GitLab CI", "tests.test_report_github:_fake_publish"),))
    report = tmp_path / "report.json"
    report.write_text(json.dumps(rich_report().to_dict()))
    CALLS.clear()
    assert gate.cli.main(["publish", str(report), "--gitlab", "--out", str(tmp_path / "out"), "--no-comment"]) == 0
    ((outcome, keys, switches),) = CALLS
    assert outcome == "regression" and "junit" in keys and switches["comment"] is False
    assert capsys.readouterr().out == ""  # a publisher chosen: no Markdown on stdout
