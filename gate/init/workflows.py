"""The two workflows ``dl-gate init`` writes into a library's repository: the PR gate and the
scheduled baseline refresh. They install the library itself (``pip install -e .``: its own
declared dependencies) next to dl-gate and call the CLI, so a library with dependencies
outside the action's image works as it does on the developer's machine."""
from __future__ import annotations

CHECKOUT = "actions/checkout@fbc6f3992d24b796d5a048ff273f7fcc4a7b6c09  # v5.1.0"
SETUP_PYTHON = "actions/setup-python@a26af69be951a213d495a4c3e4e4022e16d87065  # v5.6.0"
UPLOAD = "actions/upload-artifact@b7c566a772e6b6bfb58ed0dc250532a479d7789f  # v6.0.0"

INSTALL = """\
          python -m pip install --extra-index-url https://download.pytorch.org/whl/cpu "${{DL_GATE_SPEC}}"
          python -m pip install -e .{extra}"""

GATE = """\
# Written by `dl-gate init`: the PR gate. Edit freely; `dl-gate init` never rewrites this file
# once it exists (delete it to get a fresh one).
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
    runs-on: ubuntu-latest
    timeout-minutes: 45
    permissions:
      contents: read
    env:
      DL_GATE_SPEC: "{spec}"
    steps:
      - uses: {checkout}
        with:
          persist-credentials: false
          fetch-depth: 0  # the gate diffs against the merge-base with the base branch
      - uses: {setup_python}
        with:
          python-version: "3.12"
      - name: Install dl-gate and this library (with its declared dependencies)
        run: |
{install}
      - name: dl-gate run
        id: run
        env:
          BASE_REF: ${{{{ github.base_ref }}}}
        run: |
          set +e
          dl-gate run --base "origin/${{BASE_REF}}" --config {config} --out dl-gate-out
          echo "exit-code=$?" >> "$GITHUB_OUTPUT"
      - name: Job summary and annotations
        if: always()
        run: dl-gate publish dl-gate-out/report.json --out dl-gate-out --github --no-comment
      - name: Upload the report
        if: always()
        uses: {upload}
        with:
          name: dl-gate-report
          path: dl-gate-out/
          retention-days: 14
      - name: Fail on a regression or an error (a changed operator that could not be judged)
        if: steps.run.outputs.exit-code == '1' || steps.run.outputs.exit-code == '2'
        run: exit 1
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
      DL_GATE_SPEC: "{spec}"
      BRANCH: dl-gate/baseline-refresh
      BASELINES: {baselines}
    steps:
      - uses: {checkout}  # zizmor: ignore[artipacked] the job pushes the baseline branch with this token
      - uses: {setup_python}
        with:
          python-version: "3.12"
      - name: Install dl-gate and this library (with its declared dependencies)
        run: |
{install}
      - name: Refresh the baselines
        run: dl-gate baseline refresh --config {config}
      - name: Open or update the baseline pull request
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


def render(config: str = ".dl-gate.yml", baselines: str = "baselines", spec: str = "dl-gate[torch]",
           extra: str = "") -> dict:
    """``{relative path: text}`` of the two workflows."""
    fmt = dict(config=config, baselines=baselines, spec=spec, checkout=CHECKOUT, setup_python=SETUP_PYTHON,
               upload=UPLOAD, install=INSTALL.format(extra=f"'[{extra}]'" if extra else ""))
    return {".github/workflows/dl-gate.yml": GATE.format(**fmt),
            ".github/workflows/dl-gate-baselines.yml": REFRESH.format(**fmt)}
