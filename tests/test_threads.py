"""CPU threads per operator call: one by default, set by `threads:` or $DL_GATE_THREADS, the same
in the isolated workers and the repro scripts; outputs that do not depend on the runner's cores.

Every case runs in a fresh interpreter: the thread count is a process-wide setting of the
framework (and the config writes $DL_GATE_THREADS for the workers it starts)."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# the float32 sum of one row of 2^20 values, as the gate's precision runner computes it
SUM = textwrap.dedent("""
    import numpy as np, torch
    from gate.ops.catalog import load_catalog
    from gate.oracles.runner import VariantRunner
    from gate.plan import Variant
    from gate.search.inputs import Candidate
    runner = VariantRunner(load_catalog(builtin=("torch",)).get("torch.sum"), Variant("float32", "cpu"))
    x = np.random.default_rng(0).standard_normal((1, 1 << 20)) * 1000
    _, ev = runner.evaluate(Candidate(arrays={"input": x}, params={"dim": -1}, dims={"N": 1, "L": 1 << 20}),
                            keep_outputs=True)
    print(torch.get_num_threads(), float(ev.outputs[0].array.ravel()[0]).hex(), runner.backend.environment("cpu")["threads"])
""")


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("DL_GATE_THREADS", "OMP_NUM_THREADS")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _py(code, cwd, **env):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, env=_env(**env),
                          timeout=300)


def _sum(tmp_path, **env):
    res = _py(SUM, tmp_path, **env)
    assert res.returncode == 0, res.stderr[-2000:]
    threads, value, reported = res.stdout.split()
    return int(threads), value, int(reported)


def test_outputs_are_the_same_whatever_cores_the_runner_has(tmp_path):
    # a runner with one core and one with two (OMP_NUM_THREADS is the framework's default count)
    one = _sum(tmp_path, OMP_NUM_THREADS=1)
    two = _sum(tmp_path, OMP_NUM_THREADS=2)
    assert one[0] == two[0] == 1 and one[2] == two[2] == 1  # one thread by default, reported in the environment
    assert one[1] == two[1]
    # the premise: left to the framework's default, the sum's rounding follows the core count
    # (the split of a parallel sum), which is what the default removes
    free_one = _sum(tmp_path, OMP_NUM_THREADS=1, DL_GATE_THREADS=0)
    free_two = _sum(tmp_path, OMP_NUM_THREADS=2, DL_GATE_THREADS=0)
    assert (free_one[0], free_two[0]) == (1, 2)
    assert free_one[1] == one[1] and free_two[1] != one[1]


def _fuzz(tmp_path, config=None, **env):
    argv = ["fuzz", "torch.sum", "--dtype", "float32", "--evals", "5", "--json", str(tmp_path / "f.json")]
    if config is not None:
        (tmp_path / "cfg.yml").write_text(config)
        argv += ["-c", str(tmp_path / "cfg.yml")]
    code = f"import sys\nfrom gate.cli import main\nsys.exit(main({argv!r}))"
    return _py(code, tmp_path, **env)


def test_the_config_sets_the_threads_of_the_isolated_workers_and_the_environment_overrides_it(tmp_path):
    cfg = "version: 1\nbuiltin: [torch]\nthreads: 2\n"
    res = _fuzz(tmp_path, cfg)
    assert res.returncode == 0, res.stderr[-2000:]
    findings = json.loads((tmp_path / "f.json").read_text())["findings"]
    assert findings and all(f["env"]["threads"] == 2 for f in findings)  # measured in the worker
    res = _fuzz(tmp_path, cfg, DL_GATE_THREADS=1)
    assert res.returncode == 0, res.stderr[-2000:]
    assert all(f["env"]["threads"] == 1 for f in json.loads((tmp_path / "f.json").read_text())["findings"])


@pytest.mark.parametrize("config,env,needle", [
    (None, {"DL_GATE_THREADS": "two"}, "DL_GATE_THREADS='two': not a whole number"),
    (None, {"DL_GATE_THREADS": "-1"}, "DL_GATE_THREADS='-1'"),
    ("version: 1\nbuiltin: [torch]\nthreads: -2\n", {}, "threads"),
])
def test_a_bad_thread_count_is_a_one_line_error(tmp_path, config, env, needle):
    res = _fuzz(tmp_path, config, **env)
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("dl-gate: error:") and needle in lines[0], res.stderr


def test_a_repro_script_computes_on_the_gates_thread_count(tmp_path):
    from gate.localise.repro import write_repro
    from gate.ops.catalog import load_catalog
    from gate.plan import Variant
    from gate.search.inputs import Candidate
    import numpy as np

    spec = load_catalog(builtin=("torch",)).get("torch.sum")
    x = np.random.default_rng(0).standard_normal((1, 1 << 20)) * 1000
    cand = Candidate(arrays={"input": x}, params={"dim": -1}, dims={"N": 1, "L": 1 << 20})
    info = write_repro(tmp_path / "r", "repro", spec, Variant("float32", "cpu"), cand, kind="precision",
                       threshold=1.0, threshold_why="test", reason="test", repo=tmp_path, python_path=[])
    text = Path(info["script"]).read_text()
    assert "THREADS = 1" in text and "torch.set_num_threads(THREADS)" in text
    # on a two-core runner the script computes on one thread, as the gate did
    run = ("import runpy, sys, torch\n"
           f"sys.argv = [{info['script']!r}]\n"
           "try:\n"
           f"    runpy.run_path({info['script']!r}, run_name='__main__')\n"
           "except SystemExit as exc:\n"
           "    print('exit', exc.code)\n"
           "print('threads', torch.get_num_threads())\n")
    res = _py(run, tmp_path, OMP_NUM_THREADS=2)
    assert res.returncode == 0 and "exit 2" not in res.stdout, res.stdout[-2000:] + res.stderr[-2000:]
    assert res.stdout.strip().splitlines()[-1] == "threads 1", res.stdout[-2000:]
