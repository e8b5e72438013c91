"""``dl-gate action``: the container entrypoint of the GitHub Action (``action.yml``).

Reads the action's inputs (``INPUT_*``) and the runner's ``GITHUB_*`` environment, then

1. runs one pipeline command through :func:`gate.cli.main` —
   ``mode: gate`` -> ``dl-gate run --base REF --out DIR``;
   ``mode: refresh`` -> ``dl-gate baseline refresh`` (``--nightly`` with ``nightly: true``);
   ``mode: publish`` -> nothing (publishes the existing ``report`` input, e.g. an artifact);
2. publishes whatever report came out (a run that died before writing one gets an ``error``
   report, so JUnit, summary and outputs exist on every outcome);
3. gives files it left root-owned in the runner-owned workspace back to the workspace owner
   (a Docker action runs as root; later steps run as the runner user);
4. exits per ``fail-on``: by default ``regression`` and ``error`` fail the step; ``needs-baseline`` and
   ``error`` are reported (an error as a warning annotation) and exit 0."""
from __future__ import annotations

import argparse
import io
import os
import re
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, List, Mapping, Optional

from ..errors import EXIT_CODES, GateError, Outcome

MODES = ("gate", "refresh", "publish")
#: a regression fails the step, and so does an error: a changed operator that could not be judged
#: (a gate that goes green whenever it is interrupted or under-searched is no gate)
DEFAULT_FAIL_ON = ("regression", "error")
FAILABLE = tuple(o.value for o in Outcome if o is not Outcome.PASS)
TRUE = ("true", "yes", "on", "1")
FALSE = ("false", "no", "off", "0", "")


def register(sub) -> None:
    p = sub.add_parser("action", help="GitHub Action entrypoint: reads INPUT_* and GITHUB_* (see docs/action.md)", formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="example (what action.yml runs):\n  INPUT_MODE=gate INPUT_BUDGET=120 dl-gate action")
    p.set_defaults(func=run)


def get_input(env: Mapping[str, str], name: str, default: str = "") -> str:
    """An action input as the runner passes it: ``INPUT_<NAME>`` upper-cased, spaces to ``_``,
    hyphens kept (``base-ref`` -> ``INPUT_BASE-REF``); the ``_`` spelling is accepted too."""
    key = "INPUT_" + name.replace(" ", "_").upper()
    for k in (key, key.replace("-", "_")):
        if k in env:
            return env[k].strip()
    return default


def _bool(env, name: str, default: bool) -> bool:
    raw = get_input(env, name, "true" if default else "false").lower()
    if raw in TRUE:
        return True
    if raw in FALSE:
        return False
    raise GateError(f"input {name}: expected true or false, got {raw!r}")


@dataclass
class ActionInputs:
    mode: str = "gate"
    config: str = ""
    base_ref: str = ""
    budget: str = ""
    per_op: str = ""
    token: str = ""
    comment: bool = True
    fail_on: List[str] = field(default_factory=lambda: list(DEFAULT_FAIL_ON))
    out: str = "dl-gate-out"
    report: str = ""
    comment_key: str = "default"
    comment_author: str = ""
    nightly: bool = False
    nightly_budget: str = ""
    install: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "ActionInputs":
        mode = get_input(env, "mode", "gate").lower() or "gate"
        if mode not in MODES:
            raise GateError(f"input mode: expected one of {', '.join(MODES)}, got {mode!r}")
        # an empty value (``fail-on: ${{ vars.UNSET }}``) is the default, never "fail on nothing"
        fail_raw = get_input(env, "fail-on", ",".join(DEFAULT_FAIL_ON)).lower() or ",".join(DEFAULT_FAIL_ON)
        fail_on = [x for x in re.split(r"[\s,]+", fail_raw) if x]
        if fail_on in (["never"], ["none"]):
            fail_on = []
        bad = [x for x in fail_on if x not in FAILABLE]
        if bad:
            raise GateError(f"input fail-on: unknown outcome {bad[0]!r} (use {', '.join(FAILABLE)} or never)")
        budget, per_op = get_input(env, "budget"), get_input(env, "per-op")
        for name, val in (("budget", budget), ("per-op", per_op)):
            if val:
                try:
                    if not 0 < float(val) < float("inf"):
                        raise ValueError
                except ValueError:
                    raise GateError(f"input {name}: expected a positive number of seconds, got {val!r}") from None
        inp = cls(mode=mode, config=get_input(env, "config"), base_ref=get_input(env, "base-ref"), budget=budget,
                  per_op=per_op,
                  token=get_input(env, "token"), comment=_bool(env, "comment", True), fail_on=fail_on,
                  out=get_input(env, "out", "dl-gate-out") or "dl-gate-out", report=get_input(env, "report"),
                  comment_key=get_input(env, "comment-key", "default") or "default",
                  comment_author=get_input(env, "comment-author"), nightly=_bool(env, "nightly", False),
                  nightly_budget=get_input(env, "nightly-budget"), install=get_input(env, "install"))
        if inp.nightly_budget:
            try:
                if not 0 < float(inp.nightly_budget) < float("inf"):
                    raise ValueError
            except ValueError:
                raise GateError(f"input nightly-budget: expected a positive number of seconds, "
                                f"got {inp.nightly_budget!r}") from None
        if inp.nightly and inp.mode != "refresh":
            raise GateError(f"input nightly: only with mode: refresh (got mode: {inp.mode})")
        if inp.mode == "publish" and not inp.report:
            raise GateError("input report: required with mode: publish (the report.json to publish)")
        return inp


def resolve_base_ref(inp: ActionInputs, env: Mapping[str, str], event: dict) -> str:
    """The ref to diff against: the input; else the PR's base branch as fetched
    (``origin/<GITHUB_BASE_REF>``, so the diff is against the merge-base with its current tip);
    else the event's base SHA, or the commit before a push."""
    if inp.base_ref:
        return inp.base_ref
    if env.get("GITHUB_BASE_REF"):
        return f"origin/{env['GITHUB_BASE_REF']}"
    base_sha = ((event.get("pull_request") or {}).get("base") or {}).get("sha")
    if base_sha:
        return base_sha
    before = event.get("before")
    if isinstance(before, str) and before.strip("0"):
        return before
    raise GateError(f"input base-ref is required for a {env.get('GITHUB_EVENT_NAME') or 'local'} run "
                    "(no pull request base and no previous commit in the event)")


def command_for(inp: ActionInputs, env: Mapping[str, str], event: dict) -> Optional[List[str]]:
    """The ``dl-gate`` argv that ``mode`` runs (None for ``publish``)."""
    common: List[str] = []
    if inp.config:
        common += ["--config", inp.config]
    if inp.budget:
        common += ["--budget", inp.budget]
    if inp.per_op:
        common += ["--per-op", inp.per_op]
    if inp.mode == "gate":
        return ["run", "--base", resolve_base_ref(inp, env, event), "--out", inp.out] + common
    if inp.mode == "refresh":
        nightly = ["--nightly"] + (["--nightly-budget", inp.nightly_budget] if inp.nightly_budget else [])
        return ["baseline", "refresh"] + common + (nightly if inp.nightly else [])
    return None


class _Tee(io.TextIOBase):
    """Writes through to a stream and keeps the text (to quote the CLI's error line)."""

    def __init__(self, stream):
        self.stream, self.buf = stream, io.StringIO()

    def write(self, s):
        self.buf.write(s)
        return self.stream.write(s)

    def flush(self):
        self.stream.flush()


def run_cli(argv: List[str]) -> tuple:
    """Run ``dl-gate ARGV`` in this process; (exit code, last error line)."""
    from ..cli import main

    tee = _Tee(sys.stderr)
    old = sys.stderr
    sys.stderr = tee
    try:
        try:
            rc = main(argv)
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else EXIT_CODES[Outcome.ERROR]
        except Exception as exc:  # a crash is a harness error, reported like any other
            traceback.print_exc()
            return EXIT_CODES[Outcome.ERROR], f"dl-gate {argv[0]} crashed: {type(exc).__name__}: {exc}"
    finally:
        sys.stderr = old
    lines = [ln.strip() for ln in tee.buf.getvalue().splitlines() if "error" in ln.lower() and ln.strip()]
    return int(rc or 0), (lines[-1] if lines else "")


def fallback_report(argv: List[str], rc: int, message: str, out: Path, refresh: bool):
    """The report of a run that wrote none."""
    from ..judge.verdict import GateReport

    if refresh and rc == 0:
        return GateReport(outcome="pass", reason="baselines refreshed")
    reason = message or f"`dl-gate {' '.join(argv[:2])}` exited with code {rc} without writing {out}/report.json"
    report = _error_report(reason)
    report.env["run_incomplete"] = True  # whatever the exit code said: fails the step
    return report


def agreeing_report(report, rc: int, argv: List[str]):
    """The result is the gate's exit status: a report.json whose outcome says otherwise (a
    file rewritten by something the code under test left running) is an ``error`` that fails
    the step, never the pass it claims."""
    if EXIT_CODES.get(Outcome(report.outcome)) == rc:
        return report
    claimed = report.outcome
    why = (f"report.json says {claimed} but `dl-gate {argv[0]}` exited with code {rc}: the report file is not "
           "the gate's result (rewritten by a process the code under test started?)")
    out = _error_report(why)
    out.env["run_incomplete"] = True  # fails the step whatever fail-on says
    return out


#: what the install step gets beyond the workers' allow-list: pip's own settings and proxies (a
#: private index, a constraints file), still without any name that looks like a credential
INSTALL_NAMES_PREFIXES = ("PIP_", "UV_")
INSTALL_TIMEOUT = 1800  # seconds the install step may take
INSTALL_NAMES = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
                 "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")


def install_step(command: str, workspace: Optional[str], stream=None) -> None:
    """Run the ``install`` input (the library and its dependencies, e.g. ``pip install -e .``)
    in the workspace before the gate, in the container's environment where the gate's workers
    will import the library. It runs the repository's install code, so it gets what a worker
    gets (no token, no runner command file) plus pip's settings; its output is relayed with
    workflow commands defused. A failure is a setup error: one line, the step fails."""
    import subprocess

    from ..backends.sandbox import denied, worker_env
    from ..supervise import CommandGuard

    stream = stream or sys.stderr
    names = [k for k in os.environ if (k.startswith(INSTALL_NAMES_PREFIXES) or k in INSTALL_NAMES) and not denied(k)]
    env = worker_env(names=names, gate_first=False)
    print(f"dl-gate action: install: {command}", file=stream)
    guard = CommandGuard()
    try:
        proc = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", command], cwd=workspace or None, env=env,
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, errors="replace", timeout=INSTALL_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise GateError(f"input install: `{command}` did not finish in {INSTALL_TIMEOUT}s") from None
    stream.write(guard.feed(proc.stdout, final=True))
    stream.flush()
    if proc.returncode != 0:
        last = next((ln.strip() for ln in reversed(proc.stdout.splitlines()) if ln.strip()), "")
        raise GateError(f"input install: `{command}` exited {proc.returncode}"
                        + (f": {last[:300]}" if last else "") + " (the library could not be installed for the gate)")



def trust_workspace(env: dict, workspace: Optional[str]) -> None:
    """Let git work in the mounted workspace owned by another user (``safe.directory``),
    through ``GIT_CONFIG_*`` so no config file is written."""
    if not workspace:
        return
    n = int(env.get("GIT_CONFIG_COUNT", "0") or 0)
    env[f"GIT_CONFIG_KEY_{n}"] = "safe.directory"
    env[f"GIT_CONFIG_VALUE_{n}"] = workspace
    env["GIT_CONFIG_COUNT"] = str(n + 1)


def fix_ownership(roots: Iterable[Path], like: Path, max_entries: int = 500_000) -> int:
    """Give entries under ``roots`` that are owned by root to the owner of ``like`` (the
    workspace), when we run as root and it is not root's. Returns how many were changed."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or not like.exists():
        return 0
    st = like.stat()
    if st.st_uid == 0:
        return 0
    changed = seen = 0
    for root in roots:
        if not root.exists():
            continue
        entries = [root]
        for dirpath, dirnames, filenames in os.walk(root):
            entries.extend(Path(dirpath) / n for n in dirnames + filenames)
            if len(entries) + seen > max_entries:
                break
        for p in entries:
            seen += 1
            try:
                if p.lstat().st_uid == 0:
                    os.lchown(p, st.st_uid, st.st_gid)
                    changed += 1
            except OSError:
                continue
    return changed


def _error_report(message: str):
    from ..judge.verdict import GateReport

    return GateReport(outcome=Outcome.ERROR.value, reason=message, errors=[message])


def _finish(report, inp: ActionInputs, env: Mapping[str, str], workspace: Optional[str]) -> None:
    """Write the files and publish: the same on every outcome."""
    from ..report import write_all
    from ..report.github import publish_to_github

    out = Path(inp.out)
    paths = write_all(report, out, root=workspace)
    token = inp.token or env.get("GITHUB_TOKEN") or None
    # a workflow_run job publishing another run's report: its annotations belong to that run (on the
    # PR's commit), not to this job on the default branch
    annotations = not (inp.mode == "publish" and env.get("GITHUB_EVENT_NAME") == "workflow_run")
    publish_to_github(report, env, paths=paths, comment=inp.comment, token=token, comment_key=inp.comment_key,
                      comment_author=inp.comment_author or None, annotations=annotations)
    if workspace:
        fix_ownership([Path(workspace)], Path(workspace))


def run(args) -> int:
    from ..report.github import GitHubContext
    from ..report.schema import load_report

    env = os.environ
    workspace = env.get("GITHUB_WORKSPACE")
    trust_workspace(os.environ, workspace)
    started = time.time()
    try:
        inp = ActionInputs.from_env(env)
        if inp.config and inp.mode != "publish" and not Path(inp.config).is_file():
            raise GateError(f"input config: {inp.config} is not a file in the workspace")
        if inp.mode == "publish":
            report = load_report(inp.report)  # untrusted: validated, never executed
    except GateError as exc:
        # a mistake in the workflow or a bad artifact, not a gate result: report it and fail the step
        inp = ActionInputs(out=get_input(env, "out", "dl-gate-out") or "dl-gate-out", comment=False)
        _finish(_error_report(str(exc)), inp, env, workspace)
        raise
    ctx = GitHubContext.from_env(env)
    if inp.mode != "publish":
        out = Path(inp.out)
        stale = out / "report.json"
        if stale.exists():  # a self-hosted runner keeps the workspace: never publish an old report
            stale.unlink()
        try:
            argv = command_for(inp, env, ctx.event)
            if inp.install:
                install_step(inp.install, workspace)
        except GateError as exc:  # e.g. no base ref for this event, an install that failed: a run error
            report = _error_report(str(exc))
            if str(exc).startswith("input install:"):  # nothing was judged: fails the step whatever fail-on says
                report.env["setup_error"] = True
        else:
            print(f"dl-gate action: dl-gate {' '.join(argv)}", file=sys.stderr)
            rc, message = run_cli(argv)
            if stale.exists():
                try:
                    report = load_report(stale)
                except GateError as exc:
                    report = _error_report(str(exc))
                report = agreeing_report(report, rc, argv) if inp.mode == "gate" else report
            else:
                report = fallback_report(argv, rc, message, out, inp.mode == "refresh")
    _finish(report, inp, env, workspace)
    setup = report.outcome == Outcome.ERROR.value and bool(report.env.get("setup_error"))
    incomplete = report.outcome == Outcome.ERROR.value and bool(report.env.get("run_incomplete"))
    code = report.exit_code if report.outcome in inp.fail_on or setup or incomplete else 0
    print(f"dl-gate action: outcome {report.outcome} in {time.time() - started:.0f}s; step exits {code} "
          f"(fail-on: {', '.join(inp.fail_on) or 'never'}"
          + ("; a setup error fails the step whatever fail-on says" if setup else "")
          + ("; a run that ended without its report fails the step whatever fail-on says" if incomplete else "")
          + ")", file=sys.stderr)
    return code
