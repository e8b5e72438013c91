"""action.yml, the Dockerfile and .github/workflows/: real validators (actionlint with shellcheck,
check-jsonschema's built-in GitHub schemas, hadolint), each shown to catch a broken file, plus the
properties the gate's safety rests on (fork-safe split, approval gate, no path filters), and the
scripts of the GPU gate and its comment job run as the runner would run them."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gate.commands.action import ActionInputs
from gate.report.github import outputs_for
from tests.github_fake import FakeGitHub
from tests.report_samples import rich_report

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    path = BIN / name if (BIN / name).exists() else shutil.which(name)
    if not path:
        pytest.fail(f"{name} not found: install the test extra (pip install -e '.[test]')")
    return str(path)


def run(cmd, cwd=ROOT):
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(ROOT)}
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=120, env=env)


def load(path: Path) -> dict:
    # YAML 1.1 reads the key `on` as True: normalise it back
    data = yaml.safe_load(path.read_text())
    if True in data:
        data["on"] = data.pop(True)
    return data


# -- validators --------------------------------------------------------------------------------
def test_actionlint_passes_on_every_workflow():
    assert len(WORKFLOWS) >= 6
    res = run([tool("actionlint"), "-color=false", "-shellcheck", tool("shellcheck")])
    assert res.returncode == 0, res.stdout + res.stderr


def zizmor(persona: str, *extra: str) -> list:
    """zizmor's findings as JSON (offline: no GitHub API calls)."""
    res = run([tool("zizmor"), "--offline", "--no-progress", "--format", "json", "--persona", persona, *extra, "."])
    assert res.stdout.strip(), res.stderr
    return json.loads(res.stdout)


def finding_key(finding: dict) -> tuple:
    path = finding["locations"][0]["symbolic"]["key"]["Local"]["verbatim_path"]
    return finding["ident"], Path(path).name


def test_zizmor_pedantic_finds_nothing_unjustified():
    # every finding left is ignored in the file with its reason (and answered in docs/action.md)
    res = run([tool("zizmor"), "--offline", "--format", "plain", "--no-progress", "--persona", "pedantic", "."])
    assert res.returncode == 0, res.stdout + res.stderr
    text = " ".join(p.read_text() for p in [*WORKFLOWS, ROOT / "action.yml"])
    ignores = re.findall(r"# zizmor: ignore\[[\w-]+\](.*)", text)
    assert ignores
    for reason in ignores:
        assert reason.strip(), "a zizmor ignore without a reason"


def documented_zizmor_findings() -> set:
    doc = (ROOT / "docs" / "action.md").read_text()
    section = doc.split("### zizmor findings", 1)[1].split("\n## ", 1)[0]
    rows = set()
    for line in section.splitlines():
        cells = line.split("|")
        if len(cells) > 3 and (rule := re.match(r"\s*`([\w-]+)`", cells[1])):
            files = re.findall(r"`([\w.-]+\.ya?ml)`", cells[2])
            assert files, line
            rows |= {(rule.group(1), f) for f in files}
    return rows


def test_every_zizmor_finding_is_answered_in_the_docs():
    # pedantic with every ignore honoured: clean; without them, each finding has its row in
    # docs/action.md's table, and each row is still a finding (auditor, the widest persona)
    assert zizmor("pedantic") == []
    documented = documented_zizmor_findings()
    pedantic = {finding_key(f) for f in zizmor("pedantic", "--no-ignores")}
    assert pedantic, "zizmor --no-ignores found nothing: is it reading the workflows?"
    assert pedantic <= documented, f"answer these in docs/action.md's zizmor table: {sorted(pedantic - documented)}"
    auditor = {finding_key(f) for f in zizmor("auditor", "--no-ignores")}
    assert documented <= auditor, f"stale rows in docs/action.md's zizmor table: {sorted(documented - auditor)}"


def test_zizmor_catches_a_tag_pinned_action_and_workflow_level_write(tmp_path):
    wf = tmp_path / ".github" / "workflows"
    wf.mkdir(parents=True)
    (wf / "bad.yml").write_text(
        "on: pull_request\npermissions:\n  pull-requests: write\njobs:\n  a:\n    runs-on: ubuntu-latest\n"
        "    steps:\n      - uses: actions/checkout@v5\n")
    res = run([tool("zizmor"), "--offline", "--format", "plain", "--no-progress", "--persona", "pedantic", "."],
              cwd=tmp_path)
    assert res.returncode != 0 and "unpinned-uses" in res.stdout and "excessive-permissions" in res.stdout, res.stdout


def test_actionlint_and_shellcheck_catch_mistakes(tmp_path):
    (tmp_path / ".github" / "workflows").mkdir(parents=True)
    (tmp_path / ".github" / "workflows" / "bad.yml").write_text(
        "on: pull_request\njobs:\n  a:\n    runs-on: ubuntu-latest\n    steps:\n"
        "      - run: echo ${{ github.event.pull_request.title }}\n"
        "      - run: cp $SRC $DST\n")
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    res = run([tool("actionlint"), "-color=false", "-shellcheck", tool("shellcheck")], cwd=tmp_path)
    assert res.returncode != 0
    assert "potentially untrusted" in res.stdout and "SC2086" in res.stdout


def test_workflows_and_action_match_githubs_schemas():
    res = run([tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows", *map(str, WORKFLOWS)])
    assert res.returncode == 0, res.stdout + res.stderr
    res = run([tool("check-jsonschema"), "--builtin-schema", "vendor.github-actions", str(ROOT / "action.yml")])
    assert res.returncode == 0, res.stdout + res.stderr


def test_the_action_schema_catches_a_broken_action(tmp_path):
    bad = tmp_path / "action.yml"
    bad.write_text((ROOT / "action.yml").read_text().replace("using: docker", "using: dockerr"))
    res = run([tool("check-jsonschema"), "--builtin-schema", "vendor.github-actions", str(bad)])
    assert res.returncode != 0


def test_hadolint_passes_on_the_dockerfile_and_catches_mistakes(tmp_path):
    res = run([tool("hadolint"), "--config", str(ROOT / ".hadolint.yaml"), "Dockerfile"])
    assert res.returncode == 0, res.stdout + res.stderr
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install requests\nUSER root\n")
    res = run([tool("hadolint"), "--config", str(ROOT / ".hadolint.yaml"), str(bad)])
    assert res.returncode != 0 and "DL3007" in res.stdout and "DL3013" in res.stdout


# -- the action ----------------------------------------------------------------------------------
def test_action_is_a_docker_action_whose_inputs_the_entrypoint_reads():
    action = yaml.safe_load((ROOT / "action.yml").read_text())
    assert action["runs"]["using"] == "docker"
    # the prebuilt image by reference, at this version (release.yml pins it by digest on the tag)
    version = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    assert re.fullmatch(rf"docker://ghcr\.io/[\w.-]+/dl-gate:{re.escape(version)}-cpu(@sha256:[0-9a-f]{{64}})?",
                        action["runs"]["image"]), action["runs"]["image"]
    values = {"mode": "refresh", "config": "c.yml", "base-ref": "origin/dev", "budget": "5", "token": "t",
              "comment": "false", "comment-key": "gpu", "comment-author": "dl-gate-app[bot]", "fail-on": "error",
              "out": "o", "report": "r.json", "nightly": "true", "nightly-budget": "120", "per-op": "7",
              "install": "pip install -e ."}
    assert set(action["inputs"]) == set(values)
    default = ActionInputs.from_env({})
    for name, spec in action["inputs"].items():
        assert spec.get("description"), name
        env = {f"INPUT_{name.upper()}": values[name]}
        if name == "nightly":  # a refresh-only input
            env["INPUT_MODE"] = "refresh"
        got = ActionInputs.from_env(env)
        field = name.replace("-", "_")
        assert getattr(got, field) != getattr(default, field), f"input {name} is not read"
    declared = set(action["outputs"])
    produced = set(outputs_for(rich_report(), {}, None)) | {"comment-action", "comment-url"}
    assert declared == produced


def test_docs_cover_every_input_and_output():
    action = yaml.safe_load((ROOT / "action.yml").read_text())
    doc = (ROOT / "docs" / "action.md").read_text()
    for name in list(action["inputs"]) + list(action["outputs"]):
        assert f"`{name}`" in doc, name


def test_dockerfile_variants_and_entrypoint():
    text = (ROOT / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["dl-gate", "action"]' in text
    assert "ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in text
    assert 'ARG TF_PACKAGE=""' in text  # the default (the action's image) is torch only
    # two stages: only the venv reaches the final image (no pip cache, no build leftovers)
    assert text.count("\nFROM ") == 2 and "COPY --from=build /opt/venv /opt/venv" in text
    assert "PIP_NO_CACHE_DIR=1" in text
    assert "\nUSER " not in text  # Docker actions must run as the image's default user (root)


def test_release_publishes_every_variant_and_pins_the_action_by_digest():
    rel = load(ROOT / ".github" / "workflows" / "release.yml")
    run_text = " ".join(str(s.get("run", "")) for s in rel["jobs"]["release"]["steps"])
    for variant in ("build cpu ", "build cpu-all ", "build cuda "):
        assert variant in run_text
    assert "RepoDigests" in run_text and "image: ${PINNED}" in run_text


def test_release_tags_a_fixed_version_and_moves_the_major_tag(tmp_path):
    """The tag step as the runner runs it, twice (0.1.0, then 0.2.0), pushing to a local origin:
    v0.1.0 stays where it was released, v0 moves to the newest 0.x (what init pins by SHA)."""
    rel = load(ROOT / ".github" / "workflows" / "release.yml")
    step = next(s for s in rel["jobs"]["release"]["steps"] if s.get("name", "").startswith("Tag the release"))
    origin, work = tmp_path / "origin.git", tmp_path / "work"
    git_env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
               "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    subprocess.run(["git", "init", "-q", "--bare", str(origin)], check=True, env=git_env)
    subprocess.run(["git", "init", "-q", "-b", "main", str(work)], check=True, env=git_env)
    (work / "action.yml").write_text("runs:\n  using: docker\n  image: docker://ghcr.io/o/dl-gate:0.1.0-cpu\n")
    for cmd in (["git", "add", "."], ["git", "commit", "-qm", "init"], ["git", "remote", "add", "origin", str(origin)]):
        subprocess.run(cmd, cwd=work, check=True, env=git_env)

    def release(version: str) -> str:
        pinned = f"docker://ghcr.io/o/dl-gate:{version}-cpu@sha256:{'a' * 64}"
        env = dict(git_env, VERSION=version, PINNED=pinned, GH_TOKEN="t", GITHUB_SERVER_URL="https://github.com")
        res = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", step["run"]], cwd=work, env=env,
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stdout + res.stderr
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=work, capture_output=True, text=True).stdout.strip()

    def tags() -> dict:
        out = subprocess.run(["git", "ls-remote", str(origin), "refs/tags/*^{}"], capture_output=True, text=True).stdout
        return {line.split("\t")[1][len("refs/tags/"):-3]: line.split("\t")[0] for line in out.splitlines()}

    first = release("0.1.0")
    assert tags() == {"v0.1.0": first, "v0": first}
    second = release("0.2.0")
    assert tags() == {"v0.1.0": first, "v0.2.0": second, "v0": second}
    from gate.init.workflows import ActionRef, resolve

    assert resolve(ActionRef(), url=str(origin)).sha == second  # what init would pin now


# -- the workflows --------------------------------------------------------------------------------
def workflows():
    return {p.name: load(p) for p in WORKFLOWS}


def perms(wf, job):
    """The permissions a job runs with: its own, else the workflow's."""
    return wf["jobs"][job].get("permissions", wf.get("permissions"))


def test_least_privilege_per_job_and_actions_pinned_by_sha():
    for name, wf in workflows().items():
        assert wf.get("permissions") == {}, f"{name}: permissions are granted per job, none at workflow level"
        for job_name, job in wf["jobs"].items():
            assert "permissions" in job, f"{name}: job {job_name} declares no permissions"
            for step in job.get("steps", []):
                uses = str(step.get("uses", ""))
                if uses and not uses.startswith("./"):
                    assert re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", uses), f"{name}: {uses} is not pinned by SHA"
                if uses.startswith("actions/checkout"):  # no token left in .git/config for later steps
                    assert step["with"]["persist-credentials"] is False, f"{name}: {job_name} persists its token"


def test_no_job_that_can_write_or_holds_secrets_restores_a_cache():
    # an approved GPU run (pull_request_target) can write caches in the default branch's scope:
    # only read-only jobs may restore one
    for name, wf in workflows().items():
        for job_name, job in wf["jobs"].items():
            granted = perms(wf, job_name) or {}
            privileged = "write" in granted.values() or "secrets." in yaml.safe_dump(job)
            for step in job.get("steps", []):
                uses = str(step.get("uses", ""))
                caches = uses.startswith("actions/cache") or (uses.startswith("actions/setup-")
                                                              and "cache" in (step.get("with") or {}))
                assert not (privileged and caches), f"{name}: {job_name} can write and restores a cache"


def test_no_workflow_runs_pr_code_with_a_privileged_token():
    for name, wf in workflows().items():
        text = (ROOT / ".github" / "workflows" / name).read_text()
        if "pull_request_target" in wf["on"]:
            # only behind a maintainer's approval, with a read-only token and no secrets: the
            # workflow file is the default branch's, so a PR cannot lift these for its own run
            assert all(perms(wf, j) == {"contents": "read"} for j in wf["jobs"]), name
            assert all(job.get("environment") for job in wf["jobs"].values()), name
            assert "secrets." not in text and "github.token" not in text, name
        on = wf["on"]
        if isinstance(on, dict) and isinstance(on.get("pull_request"), dict):
            assert "paths" not in on["pull_request"], f"{name}: a required check skipped by paths stays pending"


def test_fork_safe_split():
    wfs = workflows()
    gate = wfs["dl-gate-fork.yml"]
    assert "pull_request" in gate["on"] and perms(gate, "gate") == {"contents": "read"}
    steps = gate["jobs"]["gate"]["steps"]
    action = next(s for s in steps if s.get("uses") == "./")
    assert action["with"]["comment"] == "false"
    upload = next(s for s in steps if str(s.get("uses", "")).startswith("actions/upload-artifact"))
    assert upload["with"]["name"] == "dl-gate-report"

    comment = wfs["dl-gate-comment.yml"]
    assert comment["on"]["workflow_run"]["workflows"] == [gate["name"], wfs["dl-gate-gpu.yml"]["name"]]
    assert perms(comment, "comment")["pull-requests"] == "write"
    job = comment["jobs"]["comment"]
    for each in comment["jobs"].values():  # never checks out the PR's code: the default branch only
        checkout = next(s for s in each["steps"] if str(s.get("uses", "")).startswith("actions/checkout"))
        assert set(checkout["with"]) == {"persist-credentials"} and checkout["with"]["persist-credentials"] is False
    download = next(s for s in job["steps"] if str(s.get("uses", "")).startswith("actions/download-artifact"))
    assert download["with"]["path"].startswith("${{ runner.temp }}")  # data beside, not over, the checkout
    publish = next(s for s in job["steps"] if "dl-gate publish" in str(s.get("run", "")))
    assert "--github" in publish["run"] and "--no-annotations" in publish["run"]

    same_repo = wfs["dl-gate.yml"]["jobs"]["gate"]["if"]
    assert "==" in same_repo and "!=" in gate["jobs"]["gate"]["if"]


def test_gpu_job_runs_the_cuda_image_with_gpus_behind_an_approval_gate():
    job = workflows()["dl-gate-gpu.yml"]["jobs"]["gpu"]
    assert job["environment"] == "gpu"
    assert "self-hosted" in job["runs-on"] and "gpu" in job["runs-on"]
    assert job["container"]["options"] == "--gpus all" and "cuda" in job["container"]["image"]
    runs = " ".join(str(s.get("run", "")) for s in job["steps"])
    assert "dl-gate run" in runs and "dl-gate publish" in runs and "--no-comment" in runs
    assert not any(s.get("uses") == "./" for s in job["steps"])  # a docker action would get no GPU
    # never on its own for a PR: the default branch's workflow file, behind the environment's approval,
    # with a read-only token; its comment is posted by the workflow_run job from the artifact
    wfs = workflows()
    assert list(wfs["dl-gate-gpu.yml"]["on"]) == ["pull_request_target", "workflow_dispatch"]
    assert perms(wfs["dl-gate-gpu.yml"], "gpu") == {"contents": "read"}
    assert wfs["dl-gate-gpu.yml"]["concurrency"]["cancel-in-progress"] is True and job["timeout-minutes"] <= 60
    upload = next(s for s in job["steps"] if str(s.get("uses", "")).startswith("actions/upload-artifact"))
    gpu_comment = wfs["dl-gate-comment.yml"]["jobs"]["comment-gpu"]
    download = next(s for s in gpu_comment["steps"] if str(s.get("uses", "")).startswith("actions/download-artifact"))
    assert download["with"]["name"] == upload["with"]["name"]
    assert any("--comment-key gpu" in str(s.get("run", "")) for s in gpu_comment["steps"])


def test_scheduled_baseline_refresh_opens_a_pr():
    wf = workflows()["dl-gate-baselines.yml"]
    assert wf["on"]["schedule"] and "workflow_dispatch" in wf["on"]
    steps = wf["jobs"]["refresh"]["steps"]
    assert next(s for s in steps if s.get("uses") == "./")["with"]["mode"] == "refresh"
    assert "gh pr create" in " ".join(str(s.get("run", "")) for s in steps)
    assert perms(wf, "refresh") == {"contents": "write", "pull-requests": "write"}


def test_ci_runs_the_tests_and_the_linters():
    jobs = workflows()["ci.yml"]["jobs"]
    runs = " ".join(str(s.get("run", "")) for j in jobs.values() for s in j["steps"])
    for needle in ("pytest", "actionlint", "check-jsonschema --builtin-schema vendor.github-workflows",
                   "vendor.github-actions", "hadolint Dockerfile", "zizmor --offline --persona=pedantic"):
        assert needle in runs


# -- the GPU gate: the job that runs the PR's code, and its comment ---------------------------------
GPU = ROOT / ".github" / "workflows" / "dl-gate-gpu.yml"


def step(job: dict, name: str) -> dict:
    return next(s for s in job["steps"] if str(s.get("name", "")).startswith(name))


def bash(script: str, env: dict, cwd: Path):
    """A `run:` script as the runner runs it on Linux (bash -e -o pipefail)."""
    full = {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(cwd), **env}
    return subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script], cwd=cwd,
                          capture_output=True, text=True, timeout=120, env=full)


def test_the_job_that_runs_pr_code_holds_no_secret_and_no_write_token_and_waits_for_approval():
    wf = load(GPU)
    text = yaml.safe_dump(wf)  # the workflow without its comments
    job = wf["jobs"]["gpu"]
    # approval: an environment (its required reviewers are a repository setting, docs/action.md)
    assert list(wf["jobs"]) == ["gpu"] and job["environment"] == "gpu"
    # nothing that can write, no secret, no token handed to a step
    assert perms(wf, "gpu") == {"contents": "read"}
    assert "secrets" not in text and "github.token" not in text and "GITHUB_TOKEN" not in text
    assert "env" not in wf and "env" not in job and "secrets" not in job
    for each in job["steps"]:
        for key, value in (each.get("env") or {}).items():
            assert "token" not in key.lower() and "token" not in str(value).lower(), key
    # the PR's code is checked out first, by the event's commit (never the moving branch), without
    # leaving the token on disk; only this job opts into checking out a fork's commit
    checkout = job["steps"][0]
    assert checkout["uses"].startswith("actions/checkout@")
    assert checkout["with"]["ref"] == "${{ github.event.pull_request.head.sha || github.sha }}"
    assert checkout["with"]["persist-credentials"] is False and checkout["with"]["allow-unsafe-pr-checkout"] is True
    for name in WORKFLOWS:
        if name != GPU:
            assert "allow-unsafe-pr-checkout" not in name.read_text(), name.name
    # what the maintainer approves is named: the PR and its exact head commit, nothing the PR wrote
    run_name = wf["run-name"]
    assert "github.event.pull_request.number" in run_name and "github.event.pull_request.head.sha" in run_name
    assert not re.search(r"title|body|head\.ref|head_ref|label", run_name)
    assert re.search(r"dl-gate-gpu-\$\{\{ github\.event\.pull_request\.number", wf["concurrency"]["group"])


@pytest.mark.parametrize("exit_code, env, fails", [
    ("0", None, False), ("3", None, False), ("1", {}, True),
    ("2", {}, True),  # an error fails, as under the Action's default fail-on (regression,error)
    ("2", {"setup_error": True}, True), ("2", {"run_incomplete": True}, True),
    ("2", "missing", True), ("", None, True),  # no report, or the run step never got to its end
])
def test_the_gpu_job_fails_as_the_action_does(tmp_path, exit_code, env, fails):
    script = step(load(GPU)["jobs"]["gpu"], "Fail on a regression or an error")["run"]
    if isinstance(env, dict):
        (tmp_path / "dl-gate-out").mkdir()
        (tmp_path / "dl-gate-out" / "report.json").write_text(json.dumps({"outcome": "error", "env": env}))
    res = bash(script, {"EXIT_CODE": exit_code}, tmp_path)
    assert (res.returncode != 0) == fails, res.stdout + res.stderr


SHA_HEAD, SHA_BASE, SHA_NEW = "1" * 40, "b" * 40, "2" * 40


def gpu_run_name(number: int, sha: str) -> str:
    """The name GitHub gives a pull_request_target run of dl-gate-gpu.yml (its run-name's format)."""
    fmt = re.search(r"format\('(dl-gate \(GPU\) PR #\{0\} at \{1\})'", load(GPU)["run-name"]).group(1)
    return fmt.format(number, sha)


def test_the_gpu_comment_finds_its_pr_in_the_run_name_and_writes_only_on_that_commit(tmp_path):
    job = workflows()["dl-gate-comment.yml"]["jobs"]["comment-gpu"]
    post = step(job, 'Post or update the "gpu" sticky comment')
    assert set(post["env"]) == {"GITHUB_TOKEN", "REPORT", "RUN_NAME"}
    assert post["env"]["RUN_NAME"] == "${{ github.event.workflow_run.display_title }}"
    report = tmp_path / "artifact" / "report.json"
    report.parent.mkdir()
    report.write_text(json.dumps(rich_report(head_sha=SHA_HEAD).to_dict()))
    # the workflow_run event of a pull_request_target run, as GitHub sends it: head_sha and
    # head_branch are the default branch's, and pull_requests is empty for a fork's PR
    event = tmp_path / "event.json"

    def job_env(run_name: str) -> dict:
        event.write_text(json.dumps({"workflow_run": {
            "id": 4242, "run_attempt": 1, "name": "dl-gate (GPU)", "event": "pull_request_target",
            "path": ".github/workflows/dl-gate-gpu.yml", "display_title": run_name, "head_sha": SHA_BASE,
            "head_branch": "main", "pull_requests": [], "conclusion": "failure",
            "head_repository": {"full_name": "owner/repo", "owner": {"login": "owner"}},
            "html_url": "https://github.com/owner/repo/actions/runs/4242"}}))
        return {"GITHUB_TOKEN": "tok-bot", "REPORT": str(report), "RUN_NAME": run_name, "GITHUB_ACTIONS": "true",
                "GITHUB_REPOSITORY": "owner/repo", "GITHUB_API_URL": fake.url, "GITHUB_EVENT_NAME": "workflow_run",
                "GITHUB_EVENT_PATH": str(event), "GITHUB_RUN_ID": "4300", "GITHUB_RUN_ATTEMPT": "1",
                "GITHUB_SHA": SHA_BASE, "RUNNER_TEMP": str(tmp_path)}

    def post_comment(run_name: str):
        return bash(post["run"], job_env(run_name), tmp_path)

    def bot_comments():
        return [c for c in fake.comments.get(7, []) if c["user"]["login"] == "github-actions[bot]"]

    with FakeGitHub() as fake:
        fake.add_pull(7, SHA_HEAD, owner="forker", branch="main")  # a fork's PR from its own main
        # the event alone names no PR (what the step works around): nothing is written
        res = bash('dl-gate publish "$REPORT" --github --comment --comment-key gpu --no-annotations --no-summary',
                   job_env(gpu_run_name(7, SHA_HEAD)), tmp_path)
        assert res.returncode == 0 and bot_comments() == [], res.stderr

        res = post_comment(gpu_run_name(7, SHA_HEAD))
        assert res.returncode == 0, res.stdout + res.stderr
        mine = bot_comments()
        assert len(mine) == 1 and "<!-- dl-gate:sticky:gpu -->" in mine[0]["body"]
        assert "results for " + SHA_HEAD[:12] in mine[0]["body"] and "actions/runs/4242" in mine[0]["body"]

        # the PR moved on: the run's commit is no longer its head, nothing is written
        fake.add_pull(7, SHA_NEW, owner="forker", branch="main")
        report.write_text(json.dumps(rich_report(head_sha=SHA_HEAD, reason="stale").to_dict()))
        res = post_comment(gpu_run_name(7, SHA_HEAD))
        assert res.returncode == 0 and "stale" not in bot_comments()[0]["body"], res.stdout + res.stderr

        # a name that is not the GPU workflow's (say, a fork's PR title) is refused, not guessed at
        for name in (f"Fix dl-gate (GPU) PR #7 at {SHA_NEW}", f"dl-gate (GPU) PR #7 at {SHA_NEW}\nmore", ""):
            res = post_comment(name)
            assert res.returncode == 1 and "does not say its PR" in res.stdout, name
        assert len(bot_comments()) == 1
