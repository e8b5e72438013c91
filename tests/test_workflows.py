"""action.yml, the Dockerfile and .github/workflows/: real validators (actionlint with shellcheck,
check-jsonschema's built-in GitHub schemas, hadolint), each shown to catch a broken file, plus the
properties the gate's safety rests on (fork-safe split, approval gate, no path filters)."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gate.commands.action import ActionInputs
from gate.report.github import outputs_for
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


def test_zizmor_finds_nothing_unjustified():
    # offline: no GitHub API calls; every finding left is ignored in the file with its reason
    res = run([tool("zizmor"), "--offline", "--format", "plain", "--no-progress", "."])
    assert res.returncode == 0, res.stdout + res.stderr
    text = " ".join((ROOT / ".github" / "workflows" / p.name).read_text() for p in WORKFLOWS)
    for ignore in re.findall(r"# zizmor: ignore\[[\w-]+\](.*)", text):
        assert ignore.strip(), "a zizmor ignore without a reason"


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
              "out": "o", "report": "r.json", "nightly": "true", "nightly-budget": "120", "per-op": "7"}
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
    assert "RepoDigests" in run_text and 'git tag "v${VERSION}"' in run_text
    assert "image: ${PINNED}" in run_text


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


def test_no_workflow_runs_pr_code_with_a_privileged_token():
    for name, wf in workflows().items():
        text = (ROOT / ".github" / "workflows" / name).read_text()
        if "pull_request_target" in wf["on"]:
            # only behind a maintainer's approval, with a read-only token and no secrets: the
            # workflow file is the base branch's, so a PR cannot lift these for its own run
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
    text = (ROOT / ".github" / "workflows" / "dl-gate-comment.yml").read_text()
    assert "head_sha" not in text and "head_branch" not in text  # never checks out the PR's code
    checkout = next(s for s in job["steps"] if str(s.get("uses", "")).startswith("actions/checkout"))
    assert "ref" not in checkout.get("with", {}) and checkout["with"]["persist-credentials"] is False
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
    # never on its own for a PR: the base branch's workflow file, behind the environment's approval,
    # with a read-only token; its comment is posted by the workflow_run job from the artifact
    wfs = workflows()
    assert list(wfs["dl-gate-gpu.yml"]["on"]) == ["pull_request_target", "workflow_dispatch"]
    assert perms(wfs["dl-gate-gpu.yml"], "gpu") == {"contents": "read"}
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
                   "vendor.github-actions", "hadolint Dockerfile"):
        assert needle in runs
