import os
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# the end-to-end runs leave the PNG chart out (~0.7 s a run: matplotlib's import and drawing);
# its own tests (tests/test_report_markdown.py) clear this and draw it
os.environ.setdefault("DL_GATE_PLOT", "0")
# a refresh measures one operator per core by default (gate.commands.baseline.refresh_jobs): the
# suite already runs more workers than cores, where a refresh's pool only adds processes that
# import the framework again (~2.5 s of CPU each, ~40 refreshes). One process a refresh here;
# tests/test_refresh_jobs.py runs the pool, by default and by flag
os.environ.setdefault("DL_GATE_JOBS", "1")

# tests import TensorFlow directly, and later tests (torch.export's dynamo path, Triton kernels)
# import Triton: Triton must come first (gate.backends.base.before_tensorflow)
from gate.backends.base import before_tensorflow  # noqa: E402

before_tensorflow()
REPO = Path(__file__).resolve().parent.parent

if os.environ.get("PYTEST_XDIST_WORKER") is None:
    # every end-to-end run starts several Python processes (supervisor, run, zygote, localisation
    # workers) that import the gate from this tree: with PYTHONDONTWRITEBYTECODE set (CI images
    # often set it) each compiled the gate's sources again, ~0.15 s a process. Written once here
    # (timestamped .pyc files, rewritten when a source changes).
    import compileall

    compileall.compile_dir(str(REPO / "gate"), quiet=1)
    # the compiled loops (scoring, rounding, band counts, random numbers) compiled once into
    # Numba's on-disk cache (~6 s), so that the zygotes and the gate's processes load them
    # instead of each compiling them
    from gate.oracles.registry import warm_kernels

    warm_kernels()


def _rewritten_tests_once(config) -> None:
    """pytest rewrites each test module's asserts when it imports it, and caches the result next
    to the module only where bytecode may be written: with PYTHONDONTWRITEBYTECODE set (CI
    images, this machine) every xdist worker rewrote all ~100 test modules at its collection
    (collecting the suite: 4.0 s without the cached rewrite, 1.8 s with it, measured 2026-12-02).
    Written once here, by the process that starts
    the workers (pytest reads a cached rewrite whatever PYTHONDONTWRITEBYTECODE says; the cache
    is keyed by the source's hash). Through pytest's own rewriting functions: where they are
    not there (another pytest), each worker rewrites as before."""
    if not sys.dont_write_bytecode or config.getoption("assertmode", "rewrite") != "rewrite":
        return
    try:
        from _pytest.assertion import AssertionState, rewrite
    except ImportError:  # pragma: no cover - another pytest's internals
        return
    needed = ("_rewrite_test", "_write_pyc", "_read_pyc", "get_cache_dir", "PYC_TAIL")
    if not all(hasattr(rewrite, n) for n in needed):  # pragma: no cover - another pytest's internals
        return
    state = AssertionState(config, "rewrite")
    here = Path(__file__).resolve().parent
    for fn in sorted(here.glob("test_*.py")) + [here / "conftest.py"]:
        cache_dir = rewrite.get_cache_dir(fn)
        pyc = cache_dir / (fn.name[:-3] + rewrite.PYC_TAIL)
        if rewrite._read_pyc(fn, pyc) is not None:
            continue
        try:
            cache_dir.mkdir(parents=True, exist_ok=True)
            source_hash, co = rewrite._rewrite_test(fn, config)
            rewrite._write_pyc(state, co, source_hash, pyc)
        except (OSError, SyntaxError):  # a read-only tree, a module that does not parse: its worker says so
            continue


def pytest_configure(config):
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        _rewritten_tests_once(config)


def _zygote_server() -> None:
    """Warm zygote servers (gate.backends.isolate.SERVER_ENV), one for torch and one for
    TensorFlow, started once by the process that starts the suite (xdist's controller, whose
    environment its workers inherit): each gate run of the suite forks its zygote from one of
    them instead of importing its framework anew (~2.5 s of CPU for torch, ~6 s for TensorFlow,
    a run on this machine). They run in the environment the gate gives its workers as this
    process sees it now; a test that changes that environment (a thread count, a variable a
    worker must not see) gets a zygote of its own, as a run outside the suite does."""
    if os.environ.get("DL_GATE_ZYGOTE_SERVER") or os.environ.get("DL_GATE_NO_ZYGOTE_SERVER"):
        return
    import atexit
    import subprocess
    import tempfile
    import time

    from gate.backends.sandbox import SERVER_ENV, worker_env

    where = tempfile.mkdtemp(prefix="dl-gate-zs-")
    procs, entries = [], []
    import importlib.util

    # TensorFlow's only where it is installed (a torch-only checkout, `pip install -e '.[torch]'`)
    for framework in ("torch", "tensorflow")[:2 if importlib.util.find_spec("tensorflow") else 1]:
        path = os.path.join(where, framework)
        procs.append(subprocess.Popen([sys.executable, "-m", "gate.backends.isolate", "--zygote-server", path,
                                       framework], env=worker_env(), cwd=str(REPO), stdin=subprocess.DEVNULL,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        entries.append(f"{framework}={path}")
    os.environ[SERVER_ENV] = os.pathsep.join(entries)
    torch_path = os.path.join(where, "torch")
    for _ in range(1200):  # until torch's listens: the first run's zygote comes from it too
        if os.path.exists(torch_path) or procs[0].poll() is not None:
            break
        time.sleep(0.05)  # TensorFlow's comes later: a run before it has a zygote of its own

    @atexit.register
    def _stop() -> None:
        for proc in procs:
            proc.kill()
            proc.wait()



@pytest.fixture
def no_zygote_server(monkeypatch):
    """The gate's runs without the suite's zygote server, as a user's run is: for the tests of
    what the supervisor contains (a detached process an operator leaves behind is found by the
    run's tree or by the run's mark in its environment; a zygote forked from the server is
    neither: the server is a child of the test process, and its forks keep the server's initial
    environment block)."""
    from gate.backends import isolate
    from gate.backends.sandbox import SERVER_ENV

    monkeypatch.delenv(SERVER_ENV, raising=False)
    isolate._close_zygotes()  # a served zygote this process holds (an in-process run)
    yield
    isolate._close_zygotes()


@pytest.fixture(scope="session", autouse=True)
def zygote_server():
    """A process that runs tests with no servers in its environment (one whose starter did not
    start them) starts its own."""
    _zygote_server()
    yield


def _action_remote() -> None:
    """A local stand-in for the Action's repository (github.com/dl-gate/dl-gate) with a moving
    major tag: `dl-gate init` pins the workflows it writes by the tag's commit, read with git
    ls-remote; no test reaches the network for it."""
    if os.environ.get("DL_GATE_ACTION_URL"):
        return
    import subprocess
    import tempfile

    from gate.init.workflows import major_tag

    root = Path(tempfile.mkdtemp(prefix="dl-gate-action-"))
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    for cmd in (["git", "init", "-q", "-b", "main", str(root)],
                ["git", "-C", str(root), "commit", "-q", "--allow-empty", "-m", "release"],
                ["git", "-C", str(root), "tag", "-a", "-m", "release", major_tag()]):
        subprocess.run(cmd, check=True, env=env, capture_output=True)
    sha = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                         check=True).stdout.strip()
    os.environ["DL_GATE_ACTION_URL"] = str(root)
    os.environ["DL_GATE_TEST_ACTION_SHA"] = sha


_action_remote()
if os.environ.get("PYTEST_XDIST_WORKER") is None:
    # after the kernels' cache is written and the environment is set (above): the servers load
    # the kernels from the cache, and serve a client only in their own environment
    _zygote_server()


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # pragma: no cover
        return False


#: test files whose tests run real PRs through the gate end to end (a supervisor, a run process,
#: isolated workers, a base worktree, localisation), or C++/Triton beds: the "slow" tests the inner
#: loop (`pytest -m "not slow"`, docs/contributing.md) leaves out; tests elsewhere may be marked
#: slow one by one
SLOW_FILES = frozenset(f"test_{n}.py" for n in (
    "verdict_bed", "redteam", "containment", "kernels_triton", "input_bed", "gate_run", "stability_bed",
    "gate_verdict_rules", "default_inputs", "grad_probe", "localise", "contrast_search", "mixed_inputs",
    "robust_inputs", "oracles_gate_run", "zero_results", "false_alarms_docs", "false_alarms_refactor",
    "false_alarms_improve", "keras_layer_class", "refactor_bed", "keras_mixed_bed", "size_reach_bed", "upcast_bed",
    "method_bed"))
#: ...except one end-to-end run, so that the inner loop covers gate.pipeline and gate.supervise too
FAST_END_TO_END = frozenset({"test_real_regressions_fail[precision-mylib.log1p-ulp >]"})


#: the longest files first (per-file totals of a full run): with --no-loadscope-reorder
#: (pyproject's addopts) the workers take files in collection order, so the long beds start first
#: and the short files fill in at the end (xdist's default order, most tests first, would leave a
#: file of a few long tests running alone at the end while the other worker idles)
LONGEST_FIRST = tuple(f"test_{n}.py" for n in (  # by their test time in a full run (--dist loadfile, 2026-12-01)
    "init", "kernels_cpp", "kernels_triton", "verdict_bed", "init_callable_class", "redteam", "refactor_bed",
    "gate_run", "init_constructions", "oracles_isolation", "keras_mixed_bed", "stability_bed", "threads", "example",
    "closer_bed", "containment", "localise", "tensor_subclass", "exhaustive", "input_bed", "size_reach_bed",
    "init_messages", "upcast_bed", "keras_layer_class", "gate_verdict_rules", "grad_probe", "default_inputs",
    "localise_units", "method_bed", "cli_core", "action", "init_narrow", "false_alarms_improve",
    "false_alarms_refactor", "search_harvest", "false_alarms_docs", "structure_probe", "contrast_search",
    "oracles_gate_run", "core_fuzz", "seeded_construction", "workflows"))


@pytest.hookimpl(optionalhook=True)  # without pytest-xdist (-p no:xdist) the hook is not there
def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (pyproject's addopts): two workers more than the cores this process may use.
    The end-to-end tests spend part of their time waiting, not computing (a hang's deadline, a
    worker's time limit, processes starting, a compiler's output, a gate run's judge waiting for
    its workers and they for it): on the 2-core machine the suite's CPU time was 77% of two
    cores' wall time with two workers; a third filled part of those waits (772 -> 677 s,
    2026-11-29, the same tree, idle), and still left 22% (user+sys 1157 s over 746 s, each
    worker busy to the end: a per-test timeline showed the three within 4 s of each other); a
    fourth: 746-768 s -> 699 s (2026-11-30, the same tree, idle; one earlier pair had read 695 vs
    753 s the other way, before TensorFlow's zygotes were served and its import left out of
    collection)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    return cores + 2


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's own order is kept
    slow = pytest.mark.slow
    for item in items:
        if item.path.name in SLOW_FILES and item.name not in FAST_END_TO_END:
            item.add_marker(slow)
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (none on this machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def user_lib(tmp_path, monkeypatch):
    """Write a throw-away operator module and return (module_name, write_config)."""

    def make(source: str, config: str, name: str = "") -> Path:
        mod = name or f"planted_{uuid.uuid4().hex[:8]}"
        (tmp_path / f"{mod}.py").write_text(textwrap.dedent(source))
        cfg = tmp_path / ".dl-gate.yml"
        cfg.write_text(textwrap.dedent(config).replace("MODULE", mod))
        return cfg

    yield make
    for k in [k for k in sys.modules if k.startswith("planted_")]:
        sys.modules.pop(k, None)
    sys.path[:] = [p for p in sys.path if not p.startswith(str(tmp_path))]
