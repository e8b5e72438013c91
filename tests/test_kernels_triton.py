"""Triton operators (issue 15): a kernel library as a real git repository (tests/beds/triton_lib.py),
pull requests that plant real kernel bugs, the gate run on each. On CPU the kernels run in the
Triton interpreter (~10 ms a launch), so shapes are small and budgets are ``--evals``."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

from gate.backends.triton_support import COMPILED, INTERPRETER, TritonRun, choose_mode
from gate.changes.git import Git
from gate.changes.pyindex import PyIndex
from gate.cli import main
from gate.errors import SetupError
from gate.judge.verdict import GateReport
from gate.select.kernels import launched_kernels, triton_kernels
from tests.beds import triton_lib as T
from tests.helpers.gitrepo import GitRepo
from tests.helpers.repro import run_script

needs_triton = pytest.mark.skipif(find_spec("triton") is None, reason="triton is not installed")
ROOT = Path(__file__).resolve().parent.parent


def _refresh(repo: Path) -> None:
    code = "import sys; from gate.cli import main; sys.exit(main(['baseline', 'refresh', '--evals', '20', '--seed', '0']))"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TRITON_INTERPRET", None)  # the command decides on its own (no CUDA here: the interpreter)
    res = subprocess.run([sys.executable, "-W", "ignore", "-c", code], cwd=repo, capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr[-2000:]


@pytest.fixture(scope="module")
def tk_repo(tmp_path_factory) -> Path:
    """``main``: the kernel library and its config, then its baselines (one refresh for the module)."""
    repo = GitRepo.init(tmp_path_factory.mktemp("tk") / "tk")
    repo.write(T.FILES, dedent=False)
    repo.commit("tk: softmax, rms_norm, layer_norm kernels")
    _refresh(repo.path)
    repo.commit("baselines")
    return repo.path


def _pr(tk_repo: Path, tmp_path: Path, name: str) -> GitRepo:
    dst = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(tk_repo), str(dst)], check=True)
    repo = GitRepo(dst)
    repo.git("config", "commit.gpgsign", "false")
    repo.branch(f"pr-{name}")
    T.apply_pr(dst, name)
    repo.commit(name)
    return repo


def _gate(repo: Path, out: Path, monkeypatch, evals: int = 20):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # restored after the test
    monkeypatch.chdir(repo)
    code = main(["run", "--base", "main", "--out", str(out), "--evals", str(evals), "--seed", "0"])
    report = GateReport.from_dict(json.loads((out / "report.json").read_text()))
    assert report.exit_code == code
    return code, report


# -- modes and static analysis: no kernel runs ---------------------------------------------
def test_mode_is_compiled_on_cuda_and_the_interpreter_elsewhere():
    assert choose_mode(True, {}) == COMPILED
    assert choose_mode(False, {}) == INTERPRETER
    assert choose_mode(True, {"TRITON_INTERPRET": "1"}) == INTERPRETER  # the user asked for it
    assert choose_mode(True, {"DL_GATE_TRITON": "interpreter"}) == INTERPRETER
    with pytest.raises(SetupError, match="no CUDA device"):
        choose_mode(False, {"DL_GATE_TRITON": "compiled"})
    with pytest.raises(SetupError, match="use interpreter or compiled"):
        choose_mode(False, {"DL_GATE_TRITON": "gpu"})


def test_a_triton_operator_runs_on_the_device_of_its_kernels_in_input_mode():
    from gate.ops.catalog import load_catalog
    from gate.config import parse_config

    cfg = parse_config(T.CONFIG)
    spec = load_catalog(cfg.ops, builtin=()).get("tk.softmax")
    assert set(spec.devices) == {"cpu", "cuda"}
    cpu = TritonRun(INTERPRETER, "3", {"tk.softmax": ["tk.softmax:_softmax_kernel"]})
    gpu = TritonRun(COMPILED, "3", {"tk.softmax": ["tk.softmax:_softmax_kernel"]})
    assert cpu.adjust(spec).devices == ("cpu",) and cpu.adjust(spec).modes == ("input",)
    assert gpu.adjust(spec).devices == ("cuda",)
    assert cpu.warnings(["tk.softmax"]) and "interpreter" in cpu.warnings(["tk.softmax"])[0]
    assert gpu.warnings(["tk.softmax"]) == [] and cpu.warnings(["tk.other"]) == []


def test_kernels_are_found_by_their_decorators_and_reached_from_the_wrappers_that_launch_them(tmp_path):
    repo = GitRepo.init(tmp_path / "lib")
    repo.write({**T.FILES, "tk/other.py": (
        "import numba\nfrom triton import jit\n\n\n@numba.jit\ndef not_triton(x):\n    return x\n\n\n"
        "@jit\ndef bare(X):\n    pass\n\n\ndef launch(x):\n    bare[(1,)](x)\n    return not_triton(x)\n")},
        dedent=False)
    rev = repo.commit("lib")
    index = PyIndex(Git(repo.path), rev, [""])
    kernels = triton_kernels(index)
    assert set(kernels) == {"tk.softmax:_softmax_kernel", "tk.rms_norm:_rms_norm_fwd_kernel",
                            "tk.layer_norm:_layer_norm_fwd_kernel", "tk.other:bare"}
    assert launched_kernels(index, "tk.layer_norm:layer_norm", kernels) == ["tk.layer_norm:_layer_norm_fwd_kernel"]
    assert launched_kernels(index, "tk:softmax", kernels) == ["tk.softmax:_softmax_kernel"]  # through the re-export
    assert launched_kernels(index, "tk.reference:softmax", kernels) == []
    assert launched_kernels(index, "tk.other:launch", kernels) == ["tk.other:bare"]


@needs_triton
def test_selection_follows_a_changed_kernel_to_the_wrapper_that_launches_it(tk_repo, tmp_path):
    from gate.config import load_config
    from gate.ops.catalog import load_catalog
    from gate.select import select_ops

    repo = _pr(tk_repo, tmp_path, "tail_mask")
    cfg = load_config(repo.path / ".dl-gate.yml")
    sel = select_ops(repo.path, "main", "HEAD", load_catalog(cfg.ops, builtin=()), cfg)
    assert sel.op_names() == ["tk.layer_norm"]
    reason = sel.selected[0].reasons[0]
    assert reason.symbol == "tk.layer_norm:_layer_norm_fwd_kernel"
    assert reason.path == ["tk.layer_norm:_layer_norm_fwd_kernel", "tk.layer_norm:layer_norm", "tk.layer_norm"]


# -- the pull requests ----------------------------------------------------------------------
NC, GRAD = "float32/cpu/input/noncontiguous", "float32/cpu/input/grad"


@needs_triton
@pytest.mark.parametrize("pr,op,kernel,failing,passing,why", [
    ("fp16_accumulate", "tk.rms_norm", "_rms_norm_fwd_kernel", {"float16/cpu/input"}, {"float32/cpu/input", NC}, "error"),
    ("tail_mask", "tk.layer_norm", "_layer_norm_fwd_kernel", {"float16/cpu/input", "float32/cpu/input", NC}, set(),
     "error"),
    ("no_max_shift", "tk.softmax", "_softmax_kernel", {"float16/cpu/input", "float32/cpu/input", NC}, set(), "NaN/Inf"),
])
def test_a_kernel_regression_fails_names_the_kernel_and_reproduces(tk_repo, tmp_path, monkeypatch, pr, op, kernel,
                                                                   failing, passing, why):
    repo = _pr(tk_repo, tmp_path, pr)
    code, report = _gate(repo.path, tmp_path / "out", monkeypatch)
    assert (code, report.outcome) == (1, "regression"), report.reason
    assert [s["op"] for s in report.selected] == [op]
    by_key = {v.key: v for v in report.verdicts}
    # cpu only, input mode only (the interpreter); a non-contiguous variant (the wrapper's
    # .contiguous() is what a kernel's strides rely on); no gradient: the kernels are launched
    # outside autograd, so the default gradient variant does not apply (not a gradient of zero)
    assert set(by_key) == failing | passing | {GRAD}
    assert by_key[GRAD].outcome == "unsupported" and "requires grad" in by_key[GRAD].reason, by_key[GRAD].reason
    for key in failing:
        v = by_key[key]
        assert v.outcome == "regression" and why in v.reason, (key, v.reason)
        assert v.details["triton"] == {"mode": "interpreter", "kernels": [f"{op}:{kernel}"]}
        d = v.diagnosis
        assert [c["symbol"] for c in d["changed_code"]][:1] == [kernel]  # localisation names the kernel
    for key in passing:
        assert by_key[key].outcome == "pass", by_key[key].reason
    assert report.env["triton"]["mode"] == "interpreter"
    assert any("Triton interpreter" in w and kernel in w for w in report.warnings)
    # the repro script reproduces on head, in a fresh interpreter, without TRITON_INTERPRET set
    key = sorted(failing)[0]
    script = by_key[key].diagnosis["repro_script"]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = run_script([script], env=env, ignore_warnings=True)
    assert res.returncode == 1, res.stdout + res.stderr


@needs_triton
def test_a_benign_kernel_refactor_passes(tk_repo, tmp_path, monkeypatch):
    repo = _pr(tk_repo, tmp_path, "refactor")
    code, report = _gate(repo.path, tmp_path / "out", monkeypatch)
    assert [s["op"] for s in report.selected] == ["tk.softmax"]
    assert (code, report.outcome) == (0, "pass"), [(v.id, v.outcome, v.reason) for v in report.verdicts]
    assert {v.key for v in report.verdicts} == {"float16/cpu/input", "float32/cpu/input", NC, GRAD}


# -- on a GPU runner: compiled kernels --------------------------------------------------------
@needs_triton
@pytest.mark.gpu
def test_on_cuda_the_kernels_run_compiled_and_the_regression_still_fails(tk_repo, tmp_path, monkeypatch):
    repo = _pr(tk_repo, tmp_path, "no_max_shift")
    code, report = _gate(repo.path, tmp_path / "out", monkeypatch)
    assert report.env["triton"]["mode"] == "compiled"
    assert {v.variant["device"] for v in report.verdicts} == {"cuda"}
    assert (code, report.outcome) == (1, "regression"), report.reason
    assert not any("Triton interpreter" in w for w in report.warnings)


@needs_triton
def test_tensorflow_and_triton_load_in_one_process():
    # both bundle LLVM: Triton imported after TensorFlow aborts the process ("LLVM ERROR:
    # inconsistency in registered CommandLine options"); the TensorFlow backend loads Triton first
    pytest.importorskip("tensorflow")
    code = ("from gate.backends import get_backend\nget_backend('tensorflow')\nimport triton\nimport torch\n"
            "print(torch.compile(lambda x: x + 1, backend='eager')(torch.zeros(2)).tolist())")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(Path(__file__).parents[1]))
    assert res.returncode == 0 and "[1.0, 1.0]" in res.stdout, res.stderr[-2000:]
