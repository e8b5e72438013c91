"""The code under test cannot move the verdict (issue 27): a red team.

Each test is a pull request with a plain, real regression (``tanh(x)`` becomes ``tanh(x) * 1.5``)
plus one attack, run through the real CLI (``python -m gate.cli run``: the supervisor, its run
process and the isolated workers) on a real git repository with committed baselines, with a
deterministic ``--evals`` budget. Under each: exit 1 (or 2 where stated), report.json agreeing,
no credential readable, no surviving process.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.test_gate_run import git, make_repo

#: what the supervisor contains is tested on a user's path: no zygote server (conftest)
pytestmark = pytest.mark.usefixtures("no_zygote_server")

ROOT = Path(__file__).resolve().parents[1]

BASE_SRC = '''
import torch


def act(x):
    return torch.tanh(x)
'''

#: head's regression: every output is 1.5 times base's
REGRESSION = "    return torch.tanh(x) * 1.5\n"

CONFIG = """
version: 1
framework: torch
python_path: ["."]
builtin: false
gate: {dtypes: [float32], modes: [input]}
ops:
  - name: lib.act
    callable: lib.ops:act
    sources: [lib/ops.py]
    dims: {N: [1, 16]}
    inputs: [{name: x, shape: [N], domain: {name: real, scale: 3}}]
    grad: false  # one variant: the attacks cross the process boundary alike in every variant
    layouts: {}
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return make_repo(tmp_path_factory.mktemp("redteam"), ops_src=BASE_SRC, config=CONFIG, package="lib")


def pull_request(repo: Path, tmp_path: Path, ops_src: str, files: dict = None, name: str = "pr") -> Path:
    """A clone of ``repo`` on branch ``name`` with ``lib/ops.py`` replaced by ``ops_src`` (and
    ``files`` written), committed."""
    dst = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(repo), str(dst)], check=True)
    git(dst, "checkout", "-q", "-b", name)
    (dst / "lib" / "ops.py").write_text(ops_src)
    for rel, text in (files or {}).items():
        p = dst / rel
        if text is None:
            p.unlink()
        else:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
    git(dst, "add", "-A")
    git(dst, "commit", "-q", "-m", name)
    return dst


def head_src(attack: str = "", at_call: str = "") -> str:
    """Base's operator with the regression, ``attack`` at import and ``at_call`` in the call."""
    call = "".join(f"    {ln}\n" for ln in at_call.strip("\n").splitlines())
    return f"import torch\n{attack}\n\ndef act(x):\n{call}{REGRESSION}"


def run_gate(repo: Path, out: Path, *extra: str, env: dict = None, timeout: float = 600):
    full = {**os.environ, "PYTHONPATH": str(ROOT), "DL_GATE_QUIET": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "gate.cli", "run", "--base", "main", "--out", str(out),
                           "--evals", "20", *extra], cwd=repo, env=full, capture_output=True, text=True,
                          timeout=timeout)


def report_of(out: Path) -> dict:
    assert (out / "junit.xml").exists(), "no junit.xml"
    return json.loads((out / "report.json").read_text())


# ---------------------------------------------------------------------------------------
# A. secrets never reach the code under test
# ---------------------------------------------------------------------------------------
#: what the operator records, at import and at every call: its own environment and every
#: /proc/PID/environ it can read (the gate's own processes included)
SNOOP = '''
import json as _json, os as _os


def _snoop(where):
    seen = {"where": where, "pid": _os.getpid(), "env": dict(_os.environ), "proc": {}}
    for pid in _os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    seen["proc"][pid] = f.read().decode("latin-1")
            except OSError:
                pass
    with open(LEAK, "a") as f:
        f.write(_json.dumps(seen) + "\\n")
    print("seen:", sorted(seen["env"]))


LEAK = %r
_snoop("import")
'''


@pytest.mark.parametrize("isolate", ["--isolate", "--no-isolate"])
def test_no_credential_is_readable_by_the_operator(repo, tmp_path, isolate):
    leak = tmp_path / "leak.jsonl"
    pr = pull_request(repo, tmp_path, head_src(SNOOP % str(leak), '_snoop("call")'))
    secrets = {name: f"{name.lower()}-{uuid.uuid4().hex}" for name in
               ("GITHUB_TOKEN", "INPUT_TOKEN", "ACTIONS_RUNTIME_TOKEN", "MY_SECRET", "ACTIONS_ID_TOKEN_REQUEST_TOKEN",
                "AWS_SECRET_ACCESS_KEY")}
    runner = {"GITHUB_ENV": str(tmp_path / "github_env"), "GITHUB_OUTPUT": str(tmp_path / "github_output"),
              "OMP_NUM_THREADS": "1", "LIB_SETTING": "visible"}
    res = run_gate(pr, tmp_path / "out", isolate, env={**secrets, **runner})
    report = report_of(tmp_path / "out")
    assert res.returncode == 1 and report["outcome"] == "regression", (res.returncode, report["reason"], res.stderr[-3000:])
    records = [json.loads(line) for line in leak.read_text().splitlines()]
    assert any(r["where"] == "call" for r in records), "the operator never ran"
    everything = leak.read_text() + (tmp_path / "out" / "report.json").read_text() + res.stdout + res.stderr
    for name, value in secrets.items():
        assert value not in everything, f"{name} was readable by the code under test"
    for r in records:
        assert not {"GITHUB_ENV", "GITHUB_OUTPUT", "LIB_SETTING"} & set(r["env"]), sorted(r["env"])
        assert r["env"].get("OMP_NUM_THREADS") == "1"  # the allow-list passes thread settings


def test_the_worker_environment_is_an_allow_list():
    from gate.backends.sandbox import gate_root, worker_env

    src = {"PATH": "/bin", "HOME": "/h", "LC_ALL": "C", "OMP_NUM_THREADS": "2", "TORCH_HOME": "/t",
           "DL_GATE_THREADS": "1", "DL_GATE_STATE": "/tmp/state", "GITHUB_TOKEN": "x", "INPUT_TOKEN": "x",
           "ACTIONS_RUNTIME_TOKEN": "x", "MY_SECRET": "x", "TORCH_HUB_TOKEN": "x", "GITHUB_ENV": "/f",
           "GITHUB_SHA": "abc", "PYTHONPATH": "/lib", "RANDOM_VAR": "x"}
    env = worker_env({"DL_GATE_STATE": "/tmp/own", "API_KEY": "x"}, source=src)
    assert sorted(env) == ["DL_GATE_STATE", "DL_GATE_THREADS", "HOME", "LC_ALL", "OMP_NUM_THREADS", "PATH",
                           "PYTHONPATH", "TORCH_HOME"]
    assert env["PYTHONPATH"] == os.pathsep.join([gate_root(), "/lib"]) and env["DL_GATE_STATE"] == "/tmp/own"
    assert "DL_GATE_STATE" not in worker_env(source=src)  # a worker never learns where the run's state is
    assert worker_env(source=src, names=["RANDOM_VAR", "MY_SECRET"]).get("RANDOM_VAR") == "x"
    assert "MY_SECRET" not in worker_env(source=src, names=["MY_SECRET"])


def test_the_config_env_list_passes_a_name_and_refuses_a_credential(repo, tmp_path):
    leak = tmp_path / "leak.jsonl"
    config = CONFIG + "env: [LIB_SETTING]\n"
    pr = pull_request(repo, tmp_path, head_src(SNOOP % str(leak), '_snoop("call")'), {".dl-gate.yml": config})
    res = run_gate(pr, tmp_path / "out", env={"LIB_SETTING": "visible", "MY_SECRET": "hidden"})
    assert res.returncode == 1, (report_of(tmp_path / "out")["reason"], res.stderr[-2000:])
    records = [json.loads(line) for line in leak.read_text().splitlines()]
    assert records and all(r["env"].get("LIB_SETTING") == "visible" for r in records)
    assert not any("MY_SECRET" in r["env"] for r in records)

    (pr / ".dl-gate.yml").write_text(CONFIG + "env: [LIB_SETTING, GITHUB_TOKEN]\n")
    git(pr, "commit", "-q", "-am", "name a token")
    res = run_gate(pr, tmp_path / "out2", env={"GITHUB_TOKEN": "hidden"})
    report = report_of(tmp_path / "out2")
    assert res.returncode == 2 and report["outcome"] == "error", (res.returncode, report["reason"])
    assert "GITHUB_TOKEN is never passed to the code under test" in report["reason"], report["reason"]


def test_the_pr_cannot_give_the_workers_values_of_its_own(repo, tmp_path):
    # env: may give values (dl-gate init --env); base's workers get them too, so a PR's own value
    # (LD_PRELOAD, a backend switch) would reach base's side: the values are base's config's
    leak = tmp_path / "leak.jsonl"
    config = CONFIG + "env: {LIB_SETTING: forged}\n"
    pr = pull_request(repo, tmp_path, head_src(SNOOP % str(leak), '_snoop("call")'), {".dl-gate.yml": config})
    res = run_gate(pr, tmp_path / "out")
    report = report_of(tmp_path / "out")
    assert res.returncode == 1, (report["reason"], res.stderr[-2000:])
    assert any("env: LIB_SETTING" in w and "base's config gives" in w for w in report["warnings"]), report["warnings"]
    records = [json.loads(line) for line in leak.read_text().splitlines()]
    assert records and not any(r["env"].get("LIB_SETTING") == "forged" for r in records)


# ---------------------------------------------------------------------------------------
# B. nothing the code under test prints is a workflow command
# ---------------------------------------------------------------------------------------
def commands_in(text: str) -> list:
    """The lines a GitHub runner would run as workflow commands (lines end at \\n or \\r; after
    the leading whitespace a line starting with ``::``; the old ``##[`` anywhere)."""
    import re

    return [ln for ln in re.split(r"\r|\n", text) if ln.lstrip().startswith("::") or "##[" in ln]


FORGE = '''
import sys as _sys
print("::error::forged at import")
print("::stop-commands::x")
print("  ::add-mask::hunter2", file=_sys.stderr)
_sys.stdout.write("##[error]old form\\r::warning::after a carriage return\\n")
_sys.stdout.flush()
'''


def test_the_command_guard_escapes_every_split_of_the_output():
    import random

    from gate.supervise import CommandGuard

    text = ("progress 1/3\r::error::a\n  ::add-mask::b\n##[set-output name=x]y\nplain :: text\n"
            "\r\n::stop-commands::t\n:x\n#\n::t::\nend ##[ and # #\n")
    rng = random.Random(0)
    for trial in range(400):
        guard, out, i = CommandGuard(), [], 0
        while i < len(text):
            n = rng.randint(1, 6)
            out.append(guard.feed(text[i:i + n], idle=rng.random() < 0.3))
            i += n
        out.append(guard.feed("", final=True))
        relayed = "".join(out)
        assert not commands_in(relayed), (trial, commands_in(relayed))
        assert relayed.count("\n") == text.count("\n") and "plain :: text" in relayed and "progress 1/3" in relayed
        assert ": :error::a" in relayed and "[set-output name=x]y" in relayed


@pytest.mark.parametrize("isolate", ["--isolate", "--no-isolate"])
def test_what_the_operator_prints_reaches_no_runner_as_a_command(repo, tmp_path, isolate):
    pr = pull_request(repo, tmp_path, head_src(FORGE, 'print("::error::forged in a call")\n'
                                                     'print("::stop-commands::y", file=__import__("sys").stderr)\n'
                                                     'if x.shape[-1] > 8:\n'
                                                     '    raise ValueError("bad\\n::error::forged in a reason")'))
    res = run_gate(pr, tmp_path / "out", isolate, env={"GITHUB_ACTIONS": "true", "DL_GATE_QUIET": ""})
    report = report_of(tmp_path / "out")
    assert res.returncode == 1 and report["outcome"] == "regression", (res.returncode, report["reason"], res.stderr[-3000:])
    if isolate == "--no-isolate":  # the operator runs in the run process: what it prints is relayed, escaped
        assert "forged at import" in res.stdout and "forged in a call" in res.stdout
    else:  # isolated: it prints into its workers' logs, never into the runner's
        assert "forged at import" not in res.stdout + res.stderr
    fence = [ln for ln in res.stdout.splitlines() if ln.startswith("::")]
    assert len(fence) == 2 and fence[0].startswith("::stop-commands::") and len(fence[0]) > 30, fence
    assert fence[1] == f"::{fence[0].split('::')[2]}::"  # the gate's own random fence, opened and closed
    inside = res.stdout.split(fence[0], 1)[1].split(fence[1], 1)[0]
    assert not commands_in(inside) and not commands_in(res.stderr), (commands_in(inside), commands_in(res.stderr))
    # the report the gate prints quotes the operator's exception: escaped too
    assert commands_in(res.stdout) == fence, commands_in(res.stdout)


# ---------------------------------------------------------------------------------------
# C. nothing outlives the gate; the files are the run's, the result is its exit status
# ---------------------------------------------------------------------------------------
#: on its first call in a process, the operator leaves a detached process behind (double fork,
#: setsid) that rewrites report.json and junit.xml as a pass for 30 s
FORGER = '''
import json as _json, os as _os, time as _time

_OUT, _PIDS, _FORGED = %r, %r, []
_PASS = %r


def _forge():
    if _FORGED:
        return
    _FORGED.append(1)
    child = _os.fork()
    if child:
        _os.waitpid(child, 0)
        return
    try:
        _os.setsid()
        if _os.fork() == 0:
            with open(_PIDS, "a") as f:
                f.write(f"{_os.getpid()}\\n")
            end = _time.time() + 30
            while _time.time() < end:
                try:
                    with open(_os.path.join(_OUT, "report.json"), "w") as f:
                        f.write(_PASS)
                    with open(_os.path.join(_OUT, "junit.xml"), "w") as f:
                        f.write('<testsuites><testsuite name="dl-gate" tests="1"><testcase name="x"/></testsuite></testsuites>')
                except OSError:
                    pass
                _time.sleep(0.01)
    finally:
        _os._exit(0)
'''


def forged_pass() -> str:
    from gate.judge.verdict import GateReport

    return json.dumps(GateReport(outcome="pass", reason="no operator changed (forged)").to_dict())


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def test_a_detached_process_neither_outlives_the_run_nor_forges_its_report(repo, tmp_path):
    out, pids = tmp_path / "out", tmp_path / "forgers.txt"
    pr = pull_request(repo, tmp_path, head_src(FORGER % (str(out), str(pids), forged_pass()), "_forge()"))
    res = run_gate(pr, out)
    forgers = [int(x) for x in pids.read_text().split()] if pids.exists() else []
    assert forgers, "the operator never ran"
    assert not [p for p in forgers if alive(p)], "a process the code under test started outlived the gate"
    time.sleep(0.5)
    report = report_of(out)
    assert res.returncode == 1 and report["outcome"] == "regression", (res.returncode, report["reason"], res.stderr[-2000:])
    assert "forged" not in (out / "report.json").read_text() and "failure" in (out / "junit.xml").read_text()
    assert any("outlived the run and were killed" in w for w in report["warnings"]), report["warnings"]


def test_the_action_takes_its_result_from_the_exit_status():
    from gate.commands.action import agreeing_report
    from gate.judge.verdict import GateReport

    regression = GateReport(outcome="regression", reason="r")
    assert agreeing_report(regression, 1, ["run"]) is regression
    forged = agreeing_report(GateReport(outcome="pass", reason="forged"), 1, ["run"])
    assert forged.outcome == "error" and forged.exit_code == 2 and forged.env["run_incomplete"]
    assert "report.json says pass but `dl-gate run` exited with code 1" in forged.reason


def test_the_action_step_fails_on_a_regression_whose_operator_forges_the_report(repo, tmp_path):
    from tests.test_action import Action
    from tests.github_fake import FakeGitHub

    with FakeGitHub() as fake:
        fake.add_pull(7, "0" * 40)
        act = Action(tmp_path, fake.url)
        out, pids = act.ws / "dl-gate-out", tmp_path / "forgers.txt"
        subprocess.run(["git", "clone", "-q", str(repo), str(act.ws)], check=True)
        git(act.ws, "checkout", "-q", "-b", "pr")
        (act.ws / "lib" / "ops.py").write_text(head_src(FORGER % (str(out), str(pids), forged_pass()), "_forge()"))
        (act.ws / ".dl-gate.yml").write_text(CONFIG + "budget: {evals: 20}\n")  # the deterministic budget
        git(act.ws, "commit", "-q", "-am", "regression and a forger")
        res, outputs, _ = act.run(None, mode="gate", comment="false")
    forgers = [int(x) for x in pids.read_text().split()] if pids.exists() else []
    assert forgers and not [p for p in forgers if alive(p)]
    assert res.returncode == 1 and outputs["outcome"] == "regression", (res.returncode, res.stderr[-3000:])
    assert json.loads((out / "report.json").read_text())["outcome"] == "regression"


# ---------------------------------------------------------------------------------------
# D. base decides what is gated; no config is no gate
# ---------------------------------------------------------------------------------------
NO_CONFIG = "no .dl-gate.yml: run `dl-gate init`"


def test_without_a_config_the_run_is_an_error_that_says_to_run_init(repo, tmp_path):
    pr = pull_request(repo, tmp_path, head_src(), {".dl-gate.yml": None})
    (pr / ".dl-gate.yml").unlink(missing_ok=True)
    git(pr, "checkout", "-q", "main")
    git(pr, "rm", "-q", ".dl-gate.yml")  # no config on either side
    git(pr, "commit", "-q", "-m", "no config")
    git(pr, "checkout", "-q", "pr")
    git(pr, "merge", "-q", "main")
    res = run_gate(pr, tmp_path / "out")
    report = report_of(tmp_path / "out")
    assert res.returncode == 2 and report["outcome"] == "error" and report["reason"] == NO_CONFIG, (res.returncode, report["reason"])
    assert report["env"].get("setup_error")  # the Action fails its step whatever fail-on says
    assert res.stdout.splitlines()[0] == f"dl-gate: ERROR: {NO_CONFIG}"
    # a forced run of a built-in operator needs no config
    res = run_gate(pr, tmp_path / "out2", "--ops", "torch.tanh", "--dtype", "float32", "--mode", "input")
    assert res.returncode in (0, 3), (res.returncode, report_of(tmp_path / "out2")["reason"])


def test_a_base_row_the_pr_deletes_is_still_gated(repo, tmp_path):
    pr = pull_request(repo, tmp_path, head_src(), {".dl-gate.yml": CONFIG.split("ops:")[0] + "ops: []\n"})
    res = run_gate(pr, tmp_path / "out")
    report = report_of(tmp_path / "out")
    assert res.returncode == 1 and report["outcome"] == "regression", (res.returncode, report["reason"])
    assert {v["op"] for v in report["verdicts"] if v["outcome"] in ("regression", "behaviour-change")} == {"lib.act"}
    assert any("lib.act" in w and "removes" in w for w in report["warnings"]), report["warnings"]


def test_a_pr_that_deletes_the_config_is_gated_by_base_s(repo, tmp_path):
    pr = pull_request(repo, tmp_path, head_src(), {".dl-gate.yml": None})
    res = run_gate(pr, tmp_path / "out")
    report = report_of(tmp_path / "out")
    assert res.returncode == 1 and report["outcome"] == "regression", (res.returncode, report["reason"])
    assert any("the PR deletes .dl-gate.yml" in w for w in report["warnings"]), report["warnings"]


@pytest.mark.parametrize("how", ["rename", "delete", "gone", "import"])
def test_an_operator_that_no_longer_resolves_on_head_is_a_regression(repo, tmp_path, how):
    if how == "gone":  # the module is there, the function is not (renamed inside it)
        pr = pull_request(repo, tmp_path, head_src().replace("def act(", "def activation("))
    elif how == "import":  # the module no longer imports (a helper module it needs is gone)
        pr = pull_request(repo, tmp_path, head_src("import lib_helpers_gone"))
    else:
        pr = pull_request(repo, tmp_path, head_src())
        if how == "rename":
            git(pr, "mv", "lib/ops.py", "lib/operators.py")
        else:
            git(pr, "rm", "-q", "lib/ops.py")
        git(pr, "commit", "-q", "-m", how)
    res = run_gate(pr, tmp_path / "out")
    report = report_of(tmp_path / "out")
    assert res.returncode == 1 and report["outcome"] == "regression", (res.returncode, report["reason"])
    (v,) = [v for v in report["verdicts"] if v["op"] == "lib.act"]
    assert v["outcome"] == "regression" and v["reason"].startswith("operator removed or broken"), v["reason"]


def test_the_action_fails_its_step_without_a_config(tmp_path):
    from tests.test_action import Action
    from tests.github_fake import FakeGitHub

    with FakeGitHub() as fake:
        act = Action(tmp_path, fake.url)
        (act.ws / "lib").mkdir()
        (act.ws / "lib" / "ops.py").write_text("def act(x):\n    return x\n")
        git(tmp_path, "init", "-q", "-b", "main", str(act.ws))
        git(act.ws, "add", "-A")
        git(act.ws, "commit", "-q", "-m", "base")
        git(act.ws, "update-ref", "refs/remotes/origin/main", "main")
        git(act.ws, "checkout", "-q", "-b", "pr")
        (act.ws / "lib" / "ops.py").write_text("def act(x):\n    return x * 1.5\n")
        git(act.ws, "commit", "-q", "-am", "regression")
        res, outputs, _ = act.run(None, mode="gate", comment="false")
    assert res.returncode == 2 and outputs["outcome"] == "error", (res.returncode, res.stderr[-2000:])
    assert NO_CONFIG in res.stdout + res.stderr


# ---------------------------------------------------------------------------------------
# E. the judge never imports the code under test
# ---------------------------------------------------------------------------------------
#: at import: says which process imported it, and changes global numerics settings (an ordinary
#: library's import-time side effects; in the judge's process they would change its arithmetic)
SETTINGS = '''
import os as _os
with open(%r, "a") as _f:
    _f.write(f"{_os.getpid()} {'DL_GATE_STATE' in _os.environ}\\n")
torch.set_default_dtype(torch.float64)
torch.set_flush_denormal(True)
'''


def test_the_judge_never_imports_the_code_under_test(repo, tmp_path):
    marks = tmp_path / "imports.txt"
    src = head_src(SETTINGS % str(marks))
    pr = pull_request(repo, tmp_path, src)
    res = run_gate(pr, tmp_path / "out")
    report = report_of(tmp_path / "out")
    assert res.returncode == 1 and report["outcome"] == "regression", (res.returncode, report["reason"], res.stderr[-2000:])
    imports = [ln.split() for ln in marks.read_text().splitlines()]
    assert imports, "the operator was never imported"
    assert not [pid for pid, in_run in imports if in_run == "True"], "the gate's run process imported the operator"
    v = next(v for v in report["verdicts"] if v["op"] == "lib.act")
    line = src.splitlines().index("def act(x):") + 1
    assert (v["source_file"], v["source_line"]) == ("lib/ops.py", line)
    assert v["diagnosis"] and "tracing head failed" not in json.dumps(v["diagnosis"]), v["diagnosis"]


def test_the_pr_cannot_turn_its_own_isolation_off(repo, tmp_path):
    marks = tmp_path / "imports.txt"
    config = CONFIG.replace("gate: {dtypes: [float32], modes: [input]}",
                            "gate: {dtypes: [float32], modes: [input], isolate: false}")
    pr = pull_request(repo, tmp_path, head_src(SETTINGS % str(marks)), {".dl-gate.yml": config})
    res = run_gate(pr, tmp_path / "out")
    report = report_of(tmp_path / "out")
    assert res.returncode == 1 and report["outcome"] == "regression", (res.returncode, report["reason"])
    assert any("gate.isolate" in w and "base's config decides" in w for w in report["warnings"]), report["warnings"]
    imports = [ln.split() for ln in marks.read_text().splitlines()]
    assert imports and not [pid for pid, in_run in imports if in_run == "True"]


def test_source_lines_come_from_the_index_or_a_worker_never_an_import(tmp_path, monkeypatch):
    from dataclasses import replace

    from gate import pipeline
    from gate.config import parse_config
    from tests.helpers.gitrepo import GitRepo

    r = GitRepo.init(tmp_path / "src")
    r.write({"src/pk/__init__.py": "from .ops import helper\n",
             "src/pk/ops.py": "import functools\n\n\ndef deco(f):\n    @functools.wraps(f)\n    def w(*a):\n"
                              "        return f(*a)\n    return w\n\n\n@deco\ndef act(x):\n    return x\n\n\n"
                              "scaled = functools.partial(act)\n\n\ndef helper(x):\n    return x\n\n\n"
                              "def _factory():\n    def made(x):\n        return x\n    return made\n\n\n"
                              "globals()['made'] = _factory()\n"})
    head = r.commit("lib")
    cfg = parse_config("version: 1\npython_path: [src]\n", r.path / ".dl-gate.yml", r.path)
    from gate.select import python_roots

    monkeypatch.setitem(pipeline._SOURCE_TREES, str(r.path.resolve()), (head, python_roots(r.path, cfg)))
    spec = parse_config("version: 1\nops:\n  - name: pk.act\n    callable: pk.ops:act\n"
                        "    inputs: [{name: x, shape: [2]}]\n").ops[0]
    imported = []
    monkeypatch.setattr(pipeline, "get_backend", lambda fw: imported.append(fw))  # a user op: never resolved here
    assert pipeline.op_source(spec, r.path) == ("src/pk/ops.py", 11)  # the decorator's line, as inspect says
    assert pipeline.op_source(replace(spec, callable="pk.ops:scaled"), r.path) == ("src/pk/ops.py", 16)
    assert pipeline.op_source(replace(spec, callable="pk:helper"), r.path) == ("src/pk/ops.py", 19)
    # bound at run time: the index cannot tell, a worker process finds it
    assert pipeline.op_source(replace(spec, callable="pk.ops:made"), r.path) == ("src/pk/ops.py", 24)
    assert not imported and "pk" not in sys.modules
