"""The code under test can never turn the gate green (issue 18).

A PR whose operators end their process (``os._exit(0)``, ``sys.exit(0)``), segfault, abort,
allocate past the worker's memory limit, hang, or leave a child process behind is run through
the real CLI (`python -m gate.cli run`, the supervisor and its run process, the default
configuration: isolated workers). Each misbehaviour is a crash or hang finding, the gate does
not pass, and report.json and junit.xml are written, within the run's deadline. Without
isolation (trusted code) the same PR cannot turn the gate green either: the supervisor writes an
error report. Modelled on what the issue's probes did to a copy of a real operator bed.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_gate_run import git, make_repo
from tests.helpers.repro import run_script

#: what the supervisor contains is tested on a user's path: no zygote server (conftest)
pytestmark = pytest.mark.usefixtures("no_zygote_server")

ROOT = Path(__file__).resolve().parents[1]

BASE = '''
import torch


def scaled(x):
    return x * 0.5
'''

#: each operator is base's ``scaled`` until the PR plants its misbehaviour; one variant each (no
#: gradient, no second layout): what is tested is the process boundary, and every variant crosses
#: it the same way
NAMES = ("exit0", "sysexit", "segv", "abort", "memory", "orphan")

CONFIG = """
version: 1
framework: torch
python_path: ["."]
builtin: false
gate: {dtypes: [float32], modes: [input], eval_memory_mb: 3072}
ops:
""" + "".join(f"""  - name: lib.{n}
    callable: lib.ops:{n}
    sources: [lib/ops.py]
    dims: {{N: [1, 16]}}
    inputs: [{{name: x, shape: [N]}}]
    grad: false
    layouts: {{}}
""" for n in NAMES + ("hang",))

BASE_SRC = BASE + "".join(f"\n\ndef {n}(x):\n    return x * 0.5\n" for n in NAMES + ("hang",))

PLANTED = {
    "exit0": "import os\n    os._exit(0)",
    "sysexit": "import sys\n    sys.exit(0)",
    "segv": "import ctypes\n    ctypes.string_at(0)",
    "abort": "import os\n    os.abort()",
    # a 1 GiB buffer per call that is never freed: past the worker's 3 GiB address space it fails
    # (numpy.empty reserves without writing: the leak costs address space, not seconds of memset)
    "memory": "import numpy\n    _LEAK.append(numpy.empty(1 << 30, dtype=numpy.uint8))",
    # a helper process that outlives the operator, then the operator's process ends
    "orphan": ("import subprocess, sys, os\n    subprocess.Popen([sys.executable, '-c', "
               "'import time; time.sleep(300)  # dl-gate-orphan-marker'])\n    os._exit(0)"),
    "hang": "while True:\n        pass",
}


def plant(src: str, names) -> str:
    for n in names:
        src = src.replace(f"def {n}(x):\n    return x * 0.5", f"def {n}(x):\n    {PLANTED[n]}\n    return x * 0.5")
    return "_LEAK = []\n" + src


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return make_repo(tmp_path_factory.mktemp("contain"), ops_src=BASE_SRC, config=CONFIG, package="lib")


def branch(repo: Path, tmp_path: Path, name: str, names) -> Path:
    dst = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(repo), str(dst)], check=True)
    git(dst, "checkout", "-q", "-b", name)
    ops = dst / "lib" / "ops.py"
    ops.write_text(plant(ops.read_text(), names))
    git(dst, "commit", "-q", "-am", name)
    return dst


def run_cli(repo: Path, out: Path, *extra: str, timeout: float = 300):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DL_GATE_QUIET": "1"}
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "gate.cli", "run", "--base", "main", "--out", str(out), *extra],
                         cwd=repo, env=env, capture_output=True, text=True, timeout=timeout)
    return res, time.monotonic() - t0


def outputs(out: Path) -> dict:
    assert (out / "junit.xml").exists(), "no junit.xml"
    return json.loads((out / "report.json").read_text())


def orphans() -> list:
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"dl-gate-orphan-marker" in cmd and b"-c" in cmd:
                found.append(int(pid))
    return found


def test_operators_that_end_their_process_are_crash_findings(repo, tmp_path):
    pr = branch(repo, tmp_path, "misbehave", NAMES)
    res, _ = run_cli(pr, tmp_path / "out", "--evals", "6", "--ops", ",".join(f"lib.{n}" for n in NAMES))
    report = outputs(tmp_path / "out")
    assert res.returncode == 1 and report["outcome"] == "regression", (res.returncode, report["reason"], res.stderr[-2000:])
    by_op = {v["op"]: v for v in report["verdicts"]}
    for n in NAMES:
        v = by_op[f"lib.{n}"]
        assert v["outcome"] == "regression", (n, v["outcome"], v["reason"])
        assert v["head_crash"], (n, v)
    text = json.dumps(report)
    for expected in ("exit code 0", "SIGSEGV", "SIGABRT", "MemoryError"):
        assert expected in text, expected
    time.sleep(0.5)
    assert not orphans(), "a process the operator started outlived the run"


def test_a_hang_is_a_hang_finding_within_the_deadline(repo, tmp_path):
    pr = branch(repo, tmp_path, "hang", ["hang"])
    res, took = run_cli(pr, tmp_path / "out", "--budget", "3", "--eval-timeout", "1", "--ops", "lib.hang",
                        "--deadline", "90")
    report = outputs(tmp_path / "out")
    assert res.returncode == 1, (report["reason"], res.stderr[-2000:])
    v = report["verdicts"][0]
    assert v["outcome"] == "regression" and "timeout after" in json.dumps(v), v
    assert took < 90 + 25, took  # the deadline (plus the SIGTERM grace) bounds the run whatever happens
    # its repro waits as long as the gate did: on head it hangs (exit 1, where it hung), on base it returns
    script = (v.get("diagnosis") or {}).get("repro_script")
    assert script, v.get("diagnosis")
    on_head = run_script([script, "--repo", str(pr)], timeout=60)
    assert on_head.returncode == 1 and "ops.py" in on_head.stderr, on_head.stdout + on_head.stderr
    git(pr, "checkout", "-q", "main")
    on_base = run_script([script, "--repo", str(pr)], timeout=60)
    assert on_base.returncode == 0 and "does not reproduce" in on_base.stdout, on_base.stdout + on_base.stderr


def test_without_isolation_an_exit_is_an_error_report_not_a_pass(repo, tmp_path):
    pr = branch(repo, tmp_path, "exit", ["exit0"])
    res, _ = run_cli(pr, tmp_path / "out", "--evals", "4", "--ops", "lib.exit0", "--no-isolate")
    report = outputs(tmp_path / "out")
    assert res.returncode == 2 and report["outcome"] == "error", (res.returncode, report)
    assert "exit code 0 before writing its report" in report["reason"], report["reason"]
    assert "fuzzing lib.exit0" in report["reason"]  # where it was when it ended
    assert report["selected"], "what was computed before the exit is kept"


def test_without_isolation_a_hang_is_stopped_at_the_deadline(repo, tmp_path):
    pr = branch(repo, tmp_path, "hang", ["hang"])
    res, took = run_cli(pr, tmp_path / "out", "--evals", "4", "--ops", "lib.hang", "--no-isolate",
                        "--deadline", "12")
    report = outputs(tmp_path / "out")
    assert res.returncode == 2 and report["outcome"] == "error", (res.returncode, report["reason"])
    assert "deadline of 12s" in report["reason"], report["reason"]
    assert took < 12 + 25, took


def test_sigint_of_the_gate_still_writes_the_report(repo, tmp_path):
    """Ctrl-C (or a CI runner's SIGINT) reaches the supervisor: the run is stopped and the
    report says why, with what was computed so far."""
    import signal

    pr = branch(repo, tmp_path, "hang", ["hang"])
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "gate.cli", "run", "--base", "main", "--out", str(out), "--evals", "4",
                             "--ops", "lib.hang", "--no-isolate"], cwd=pr, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:  # wait until the run is inside the operator
        if "fuzzing lib.hang" in line:
            break
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    stdout, _ = proc.communicate(timeout=60)
    report = outputs(out)
    assert proc.returncode == 2 and report["outcome"] == "error", (proc.returncode, report["reason"])
    assert "SIGINT" in report["reason"] and report["selected"], report["reason"]
