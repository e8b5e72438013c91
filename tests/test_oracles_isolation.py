"""Crash and hang isolation (gate.backends.isolate): planted operators that segfault (through
ctypes) and deadlock on one input value are found within a 10 s budget while this test process
survives; the worker is restarted and the search goes on."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gate.errors import ConfigError
from gate.fuzz import Finding, fuzz_task
from gate.backends.isolate import IsolateOptions
from gate.oracles.registry import build_runner
from gate.plan import Variant

from tests.oracle_support import task, user_ops

ROOT = Path(__file__).resolve().parents[1]

OPS = """
- name: planted.segv
  callable: planted_ops:segv_on_minus_one
  dims: {N: [1, 16], D: [1, 16]}
  inputs: [{name: x, shape: [N, D]}]
  dtypes: [float32]
  modes: [input]
- name: planted.hang
  callable: planted_ops:hang_on_half
  dims: {N: [1, 16], D: [1, 16]}
  inputs: [{name: x, shape: [N, D]}]
  dtypes: [float32]
  modes: [input]
- name: planted.slow_once
  callable: planted_ops:slow_third_call
  dims: {N: [1, 8]}
  inputs: [{name: x, shape: [N]}]
  dtypes: [float32]
  modes: [input]
- name: planted.steady_slow
  callable: planted_ops:steady_slow
  dims: {N: [1, 8]}
  inputs: [{name: x, shape: [N]}]
  dtypes: [float32]
  modes: [input]
- name: planted.missing
  callable: planted_ops:no_such_function
  inputs: [{name: x, shape: [4]}]
"""


def test_hang_is_a_timeout_finding_with_the_place_it_hung(tmp_path):
    specs = user_ops(tmp_path, OPS)
    f = fuzz_task(task(specs["planted.hang"], "precision", seconds=10, evals=100),
                  isolate=IsolateOptions(timeout=1.0, warmup_factor=1.0))
    assert f.crashes, f"no hang found in {f.evals} evaluations"
    sig = f.crashes[0].signature
    assert sig.startswith("timeout after 1s"), sig
    assert "planted_ops.py" in sig and "hang_on_half" in sig, sig
    assert (f.crashes[0].candidate.arrays["x"] == 0.5).any()
    assert f.evals > sum(c.count for c in f.crashes)


def test_a_slow_call_is_waited_for_before_it_is_called_a_hang(tmp_path):
    """The evaluation limit is where a hang is suspected, not where it is decided: a call that
    takes 2.5 s past a 1 s limit (a loaded runner) is given longer and answers: no crash."""
    specs = user_ops(tmp_path, OPS)
    runner = build_runner(specs["planted.slow_once"], Variant("float32", "cpu", "input"),
                          isolate=IsolateOptions(timeout=1.0, warmup_factor=1.0))
    f = fuzz_task(task(specs["planted.slow_once"], "precision", seconds=None, evals=8), runner=runner)
    assert not f.crashes, [c.message for c in f.crashes]
    assert f.evals == 8 and runner.stats["slow"] == 1 and runner.stats["timeouts"] == 0, runner.stats
    runner.close()


def test_the_hang_limit_grows_with_the_operators_own_cost(tmp_path):
    """0.3 s calls under a 0.2 s floor: the limit is 10x the operator's median call, not the floor."""
    specs = user_ops(tmp_path, OPS)
    runner = build_runner(specs["planted.steady_slow"], Variant("float32", "cpu", "input"),
                          isolate=IsolateOptions(timeout=0.2))
    f = fuzz_task(task(specs["planted.steady_slow"], "precision", seconds=None, evals=5), runner=runner)
    assert runner.hang_limit() >= 10 * 0.3, runner.hang_limit()
    assert not f.crashes and runner.stats["timeouts"] == 0, runner.stats
    runner.close()


def test_worker_start_failure_is_a_one_line_gate_error(tmp_path):
    specs = user_ops(tmp_path, OPS)
    with pytest.raises(ConfigError, match="cannot import callable 'planted_ops:no_such_function'"):
        build_runner(specs["planted.missing"], Variant("float32"), isolate=IsolateOptions(start_timeout=120))


def test_segfault_via_cli_with_isolation_from_config(tmp_path):
    """`dl-gate fuzz` with ``gate.isolate: true``: the segfault becomes a crash finding, the
    worker is replaced and the search goes on; the crashing input is saved for replay."""
    user_ops(tmp_path, OPS, extra="gate: {isolate: true, eval_timeout: 5}\n")
    out = tmp_path / "findings.json"
    proc = subprocess.run(
        [sys.executable, "-m", "gate.cli", "fuzz", "planted.segv", "--budget", "10", "--evals", "100",
         "--json", str(out), "--save-inputs", str(tmp_path / "inputs")],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "crash in planted.segv[float32/cpu/input]: SIGSEGV in planted_ops.py:" in proc.stdout
    # the operator's default variant (a user operator also gets a non-contiguous and a gradient one)
    (finding,) = [f for f in json.loads(out.read_text())["findings"]
                  if f["variant"].get("layout", "default") == "default" and f["variant"].get("oracle", "precision") == "precision"]
    crash = Finding.from_dict(finding).crashes[0]
    assert crash.signature.startswith("SIGSEGV in planted_ops.py:") and "segv_on_minus_one" in crash.signature
    assert (crash.candidate.arrays["x"] == -1.0).any()  # the recorded input holds the planted value
    # the worker was replaced and the search went on past the crashes
    assert finding["evals"] > sum(c["count"] for c in finding["crashes"])
    assert finding["metrics"]["ulp"] == 0.0  # relu is exact everywhere else
    assert finding["env"]["framework"] == "torch"  # reported by the worker
    assert list((tmp_path / "inputs" / "planted.segv").glob("*.crash0.npz"))


@pytest.mark.tf
def test_tensorflow_workers_are_forked_from_a_zygote_that_imported_it_and_compute_on_one_thread():
    """TensorFlow's import starts no thread and builds no runtime, so its zygote imports it once
    and every worker is forked warm (each worker imported it anew before: 5-9 s a variant on a
    2-core runner); the runtime is made after the fork, so the gate's thread count still reaches
    it. A crashed worker is replaced by another fork."""
    pytest.importorskip("tensorflow")
    import numpy as np

    from gate.backends import isolate
    from gate.ops.catalog import load_catalog
    from gate.search.inputs import draw

    cat = load_catalog(builtin=("tensorflow",))
    tf_spec = next(s for s in cat if s.framework == "tensorflow")
    opts = IsolateOptions(start_timeout=180)
    first = build_runner(tf_spec, Variant("float32"), isolate=opts)
    zygote = isolate._ZYGOTES[isolate.PRELOAD["tensorflow"]]
    maps = Path(f"/proc/{zygote.proc.pid}/maps").read_text()
    assert "libtensorflow" in maps, "the zygote did not import TensorFlow before forking"
    pid = first._active.proc.pid
    q, ev = first.evaluate(draw(tf_spec, np.random.default_rng(0)))
    assert ev.status == "ok", ev.error
    assert first.env["threads"] == 1, first.env  # set in the worker, after the fork
    first.close()
    second = build_runner(tf_spec, Variant("float16"), isolate=opts)
    assert second._active.proc.pid != pid and second.env["threads"] == 1
    second._discard_active(kill=True)  # as after a crash or a hang
    second.evaluate(draw(tf_spec, np.random.default_rng(1)))  # a new fork answers
    assert second.stats["starts"] == 2
    second.close()


SPAWNED = '''
import json, os, sys
line = sys.stdin.readline()
print("to stderr", file=sys.stderr)
print(json.dumps({"line": line.strip(), "argv": sys.argv[1:], "cwd": os.getcwd(), "path0": sys.path[0],
                  "ppid": os.getppid(), "torch": "torch" in sys.modules,
                  "secret": os.environ.get("DL_GATE_TEST_SECRET_TOKEN")}), flush=True)
sys.exit(3)
'''


def test_a_module_spawned_by_the_zygote_runs_as_python_dash_m_would(tmp_path, monkeypatch):
    """The localisation workers start this way (gate.localise.evaluate.BaseWorker): forked from
    the zygote, which imported torch, with its own stdio, working directory and import path, the
    worker environment's allow-list, and its exit status."""
    from gate.backends.isolate import spawn_module

    monkeypatch.setenv("DL_GATE_TEST_SECRET_TOKEN", "must-not-reach-the-child")
    (tmp_path / "spawned_probe.py").write_text(SPAWNED)
    err = open(tmp_path / "stderr", "wb")
    try:
        proc = spawn_module("torch", "spawned_probe", ["a", "b"], str(tmp_path), err.fileno(), IsolateOptions())
        assert proc is not None, "no zygote served the spawn"
        proc.stdin.write("hello\n")
        proc.stdin.flush()
        got = json.loads(proc.stdout.readline())
        assert proc.wait(timeout=60) == 3
    finally:
        err.close()
    assert got["line"] == "hello" and got["argv"] == ["a", "b"]
    assert got["cwd"] == str(tmp_path) and got["path0"] == str(tmp_path)  # python -m's sys.path[0]
    assert got["torch"] and got["ppid"] != os.getpid()  # forked from the warm zygote, not started here
    assert got["secret"] is None
    assert (tmp_path / "stderr").read_text() == "to stderr\n"
    assert spawn_module("torch", "spawned_probe", [], str(tmp_path), 2, IsolateOptions(zygote=False)) is None


BACKWARD_PROBE = '''
import json, sys
print(json.dumps("torch.fx.experimental.symbolic_shapes" in sys.modules), flush=True)
'''


def test_the_zygote_imports_what_a_backward_pass_needs_before_its_first_gradient_worker(tmp_path, monkeypatch):
    """torch.autograd.grad's first call imports symbolic_shapes (and sympy): the zygote imports it
    once before it forks a gradient worker (each worker paid ~0.3 s for it), and a run that takes
    no gradient does not pay for it at all."""
    from gate.backends import isolate
    from gate.backends.isolate import spawn_module

    # a zygote of this process's own (a zygote server, tests/conftest.py, preloads it for every run)
    monkeypatch.delenv(isolate.SERVER_ENV, raising=False)
    isolate._close_zygotes()  # this process's zygote, as a run's starts: nothing but the preload
    specs = user_ops(tmp_path, OPS)
    (tmp_path / "backward_probe.py").write_text(BACKWARD_PROBE)

    def zygote_has_it() -> bool:
        proc = spawn_module("torch", "backward_probe", [], str(tmp_path), 2, IsolateOptions())
        assert proc is not None
        got = json.loads(proc.stdout.readline())
        proc.wait(timeout=60)
        return got

    spec = specs["planted.segv"]
    build_runner(spec, Variant("float32", "cpu", "input"), isolate=IsolateOptions()).close()
    assert not zygote_has_it()
    runner = build_runner(spec, Variant("float32", "cpu", "input", oracle="grad"), isolate=IsolateOptions())
    try:
        assert zygote_has_it()
    finally:
        runner.close()


KERNELS_PROBE = '''
import json, sys
loaded = {}
if "numba" in sys.modules:  # what the zygote had loaded when it forked this process
    from gate.backends import _round_kernel as r
    from gate.oracles import _fused_kernel as f
    from gate.search import _bands_kernel as b, _randoms_kernel as n
    loaded = {"round_to": len(r.round_to.overloads), "round_float32_twin": len(r.round_float32_twin.overloads),
              "traverse": len(f.traverse.overloads), "at_or_above": len(b.at_or_above.overloads),
              "normals": len(n.normals.overloads)}
print(json.dumps(loaded), flush=True)
'''


@pytest.mark.parametrize("framework", ["torch", pytest.param("tensorflow", marks=pytest.mark.tf)])
def test_the_zygote_loads_the_compiled_loops_before_it_forks(tmp_path, monkeypatch, framework):
    """Each worker imported Numba and loaded every compiled loop (rounding, scoring, band counts,
    random numbers) from its on-disk cache anew: ~1 s of CPU a worker, half of a torch bed's CPU
    time. The zygote loads them once (gate.oracles.registry.warm_kernels), without importing
    another framework; its forks start with them."""
    if framework == "tensorflow":
        pytest.importorskip("tensorflow")
    from gate.backends import isolate
    from gate.backends.isolate import spawn_module

    monkeypatch.delenv(isolate.SERVER_ENV, raising=False)  # this process's own zygote, as a user's run
    isolate._close_zygotes()
    (tmp_path / "kernels_probe.py").write_text(KERNELS_PROBE)
    try:
        proc = spawn_module(framework, "kernels_probe", [], str(tmp_path), 2, IsolateOptions())
        assert proc is not None
        loaded = json.loads(proc.stdout.readline())
        proc.wait(timeout=60)
        other = "tensorflow" if framework == "torch" else "torch"
        maps = Path(f"/proc/{isolate._ZYGOTES[isolate.PRELOAD[framework]].proc.pid}/maps").read_text()
        assert f"site-packages/{other}/" not in maps  # nothing of the other framework
    finally:
        isolate._close_zygotes()
    assert loaded and all(loaded.values()), loaded


SERVER_CLIENT = '''
import json, os, sys, time
from gate.backends import isolate
z = isolate._zygote(isolate.PRELOAD["torch"], 60)
proc = isolate.spawn_module("torch", "sleeper", [], os.getcwd(), 2)
print(json.dumps({"served": type(z.proc).__name__, "zygote": z.proc.pid, "sleeper": json.loads(proc.stdout.readline())}),
      flush=True)
time.sleep(300)
'''

SLEEPER = '''
import json, os, sys, time
print(json.dumps({"pid": os.getpid(), "torch": "torch" in sys.modules, "cwd": os.getcwd(),
                  "server": os.environ.get("DL_GATE_ZYGOTE_SERVER"), "x": os.environ.get("DL_GATE_TEST_X"),
                  "tf": os.environ.get("TF_DL_GATE_TEST"), "quiet": os.environ.get("DL_GATE_QUIET")}), flush=True)
time.sleep(300)
'''


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def test_a_zygote_server_forks_each_runs_zygote_and_the_runs_workers_die_with_it(tmp_path):
    """gate.backends.isolate.server_main (what tests/conftest.py starts for the suite): a client
    in the server's environment gets a zygote forked from it (torch already imported), in its own
    working directory, and the server's socket never reaches a worker; when the client dies
    (SIGKILL: no exit handler), its zygote and workers die with it. A client whose workers'
    environment differs (an allowed variable set) starts a zygote of its own, as it would
    without a server."""
    import signal
    import time

    from gate.backends.isolate import SERVER_ENV
    from gate.backends.sandbox import worker_env

    (tmp_path / "client.py").write_text(SERVER_CLIENT)
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    sock = str(tmp_path / "zs.sock")
    base = {k: v for k, v in os.environ.items() if k not in (SERVER_ENV, "DL_GATE_TEST_X", "DL_GATE_QUIET", "TF_DL_GATE_TEST")}
    server = subprocess.Popen([sys.executable, "-m", "gate.backends.isolate", "--zygote-server", sock],
                              env=worker_env(source=base), cwd=str(Path(__file__).resolve().parent.parent))
    try:
        for _ in range(1200):
            if os.path.exists(sock):
                break
            time.sleep(0.05)

        def client(**extra):
            root = str(Path(__file__).resolve().parent.parent)
            env = {**base, SERVER_ENV: sock, **extra,
                   "PYTHONPATH": os.pathsep.join([root, base["PYTHONPATH"]]) if base.get("PYTHONPATH") else root}
            proc = subprocess.Popen([sys.executable, "client.py"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
            line = proc.stdout.readline()
            assert line, proc.communicate()[1][-2000:]
            return proc, {**json.loads(line), "stderr": ""}

        proc, got = client()
        try:
            assert got["served"] == "_Served", got
            sleeper = got["sleeper"]
            assert sleeper["torch"] and sleeper["cwd"] == str(tmp_path) and sleeper["server"] is None, got
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        for _ in range(200):
            if _gone(sleeper["pid"]) and _gone(got["zygote"]):
                break
            time.sleep(0.05)
        assert _gone(sleeper["pid"]) and _gone(got["zygote"]), "the run's zygote or worker outlived it"
        assert server.poll() is None, "the server serves the next run"
        # a per-run variable, a variable of a framework the server has not imported: its own values
        proc, got = client(DL_GATE_QUIET="1", TF_DL_GATE_TEST="2")
        try:
            assert got["served"] == "_Served" and got["sleeper"]["quiet"] == "1" and got["sleeper"]["tf"] == "2", got
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        proc, got = client(DL_GATE_TEST_X="1")
        try:
            assert got["served"] == "Popen" and got["sleeper"]["x"] == "1", got
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    finally:
        server.kill()
        server.wait()


def test_the_server_variable_names_a_server_per_framework():
    """tests/conftest.py starts one for torch and one for TensorFlow (a zygote that imported
    TensorFlow costs ~6 s of CPU): a client is served by its own framework's, never another's."""
    from gate.backends.isolate import server_paths

    assert server_paths("/z/torch") == {"torch": "/z/torch"}  # a bare path: torch's, as before
    both = server_paths(os.pathsep.join(["torch=/z/t", "tensorflow=/z/tf"]))
    assert both == {"torch": "/z/t", "tensorflow": "/z/tf"}
    assert server_paths(os.pathsep.join(["jax=/z/j", "", "tensorflow=/z/tf"])) == {"tensorflow": "/z/tf"}
    assert server_paths("") == {}


LIBRARY = '''
import os, threading, time
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "imports.log"), "a") as f:
    f.write(f"{os.getpid()}\\n")  # each import of the library, by the process that made it
with open(os.path.join(here, "mode")) as f:
    mode = f.read()
if mode == "thread":  # a library that starts a pool at import
    threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
if mode == "exit":  # one whose import ends its process
    os._exit(3)


def double(x):
    return x * 2
'''

LIBRARY_OPS = """
- name: lib.double
  callable: heavylib:double
  dims: {N: [1, 8]}
  inputs: [{name: x, shape: [N]}]
  grad: true
"""


def _close_libraries(isolate) -> None:
    """This process's library zygotes go (its framework zygotes, served by the suite's server, stay)."""
    for z in list(isolate._LIBRARY_ZYGOTES.values()):
        if z is not None:
            z.close()
    isolate._LIBRARY_ZYGOTES.clear()


def _library_runs(tmp_path, monkeypatch, how):
    from gate.backends import isolate

    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "heavylib.py").write_text(LIBRARY)
    (tmp_path / "lib" / "mode").write_text(how)
    _close_libraries(isolate)
    spec = user_ops(tmp_path, LIBRARY_OPS)["lib.double"]
    options = IsolateOptions(sys_path=(str(tmp_path / "lib"), *sys.path), cwd=str(tmp_path / "lib"))
    return isolate, spec, options


def test_a_librarys_workers_are_forked_from_a_zygote_that_imported_it_once(tmp_path, monkeypatch):
    """A real library's import takes seconds (``import monai.losses``: 4-9 s here) and each
    variant's workers (its search, head's replay, base's contrast and replay workers) imported it
    anew: a MONAI run spent 9-19 s a variant on them against 0.1 s of search. A zygote forked
    from the framework's imports the library once per import path; each worker is its fork."""
    isolate, spec, options = _library_runs(tmp_path, monkeypatch, "plain")
    try:
        workers = []
        for variant in (Variant("float32", "cpu", "input"), Variant("float16", "cpu", "input"),
                        Variant("float32", "cpu", "input", oracle="grad")):
            runner = build_runner(spec, variant, isolate=options)
            workers.append(runner._active.proc.pid)
            runner.close()
        imports = (tmp_path / "lib" / "imports.log").read_text().split()
        (lz,) = [z for z in isolate._LIBRARY_ZYGOTES.values() if z is not None]
        assert imports == [str(lz.proc.pid)]  # one import, by the library's zygote, none by a worker
        assert not set(imports) & {str(w) for w in workers}
        # another import path (base's worktree) is another library: its own zygote
        other = IsolateOptions(sys_path=(str(tmp_path / "lib"), str(tmp_path), *sys.path), cwd=str(tmp_path / "lib"))
        build_runner(spec, Variant("float32", "cpu", "input"), isolate=other).close()
        assert len([z for z in isolate._LIBRARY_ZYGOTES.values() if z is not None]) == 2
    finally:
        _close_libraries(isolate)


def test_a_library_whose_import_starts_a_thread_is_imported_by_each_worker(tmp_path, monkeypatch):
    """fork is unsafe once a library's import has started a thread (a pool, a CUDA context): such
    a library is not served by a zygote; each worker imports it, as before, and computes."""
    isolate, spec, options = _library_runs(tmp_path, monkeypatch, "thread")
    try:
        for dtype in ("float32", "float16"):
            f = fuzz_task(task(spec, "precision", dtype=dtype, seconds=None, evals=3), isolate=options)
            assert f.evals == 3 and not f.crashes and f.status == "ok", (f.status, f.message)
        imports = (tmp_path / "lib" / "imports.log").read_text().split()
        assert len(imports) == 3 and len(set(imports)) == 3  # the refused zygote's, then each worker's
        assert set(isolate._LIBRARY_ZYGOTES.values()) == {None}
    finally:
        _close_libraries(isolate)


def test_a_library_whose_import_ends_its_process_is_the_workers_one_line_error(tmp_path, monkeypatch):
    isolate, spec, options = _library_runs(tmp_path, monkeypatch, "exit")
    try:
        with pytest.raises(Exception) as err:
            build_runner(spec, Variant("float32", "cpu", "input"), isolate=options)
        # what a worker that imports it itself says: one line, with how the process ended
        assert "\n" not in str(err.value) and "did not start (dead, exit code 3)" in str(err.value), str(err.value)
        assert set(isolate._LIBRARY_ZYGOTES.values()) == {None}
    finally:
        _close_libraries(isolate)


def test_a_relative_import_path_in_two_folders_is_two_libraries(tmp_path, monkeypatch):
    """Two runs in one process (the suite; a script that gates two repositories), each in its own
    folder, with "." on the import path: each folder's `twice` is its own, not the first one's."""
    from gate.search.inputs import draw

    isolate, spec, _ = _library_runs(tmp_path, monkeypatch, "plain")
    outs = []
    try:
        for k, factor in (("a", 2), ("b", 3)):
            (tmp_path / k).mkdir()
            (tmp_path / k / "heavylib.py").write_text(f"def double(x):\n    return x * {factor}\n")
            monkeypatch.chdir(tmp_path / k)
            runner = build_runner(spec, Variant("float32", "cpu", "input"), isolate=IsolateOptions(sys_path=(".", *sys.path)))
            cand = draw(spec, __import__("numpy").random.default_rng(0))
            _, ev = runner.evaluate(cand, keep_outputs=True)
            runner.close()
            outs.append(float(ev.outputs[0].array.ravel()[0] / cand.arrays["x"].ravel()[0]))
    finally:
        _close_libraries(isolate)
    assert outs == pytest.approx([2.0, 3.0])


SHADOW_OPS = """
- name: lib.double
  callable: shadowpkg.ops:double
  dims: {N: [1, 8]}
  inputs: [{name: x, shape: [N]}]
- name: lib.plain
  callable: heavylib:double
  dims: {N: [1, 8]}
  inputs: [{name: x, shape: [N]}]
"""


def test_a_library_that_is_a_package_the_zygote_imported_runs_from_its_checkout(tmp_path, monkeypatch,
                                                                               no_zygote_server):
    """keras-team/keras d863dc8a5b (GroupNormalization's autocast) gated from a checkout of Keras
    itself: the TensorFlow zygote imports the installed ``keras`` with its framework, so every
    worker forked from it ran the installed layers, head and base alike; the revert passed on
    identical outputs. A library whose top-level package the zygote imported from elsewhere gets
    fresh workers, which import it (and the framework) from the workers' import path. Here the
    zygote's copy doubles, the checkout's triples."""
    import numpy as np

    from gate.backends import isolate
    from gate.search.inputs import draw

    site, lib = tmp_path / "site", tmp_path / "lib"
    for root, factor in ((site, 2), (lib, 3)):  # the installed copy, and the checkout's
        (root / "shadowpkg").mkdir(parents=True)
        (root / "shadowpkg" / "__init__.py").write_text("")
        (root / "shadowpkg" / "ops.py").write_text(f"def double(x):\n    return x * {factor}\n")
    (lib / "heavylib.py").write_text("def double(x):\n    return x * 2\n")
    specs = user_ops(tmp_path, SHADOW_OPS)
    monkeypatch.setitem(isolate.PRELOAD, "torch", (*isolate.PRELOAD["torch"], "shadowpkg"))
    monkeypatch.chdir(site)  # the zygote's import path starts with its directory: the installed copy
    isolate._close_zygotes()
    try:
        options = IsolateOptions(sys_path=(str(lib), *sys.path), cwd=str(lib), start_timeout=180)
        zygote = isolate._zygote(isolate.PRELOAD["torch"], 180)
        assert zygote.where("shadowpkg", 60) == str(site / "shadowpkg" / "__init__.py")
        why = isolate.shadowed(zygote, specs["lib.double"], options)
        assert why and why.startswith(f"shadowpkg is imported from {lib / 'shadowpkg'}"), why
        assert isolate.shadowed(zygote, specs["lib.plain"], options) is None  # not one the zygote imported
        spec = specs["lib.double"]
        runner = build_runner(spec, Variant("float32", "cpu", "input"), isolate=options)
        try:
            assert runner._active.own_log  # a fresh interpreter, not a fork of the zygote
            cand = draw(spec, np.random.default_rng(0))
            _, ev = runner.evaluate(cand, keep_outputs=True)
        finally:
            runner.close()
        assert float(ev.outputs[0].array.ravel()[0] / cand.arrays["x"].ravel()[0]) == pytest.approx(3.0)
    finally:
        isolate._close_zygotes()
