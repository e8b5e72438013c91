"""A step of a workflow `dl-gate init` wrote, run the way a GitHub runner runs a Docker action's
step (no Docker here, and no local runner of workflows installs from the package index): every
input of action.yml becomes ``INPUT_<NAME>`` (the step's ``with:`` value, else action.yml's
default, with ``${{ github.token }}`` as the job's token), the step's ``env:`` is set, the
``GITHUB_*`` variables describe the event, and the image's entrypoint (``dl-gate action``) runs in
the workspace. The command files (output, step summary) are read back."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional, Tuple

import yaml

from gate.report.outputs import parse_outputs

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "tok-bot"


def load_workflow(path: Path) -> dict:
    data = yaml.safe_load(path.read_text())
    if True in data:  # YAML 1.1 reads `on` as True
        data["on"] = data.pop(True)
    return data


def action_step(workflow: dict, job: str) -> dict:
    """The job's step that uses dl-gate's Action (pinned, as init writes it)."""
    (step,) = [s for s in workflow["jobs"][job]["steps"] if str(s.get("uses", "")).startswith("dl-gate/dl-gate@")]
    return step


def run_step(step: dict, workspace: Path, files: Path, *, api: str, event_name: str, event: dict,
             repository: str = "acme/ops", run_id: int = 4242, extra_env: Optional[dict] = None,
             timeout: int = 900) -> Tuple[subprocess.CompletedProcess, dict, str]:
    action = yaml.safe_load((ROOT / "action.yml").read_text())
    files.mkdir(parents=True, exist_ok=True)
    (files / "event.json").write_text(json.dumps(event))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "INPUT_", "RUNNER_"))}
    given = step.get("with") or {}
    for name, spec in action["inputs"].items():
        value = str(given.get(name, spec.get("default", "")))
        env[f"INPUT_{name.upper()}"] = TOKEN if value == "${{ github.token }}" else value
    env.update({str(k): str(v) for k, v in (step.get("env") or {}).items()})
    env.update({
        "PYTHONPATH": str(ROOT), "GITHUB_ACTIONS": "true", "CI": "true", "GITHUB_REPOSITORY": repository,
        "GITHUB_API_URL": api, "GITHUB_SERVER_URL": "https://github.com", "GITHUB_EVENT_NAME": event_name,
        "GITHUB_EVENT_PATH": str(files / "event.json"), "GITHUB_RUN_ID": str(run_id), "GITHUB_RUN_ATTEMPT": "1",
        "GITHUB_WORKSPACE": str(workspace), "GITHUB_OUTPUT": str(files / "output"),
        "GITHUB_STEP_SUMMARY": str(files / "summary"), "GITHUB_SHA": "f" * 40,
    })
    if event_name == "pull_request":
        env.update({"GITHUB_BASE_REF": event["pull_request"]["base"]["ref"], "GITHUB_HEAD_REF": "feature"})
    env.update(extra_env or {})
    res = subprocess.run([sys.executable, "-m", "gate.cli", "action"], cwd=workspace, env=env, capture_output=True,
                         text=True, timeout=timeout)
    outputs = parse_outputs((files / "output").read_text()) if (files / "output").exists() else {}
    summary = (files / "summary").read_text() if (files / "summary").exists() else ""
    return res, outputs, summary
