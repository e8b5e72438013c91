"""Publishing a report on GitHub Actions: job summary, annotations, step outputs and the sticky
PR comment, all from the ``GITHUB_*`` environment and the event file.

Which PR and which commit come from trusted sources only: the event payload GitHub wrote
(``pull_request.number`` / ``.head.sha``; for ``workflow_run``, the run's ``head_sha`` and the PR
found through the API by its head repository, branch and SHA), never from the report, which in
the fork-safe split is an artifact produced by PR code."""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Dict, Mapping, Optional

from .. import __version__
from ..judge.verdict import GateReport
from .annotations import emit_annotations, escape_data, neutral
from .comment import DEFAULT_API, DEFAULT_AUTHOR, CommentResult, GitHubClient, Stamp, upsert_sticky_comment
from .common import counts_by, fail_set, has_news, relpath, short_sha
from .markdown import render_comment, render_markdown
from .outputs import append_summary, summary_room, write_outputs

PR_EVENTS = ("pull_request", "pull_request_target", "pull_request_review", "pull_request_review_comment")


@dataclass
class GitHubContext:
    repository: Optional[str] = None
    api_url: str = DEFAULT_API
    server_url: str = "https://github.com"
    event_name: str = ""
    event: Dict[str, Any] = field(default_factory=dict)
    run_id: int = 0
    run_attempt: int = 0
    sha: Optional[str] = None
    workspace: Optional[Path] = None
    token: Optional[str] = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> "GitHubContext":
        event: Dict[str, Any] = {}
        path = env.get("GITHUB_EVENT_PATH")
        if path and Path(path).is_file():
            try:
                loaded = json.loads(Path(path).read_text(encoding="utf-8"))
                event = loaded if isinstance(loaded, dict) else {}
            except (ValueError, OSError):
                event = {}

        def as_int(name: str) -> int:
            try:
                return int(env.get(name) or 0)
            except ValueError:
                return 0

        ws = env.get("GITHUB_WORKSPACE")
        return cls(
            repository=env.get("GITHUB_REPOSITORY") or None,
            api_url=env.get("GITHUB_API_URL") or DEFAULT_API,
            server_url=(env.get("GITHUB_SERVER_URL") or "https://github.com").rstrip("/"),
            event_name=env.get("GITHUB_EVENT_NAME", ""),
            event=event,
            run_id=as_int("GITHUB_RUN_ID"),
            run_attempt=as_int("GITHUB_RUN_ATTEMPT"),
            sha=env.get("GITHUB_SHA") or None,
            workspace=Path(ws) if ws else None,
            token=env.get("INPUT_TOKEN") or env.get("GITHUB_TOKEN") or None,
        )

    @property
    def repo_url(self) -> Optional[str]:
        return f"{self.server_url}/{self.repository}" if self.repository else None

    @property
    def run_url(self) -> Optional[str]:
        """The run whose results are shown: for ``workflow_run``, the gate's run, not ours."""
        wr = self.event.get("workflow_run") if self.event_name == "workflow_run" else None
        if isinstance(wr, dict) and isinstance(wr.get("html_url"), str):
            return wr["html_url"]
        if self.repo_url and self.run_id:
            return f"{self.repo_url}/actions/runs/{self.run_id}"
        return None

    def pr_number(self) -> Optional[int]:
        if self.event_name in PR_EVENTS:
            n = (self.event.get("pull_request") or {}).get("number")
            return n if isinstance(n, int) else None
        if self.event_name == "workflow_run":
            wr = self.event.get("workflow_run") or {}
            for pr in wr.get("pull_requests") or []:
                if (pr.get("head") or {}).get("sha") == wr.get("head_sha") and isinstance(pr.get("number"), int):
                    return pr["number"]
        return None

    def head_sha(self) -> Optional[str]:
        if self.event_name in PR_EVENTS:
            return ((self.event.get("pull_request") or {}).get("head") or {}).get("sha")
        if self.event_name == "workflow_run":
            return (self.event.get("workflow_run") or {}).get("head_sha")
        return self.sha

    def stamp(self) -> Optional[Stamp]:
        sha = self.head_sha()
        if not sha:
            return None
        run_id, attempt = self.run_id, self.run_attempt
        wr = self.event.get("workflow_run") if self.event_name == "workflow_run" else None
        if isinstance(wr, dict) and isinstance(wr.get("id"), int):  # order by the gate's run
            run_id, attempt = wr["id"], int(wr.get("run_attempt") or 1)
        return Stamp(sha=sha, run_id=run_id, run_attempt=attempt)

    def find_pr(self, client: GitHubClient) -> Optional[int]:
        n = self.pr_number()
        if n is not None or self.event_name != "workflow_run" or not self.repository:
            return n
        wr = self.event.get("workflow_run") or {}
        owner = ((wr.get("head_repository") or {}).get("owner") or {}).get("login")
        branch, sha = wr.get("head_branch"), wr.get("head_sha")
        if not (owner and branch and sha):
            return None
        return client.find_pull(self.repository, owner, branch, sha)


def _log(msg: str) -> None:
    print(f"dl-gate: {neutral(msg)}", file=sys.stderr)


def _warn(msg: str, stream: IO[str]) -> None:
    print(f"::warning title=dl-gate::{escape_data(msg)}", file=stream)


def comment_footer(report: GateReport, stamp: Optional[Stamp], run_url: Optional[str]) -> str:
    parts = [f"dl-gate {__version__}"]
    if stamp:
        parts.append(f"results for {short_sha(stamp.sha)}")
    if run_url:
        parts.append(f"[run and full report]({run_url})")
    return "<sub>" + " · ".join(parts) + "</sub>"


def post_comment(report: GateReport, ctx: GitHubContext, *, token: Optional[str] = None, key: str = "default",
                 author: str = DEFAULT_AUTHOR, client: Optional[GitHubClient] = None,
                 check_head: bool = True) -> CommentResult:
    token = token or ctx.token
    if not token:
        return CommentResult("skipped-readonly", message="no token: the PR comment is not written")
    if not ctx.repository:
        return CommentResult("skipped-no-pr", message="GITHUB_REPOSITORY is not set")
    client = client or GitHubClient(token, ctx.api_url)
    try:
        number = ctx.find_pr(client)
    except Exception as exc:  # the lookup is best-effort; the gate never fails on it
        return CommentResult("failed", message=f"could not find the pull request: {exc}")
    if number is None:
        return CommentResult("skipped-no-pr", message=f"no pull request for this {ctx.event_name or 'run'}")
    stamp = ctx.stamp() or Stamp(sha=report.head_sha or "0" * 40)
    footer = comment_footer(report, stamp, ctx.run_url)
    body = render_comment(report, full_report=ctx.run_url, repo_url=ctx.repo_url, footer=footer,
                          run_id=str(ctx.run_id) if ctx.run_id else None, repository=ctx.repository)
    return upsert_sticky_comment(client, ctx.repository, number, body, stamp, key=key, author=author,
                                 has_news=has_news(report), check_head=check_head)


def publish_to_github(report: GateReport, env: Mapping[str, str] = os.environ, *,
                      out_dir: Optional[os.PathLike] = None, paths: Optional[Dict[str, Path]] = None,
                      summary: bool = True, annotations: bool = True, comment: bool = True, outputs: bool = True,
                      comment_key: str = "default", comment_author: Optional[str] = None,
                      token: Optional[str] = None, stream: Optional[IO[str]] = None,
                      client: Optional[GitHubClient] = None) -> Dict[str, Any]:
    """Publish ``report``: job summary, annotations, PR comment, step outputs (each switchable,
    each skipped where its ``GITHUB_*`` variable is missing). Never raises on a GitHub API
    failure (a fork's read-only token gives a warning annotation); returns what was done."""
    stream = stream or sys.stdout
    ctx = GitHubContext.from_env(env)
    done: Dict[str, Any] = {"summary": None, "annotations": 0, "comment": None, "outputs": None}
    if paths is None and out_dir is not None:
        from . import write_all

        paths = write_all(report, out_dir, root=ctx.workspace)
    paths = paths or {}

    if summary and env.get("GITHUB_STEP_SUMMARY"):
        room = summary_room(env)
        if room > 1024:
            md = render_markdown(report, limit=room - 1, full_report=ctx.run_url, repo_url=ctx.repo_url,
                                 run_id=str(ctx.run_id) if ctx.run_id else None, repository=ctx.repository)
            done["summary"] = str(append_summary(md, env))
        else:
            _log("job summary is full; the report is in the artifacts")

    if annotations:
        done["annotations"] = len(emit_annotations(report, root=ctx.workspace, stream=stream))

    if comment and report.env.get("setup_error"):
        # a workflow set up so that nothing can be judged (e.g. the base branch is not in a
        # shallow clone): the step fails with an error annotation; the PR gets no comment
        done["comment"] = CommentResult("skipped-setup-error", message="setup error: no PR comment").to_dict()
        _log("PR comment: not written for a setup error (see the error annotation)")
    elif comment:
        res = post_comment(report, ctx, token=token, key=comment_key, author=comment_author or DEFAULT_AUTHOR,
                           client=client)
        done["comment"] = res.to_dict()
        if res.warning:
            _warn(res.message, stream)
        else:
            _log(f"PR comment: {res.action}" + (f" ({res.url})" if res.url else "") +
                 (f": {res.message}" if res.message else ""))

    if outputs and env.get("GITHUB_OUTPUT"):
        values = outputs_for(report, paths, ctx.workspace)
        if done["comment"]:
            values["comment-action"] = done["comment"]["action"]
            values["comment-url"] = done["comment"].get("url") or ""
        done["outputs"] = str(write_outputs(values, env))
    stream.flush()
    return done


def outputs_for(report: GateReport, paths: Dict[str, Path], workspace: Optional[Path]) -> Dict[str, Any]:
    failing = counts_by(report, fail_set(report))
    values: Dict[str, Any] = {
        "outcome": report.outcome,
        "exit-code": report.exit_code,
        "reason": report.reason,
        "variants": len(report.verdicts),
        "regressions": failing,
        "passed": counts_by(report, ("pass", "improvement")),
        "errors": counts_by(report, ("error",)) + len(report.errors),
        "needs-baseline": counts_by(report, ("needs-baseline",)),
    }
    for name, key in (("report-json", "report"), ("junit", "junit"), ("report-md", "markdown"), ("plot", "plot")):
        p = paths.get(key)
        values[name] = (relpath(str(Path(p).resolve()), workspace) or str(p)) if p else ""
    return values
