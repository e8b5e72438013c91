"""The workflows ``dl-gate init`` writes into a library's repository: the one adoption path the
README shows, for a repository that is not dl-gate's.

* ``dl-gate.yml``: the PR gate for branches of the repository itself: the Action (the gate as
  built from the Action's own ref, in its container) with ``install:`` (the library and its
  dependencies, as detected), the sticky comment on, the report uploaded as an artifact.
* ``dl-gate-fork.yml`` + ``dl-gate-comment.yml``: pull requests from forks. The fork's run has a
  read-only token: it judges and uploads the report; the ``workflow_run`` job posts the comment
  with a token that can write, running only the pinned Action in ``mode: publish`` on the
  downloaded report (validated as untrusted data), never the PR's code.
* ``dl-gate-baselines.yml``: the weekly baseline refresh, opened as a pull request.

Every ``uses:`` is pinned by commit SHA. The Action's (``dl-gate/dl-gate``, tag ``v<major>`` of
this gate's version: ``v1`` moves with each 1.x release, ``v1.2.3`` never moves; release.yml
makes both) is resolved with ``git ls-remote`` when init runs; offline, the tag is written with
a comment saying to pin it."""
from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Mapping, Optional

from .. import __version__

CHECKOUT = "actions/checkout@fbc6f3992d24b796d5a048ff273f7fcc4a7b6c09  # v5.1.0"
UPLOAD = "actions/upload-artifact@b7c566a772e6b6bfb58ed0dc250532a479d7789f  # v6.0.0"
DOWNLOAD = "actions/download-artifact@37930b1c2abaa49bbe596cd826c3c89aef350131  # v7.0.0"

#: the Action's repository, and the environment variable that points init at another clone URL
#: (a fork, a mirror; the tests use a local one)
ACTION_REPO = "dl-gate/dl-gate"
ACTION_URL_ENV = "DL_GATE_ACTION_URL"
ARTIFACT = "dl-gate-report"
SHA = re.compile(r"[0-9a-f]{40}")


def major_tag(version: str = __version__) -> str:
    """The moving tag of this gate's major version: ``v1`` for 1.4.2 (``v0`` for 0.x)."""
    return "v" + version.split(".", 1)[0]


@dataclass(frozen=True)
class ActionRef:
    repo: str = ACTION_REPO
    ref: str = ""  # a tag or branch; empty: this gate's major tag
    sha: Optional[str] = None  # the commit it resolved to (None: not resolved)

    @property
    def tag(self) -> str:
        return self.ref or major_tag()

    def uses(self) -> str:
        """The ``uses:`` value with its trailing comment."""
        if self.sha:
            return f"{self.repo}@{self.sha}  # {self.tag}"
        return (f"{self.repo}@{self.tag}  # zizmor: ignore[unpinned-uses] not pinned: init could not resolve "
                f"{self.tag} (offline?); replace it by the tag's commit SHA")


def parse_action(text: str) -> ActionRef:
    """``OWNER/REPO[@REF]`` (``--action``) into an unresolved reference."""
    repo, _, ref = text.strip().partition("@")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+", repo):
        from ..errors import GateError

        raise GateError(f"--action {text!r}: give OWNER/REPO or OWNER/REPO@REF, e.g. {ACTION_REPO}@{major_tag()}")
    return ActionRef(repo, ref)


def resolve(action: ActionRef, url: Optional[str] = None, timeout: float = 20.0) -> ActionRef:
    """The reference with the commit its tag (or branch) points at, read with ``git ls-remote``
    from ``url`` (default: the ``DL_GATE_ACTION_URL`` variable, else GitHub); unchanged when the
    remote cannot be read."""
    if action.sha:
        return action
    if SHA.fullmatch(action.tag):
        return ActionRef(action.repo, action.tag, action.tag)
    url = url or os.environ.get(ACTION_URL_ENV) or f"https://github.com/{action.repo}.git"
    tag = action.tag
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "true"}
    try:
        res = subprocess.run(["git", "ls-remote", url, f"refs/tags/{tag}", f"refs/tags/{tag}^{{}}",
                              f"refs/heads/{tag}"], capture_output=True, text=True, timeout=timeout, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return action
    if res.returncode != 0:
        return action
    refs = dict(reversed(line.split("\t", 1)) for line in res.stdout.splitlines() if "\t" in line)
    # an annotated tag's own object is not a commit: its peeled line (^{}) is
    for name in (f"refs/tags/{tag}^{{}}", f"refs/tags/{tag}", f"refs/heads/{tag}"):
        if SHA.fullmatch(refs.get(name, "")):
            return ActionRef(action.repo, tag, refs[name])
    return action


def install_command(repo: Path, framework: str = "torch") -> str:
    """How the library installs itself with its dependencies, for the Action's ``install:``:
    ``pip install -e .`` for a package with a build (setup.py, or a pyproject.toml with a
    ``[project]`` or ``[build-system]`` table), else ``pip install -r requirements.txt``, else
    nothing (the config's ``python_path`` finds the package); TensorFlow first for a TensorFlow
    library (the Action's image holds CPU torch only)."""
    cmd = ""
    pyproject = repo / "pyproject.toml"
    buildable = (repo / "setup.py").exists() or (repo / "setup.cfg").exists() or (
        pyproject.exists() and re.search(r"^\[(project|build-system)\]", pyproject.read_text(errors="replace"), re.M))
    if buildable:
        cmd = "pip install -e ."
    elif (repo / "requirements.txt").exists():
        cmd = "pip install -r requirements.txt"
    if framework == "tensorflow":
        cmd = "pip install 'tensorflow-cpu==2.21.*'" + (f" && {cmd}" if cmd else "")
    return cmd


def _with(inputs: Mapping[str, str], indent: int = 10) -> str:
    pad = " " * indent
    return "".join(f"{pad}{k}: {_yaml_str(v)}\n" for k, v in inputs.items() if v != "")


def _yaml_str(v: str) -> str:
    return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _env_block(env: Mapping[str, str], indent: int = 8) -> str:
    if not env:
        return ""
    pad = " " * indent
    return f"{pad}env:  # the variables `dl-gate init --env` was given (the config's env: lists them)\n" + "".join(
        f"{pad}  {k}: {_yaml_str(v)}\n" for k, v in sorted(env.items()))


GATE = """\
# Written by `dl-gate init`: the PR gate for pull requests from branches of this repository (a fork's
# pull request takes dl-gate-fork.yml + dl-gate-comment.yml: its token cannot write the comment).
# Edit freely; `dl-gate init` never rewrites this file once it exists (delete it to get a fresh one).
#
# No `on: paths:` filter on purpose: a required check skipped by a path filter stays pending
# forever; the gate itself decides "no operator changed" and passes.
name: dl-gate

on:
  pull_request:

permissions: {{}}

concurrency:
  group: dl-gate-${{{{ github.event.pull_request.number }}}}
  cancel-in-progress: true

jobs:
  gate:
    name: dl-gate
    if: github.event.pull_request.head.repo.full_name == github.repository
    runs-on: ubuntu-latest
    timeout-minutes: 45
    permissions:
      contents: read
      pull-requests: write  # the sticky comment
    steps:
      - uses: {checkout}
        with:
          persist-credentials: false
          fetch-depth: 0  # the gate diffs against the merge-base with the base branch
      - name: dl-gate
        uses: {action}
{env}        with:
{gate_with}      - name: Upload the report (report.json, junit.xml, the repro scripts)
        if: always()
        uses: {upload}
        with:
          name: {artifact}
          path: dl-gate-out/
          retention-days: 14
"""

FORK = """\
# Written by `dl-gate init`: the gate for pull requests from forks, part 1 of 2. A fork's run gets
# a read-only token and no secrets: it judges the PR, writes the job summary and annotations, and
# uploads the report; dl-gate-comment.yml (part 2) posts the sticky comment.
# Never run a PR's code under `pull_request_target`.
name: dl-gate (fork PRs)

on:
  pull_request:

permissions: {{}}

concurrency:
  group: dl-gate-fork-${{{{ github.event.pull_request.number }}}}
  cancel-in-progress: true

jobs:
  gate:
    name: dl-gate (fork PR)
    if: github.event.pull_request.head.repo.full_name != github.repository
    runs-on: ubuntu-latest
    timeout-minutes: 45
    permissions:
      contents: read
    steps:
      - uses: {checkout}
        with:
          persist-credentials: false
          fetch-depth: 0
      - name: dl-gate
        uses: {action}
{env}        with:
{fork_with}      - name: Upload the report for the comment job
        if: always()
        uses: {upload}
        with:
          name: {artifact}
          path: dl-gate-out/
          if-no-files-found: error
          retention-days: 7
"""

COMMENT = """\
# Written by `dl-gate init`: the gate for pull requests from forks, part 2 of 2. After
# "dl-gate (fork PRs)" completes, posts its sticky comment with a token that can write. It runs
# only the pinned Action (never the PR's code: nothing is checked out) on the downloaded
# report.json, which `mode: publish` validates as untrusted data; the PR is found from the event.
name: dl-gate comment (fork PRs)

on:
  # zizmor: ignore[dangerous-triggers] the fork-safe comment pattern: runs only the pinned Action,
  # checks out nothing of the PR, and treats the downloaded report as untrusted data (validated)
  workflow_run:
    workflows: ["dl-gate (fork PRs)"]
    types: [completed]

permissions: {{}}

concurrency:
  group: >-
    dl-gate-comment ${{{{ github.event.workflow_run.head_repository.full_name }}}}:${{{{ github.event.workflow_run.head_branch }}}}
  cancel-in-progress: false

jobs:
  comment:
    name: Comment on the fork PR
    if: >-
      github.event.workflow_run.event == 'pull_request' &&
      github.event.workflow_run.head_repository.full_name != github.repository &&
      github.event.workflow_run.conclusion != 'skipped' &&
      github.event.workflow_run.conclusion != 'cancelled'
    runs-on: ubuntu-latest
    timeout-minutes: 10
    permissions:
      actions: read  # download the other run's artifact
      pull-requests: write  # the sticky comment
    steps:
      - name: Download the report of the fork's run
        uses: {download}
        with:
          name: {artifact}
          run-id: ${{{{ github.event.workflow_run.id }}}}
          github-token: ${{{{ github.token }}}}
          path: dl-gate-artifact
      - name: Post or update the sticky comment
        uses: {action}
        with:
          mode: publish
          report: dl-gate-artifact/report.json
          fail-on: never
"""

REFRESH = """\
# Written by `dl-gate init`: re-measures the baselines on the default branch every week and
# opens (or updates) a pull request with them, so a reviewer sees every change of the gate's
# reference. Run it once by hand (Actions > dl-gate baseline refresh > Run workflow) after
# merging the config, or run `dl-gate baseline refresh` locally and commit {baselines}/.
# A PR opened with GITHUB_TOKEN does not trigger other workflows; use an App or PAT token if
# CI must run on it.
name: dl-gate baseline refresh

on:
  schedule:
    - cron: "23 4 * * 1"
  workflow_dispatch:

permissions: {{}}

concurrency:
  group: dl-gate-baseline-refresh
  cancel-in-progress: false

jobs:
  refresh:
    runs-on: ubuntu-latest
    timeout-minutes: 120
    permissions:
      contents: write  # push the baseline branch
      pull-requests: write  # open the baseline pull request
    env:
      BRANCH: dl-gate/baseline-refresh
      BASELINES: {baselines}
    steps:
      - uses: {checkout}  # zizmor: ignore[artipacked] the job pushes the baseline branch with this token
      - name: Refresh the baselines
        uses: {action}
{env}        with:
{refresh_with}      - name: Open or update the baseline pull request
        env:
          GH_TOKEN: ${{{{ github.token }}}}
        run: |
          if [ -z "$(git status --porcelain -- "$BASELINES")" ]; then
            echo "baselines unchanged"
            exit 0
          fi
          git config user.name "github-actions[bot]"
          git config user.email "41898282+github-actions[bot]@users.noreply.github.com"
          git switch -C "$BRANCH"
          git add -- "$BASELINES"
          git commit -m "dl-gate: refresh baselines (run ${{GITHUB_RUN_ID}})"
          git push --force origin "$BRANCH"
          if [ -z "$(gh pr list --head "$BRANCH" --state open --json number --jq '.[].number')" ]; then
            gh pr create --head "$BRANCH" --title "dl-gate: refresh baselines" \\
              --body "Baselines re-measured by run ${{GITHUB_SERVER_URL}}/${{GITHUB_REPOSITORY}}/actions/runs/${{GITHUB_RUN_ID}}."
          fi
"""


def render(config: str = ".dl-gate.yml", baselines: str = "baselines", install: str = "",
           action: Optional[ActionRef] = None, env: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """``{relative path: text}`` of the workflows."""
    action = action or ActionRef()
    common = {"config": config, "install": install}
    fmt = dict(config=config, baselines=baselines, checkout=CHECKOUT, upload=UPLOAD, download=DOWNLOAD,
               artifact=ARTIFACT, action=action.uses(), env=_env_block(env or {}),
               gate_with=_with(common), fork_with=_with({**common, "comment": "false"}),
               refresh_with=_with({"mode": "refresh", **common}))
    return {".github/workflows/dl-gate.yml": GATE.format(**fmt),
            ".github/workflows/dl-gate-fork.yml": FORK.format(**fmt),
            ".github/workflows/dl-gate-comment.yml": COMMENT.format(**fmt),
            ".github/workflows/dl-gate-baselines.yml": REFRESH.format(**fmt)}
