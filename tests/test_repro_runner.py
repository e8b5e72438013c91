"""tests/helpers/repro.py's run_script, which the beds use to run the repro scripts the gate
writes: it must give a script what ``python SCRIPT`` gives it (the working directory, argv,
sys.path[0], the environment, __name__, exit status, both output streams), stop one that runs
past its timeout, and refuse a script that imports the gate (a reviewer's machine has none)."""
import json
import os
import subprocess
import sys

import pytest

from tests.helpers.repro import run_script

PROBE = '''import json, os, sys
print(json.dumps({"cwd": os.getcwd(), "argv": sys.argv, "path0": sys.path[0], "path1": sys.path[1],
                  "x": os.environ.get("REPRO_X"),
                  "name": __name__, "stdin": sys.stdin.read()}))
print("to stderr", file=sys.stderr)
sys.exit(int(sys.argv[1]))
'''


def test_a_script_sees_what_python_script_gives_it(tmp_path):
    script = tmp_path / "scripts" / "probe.py"
    script.parent.mkdir()
    script.write_text(PROBE)
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "REPRO_X": "on", "PYTHONPATH": str(tmp_path / "libs")}  # a library found through PYTHONPATH
    fresh = subprocess.run([sys.executable, str(script), "3"], cwd=work, env=env, capture_output=True, text=True,
                           stdin=subprocess.DEVNULL)
    forked = run_script([str(script), "3"], cwd=work, env=env)
    assert (forked.returncode, forked.stderr) == (fresh.returncode, fresh.stderr) == (3, "to stderr\n")
    seen = json.loads(forked.stdout)
    assert seen == json.loads(fresh.stdout), (seen, fresh.stdout)
    assert seen["x"] == "on" and seen["name"] == "__main__" and seen["path0"] == str(script.parent)
    assert seen["path1"] == str(tmp_path / "libs")
    # an uncaught exception: exit 1 and its traceback on stderr, as the interpreter does
    script.write_text("raise ValueError('boom')\n")
    res = run_script([str(script)], cwd=work)
    assert res.returncode == 1 and "ValueError: boom" in res.stderr


def test_a_script_past_its_timeout_is_stopped_and_one_that_imports_the_gate_is_refused(tmp_path):
    slow = tmp_path / "slow.py"
    slow.write_text("import time\ntime.sleep(60)\n")
    with pytest.raises(subprocess.TimeoutExpired):
        run_script([str(slow)], timeout=1)
    # the runner still answers after it
    ok = tmp_path / "ok.py"
    ok.write_text("print('next')\n")
    assert run_script([str(ok)]).stdout == "next\n"
    bad = tmp_path / "bad.py"
    bad.write_text("from gate.search.inputs import Candidate\n")
    with pytest.raises(AssertionError, match="gate.search.inputs"):
        run_script([str(bad)])
