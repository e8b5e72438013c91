"""Running a repro script the gate wrote, as a reviewer does (``python SCRIPT [--repo R]``): on
head it must exit 1 (the finding reproduces), on base 0 (checked out in the same repository).

A repro script's own work is milliseconds; what a fresh interpreter costs is ``import torch``
(~1.2 s of CPU here: ~8 % of the suite's CPU went to the ~60 repro runs, a whole-suite profile,
2026-12-02). :func:`run_script` runs it in a process forked from a warm one that has imported
NumPy and torch and nothing else (no gate module, no library, no TensorFlow), in the working
directory, environment and ``sys.argv``/``sys.path[0]`` that ``python SCRIPT`` gives it; what
the fork inherits beyond a fresh interpreter is only those two imports. The script is also read
to check that it imports nothing of the gate's (a user's machine has no dl-gate). One test keeps
real fresh interpreters (tests/test_localise.py::test_repro_scripts_reproduce_in_a_fresh_process),
and tests/test_threads.py checks a fresh script's thread count."""
from __future__ import annotations

import ast
import atexit
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from tests.test_gate_run import git

#: the warm process: reads one JSON request a line, forks, answers one JSON line
_SERVER = r'''
import json, os, sys
import numpy, torch  # noqa: F401 - what a repro script imports first
for line in sys.stdin:
    req = json.loads(line)
    out, err = req["out"], req["err"]
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            fo, fe = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(fo, 1); os.dup2(fe, 2)
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # not the server's request pipe: an empty stdin, as the tests gave
            sys.stdout = open(1, "w", buffering=1, closefd=False)
            sys.stderr = open(2, "w", buffering=1, closefd=False)
            sys.stdin = open(0, "r", closefd=False)
            os.setsid()
            os.chdir(req["cwd"])
            os.environ.clear(); os.environ.update(req["env"])
            import runpy, warnings
            if req["ignore_warnings"]:
                warnings.simplefilter("ignore")
            script = req["argv"][0]
            sys.argv = list(req["argv"])
            sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python SCRIPT` puts it
            # and PYTHONPATH's entries next, as the interpreter puts them at its start
            sys.path[1:1] = [os.path.abspath(e) for e in os.environ.get("PYTHONPATH", "").split(os.pathsep) if e]
            try:
                runpy.run_path(script, run_name="__main__")
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except BaseException:
                import traceback
                traceback.print_exc()
                code = 1
        finally:
            try:
                sys.stdout.flush(); sys.stderr.flush()
            finally:
                os._exit(code)
    import signal, time
    deadline = time.monotonic() + req["timeout"]
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            rc = os.waitstatus_to_exitcode(status)
            break
        if time.monotonic() > deadline:  # as subprocess.run's timeout: the script and what it started
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
            os.waitpid(pid, 0)
            rc = None
            break
        time.sleep(0.005)
    sys.__stdout__.write(json.dumps({"rc": rc}) + "\n")
    sys.__stdout__.flush()
'''

_LOCK = threading.Lock()
_PROC: Optional[subprocess.Popen] = None


def _server() -> subprocess.Popen:
    global _PROC
    if _PROC is None or _PROC.poll() is not None:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        _PROC = subprocess.Popen([sys.executable, "-c", _SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, text=True, env=env, cwd="/")
        atexit.register(_stop, _PROC)
    return _PROC


def _stop(proc: subprocess.Popen) -> None:
    """At the test process's exit: the server ends at the end of its input."""
    for f in (proc.stdin, proc.stdout):
        try:
            f.close()
        except OSError:
            pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:  # pragma: no cover
        proc.kill()
        proc.wait()


def imports_no_gate(script: str) -> None:
    """The script imports nothing of dl-gate's (a reviewer's machine has only the framework)."""
    tree = ast.parse(Path(script).read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level]
    assert not [n for n in names if n == "gate" or n.startswith("gate.")], (script, names)


def run_script(argv: Sequence[str], cwd: Optional[Path] = None, env: Optional[Dict[str, str]] = None,
               ignore_warnings: bool = False, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python [-W ignore] *argv`` (``argv[0]`` a repro script) as a finished process: its exit
    status, stdout and stderr; run in a fork of the warm process (module docstring)."""
    import tempfile

    script = str(argv[0])
    imports_no_gate(script)
    with tempfile.TemporaryDirectory(prefix="repro-run-") as d:
        out, err = os.path.join(d, "out"), os.path.join(d, "err")
        req = {"argv": [script, *map(str, argv[1:])], "cwd": str(cwd or os.getcwd()),
               "env": dict(os.environ if env is None else env), "out": out, "err": err,
               "ignore_warnings": ignore_warnings, "timeout": timeout}
        with _LOCK:
            proc = _server()
            proc.stdin.write(json.dumps(req) + "\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
        if not line:
            raise RuntimeError("the repro runner ended")
        rc = json.loads(line)["rc"]
        if rc is None:
            raise subprocess.TimeoutExpired(req["argv"], timeout)
        read = lambda p: Path(p).read_text(errors="replace") if os.path.exists(p) else ""  # noqa: E731
        return subprocess.CompletedProcess([sys.executable, *req["argv"]], rc, read(out), read(err))


def assert_repro_head_then_base(script: str, repo: Path, base: str = "main") -> None:
    """``script`` exits 1 where the PR's branch is checked out, then 0 on ``base``."""
    on_head = run_script([script], ignore_warnings=True)
    assert on_head.returncode == 1, on_head.stdout + on_head.stderr
    git(repo, "checkout", "-q", base)
    on_base = run_script([script, "--repo", str(repo)], ignore_warnings=True)
    assert on_base.returncode == 0, on_base.stdout + on_base.stderr
