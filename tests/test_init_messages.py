"""What init and refresh say when a library's environment is not the one it needs (acceptance
runs on larq and kornia): each message names what to do."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest

from gate.init.worker import _import_error
from gate.search.harvest import load_records
from tests.test_gate_run import CONFIG, make_repo


def test_keras2_code_under_keras3_gets_the_legacy_keras_hint(monkeypatch):
    # larq: "module 'keras._tf_keras.keras.layers' has no attribute 'LocallyConnected1D'"
    monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)
    err = AttributeError("module 'keras._tf_keras.keras.layers' has no attribute 'LocallyConnected1D'")
    hint = _import_error(err, "larq.layers")["hint"]
    assert "TF_USE_LEGACY_KERAS=1" in hint and "--env" in hint, hint
    assert _import_error(AttributeError("module 'numpy' has no attribute 'float'"), "x")["hint"] == ""


def test_a_missing_module_names_the_distribution_pip_installs():
    # tensorflow/model-remediation (acceptance run): tensorflow_hub imports pkg_resources, which
    # setuptools 81 dropped; "pip install pkg_resources" was the advice
    err = ModuleNotFoundError("No module named 'pkg_resources'", name="pkg_resources")
    assert "`pip install 'setuptools<81'`" in _import_error(err, "tensorflow_model_remediation")["hint"]
    err = ModuleNotFoundError("No module named 'cv2'", name="cv2")
    assert "`pip install opencv-python`" in _import_error(err, "lib")["hint"]
    err = ModuleNotFoundError("No module named 'einops.layers'", name="einops.layers")
    assert "`pip install einops`" in _import_error(err, "lib")["hint"]  # the same name: as before


def test_a_child_that_died_of_two_llvms_gets_the_backend_hint():
    # keras's torch backend (acceptance run): "the child process died (exit -6): LLVM ERROR: Option
    # 'bitcode-mdindex-threshold' registered more than once!" read "make it importable from the
    # repository root", a wrong lead; KERAS_BACKEND=torch was the answer
    from gate.init import _died_hint

    hint = _died_hint("the child process died (exit -6): LLVM ERROR: Option 'bitcode-mdindex-threshold' "
                      "registered more than once!")
    assert "--env KERAS_BACKEND=torch" in hint, hint
    assert _died_hint("the child process died (exit -11): Segmentation fault") == ""


def test_a_torn_record_file_loses_its_own_calls_only(tmp_path):
    # kornia's test_hd killed a recording process mid-write: init died on a JSONDecodeError
    rec = tmp_path / "records"
    rec.mkdir()
    (rec / "raw-1.json").write_text('{"records": [{"op": "lib.f", "args": [{"t": "arr", "k')
    (rec / "raw-2.json").write_text(json.dumps({"records": [{"op": "lib.g", "args": [], "kwargs": {},
                                                             "source": "tests/test_g.py::test_g"}]}))
    np.savez(rec / "raw-2.npz", unused=np.zeros(1))
    out = load_records(tmp_path)
    assert [r.op for r in out if not r.source.startswith("error: ")] == ["lib.g"]
    assert any("unreadable record file raw-1.json" in r.source for r in out)


def test_refresh_names_a_config_env_variable_that_is_not_set(tmp_path, monkeypatch):
    monkeypatch.delenv("DL_GATE_TEST_UNSET_VAR", raising=False)
    repo = make_repo(tmp_path, config=CONFIG + "env: [DL_GATE_TEST_UNSET_VAR]\n", baselines=False)
    res = subprocess.run([sys.executable, "-m", "gate.cli", "baseline", "refresh", "--evals", "3", "--ops",
                          "mylib.log1p"], cwd=repo, capture_output=True, text=True, timeout=600)
    out = res.stdout + res.stderr
    assert "env: names DL_GATE_TEST_UNSET_VAR, not set in this environment" in out, out[-2000:]


ENV_OPS = """
import os

import torch


def scaled(x):
    # as a library whose tests pick the device from the environment (pytorch-metric-learning's
    # TEST_DEVICE): without the variable the operator raises
    return torch.log1p(torch.exp(x)).to(os.environ["DL_GATE_TEST_DEVICE"])
"""

ENV_CONFIG = CONFIG.replace("name: mylib.log1p", "name: mylib.scaled").replace("mylib.ops:log1p_op", "mylib.ops:scaled")


def test_the_configs_env_values_reach_the_workers_without_an_export(tmp_path, monkeypatch):
    # pytorch-metric-learning in the zero-config acceptance: `init --env TEST_DEVICE=cpu` recorded
    # the name only, and every refresh warned until the user exported it. A value in the config
    # is the workers' where the job sets none; a name with null still takes the job's
    monkeypatch.delenv("DL_GATE_TEST_DEVICE", raising=False)
    monkeypatch.delenv("DL_GATE_TEST_UNSET_VAR", raising=False)
    assert "mylib.ops:scaled" in ENV_CONFIG
    config = ENV_CONFIG + "env: {DL_GATE_TEST_DEVICE: cpu, DL_GATE_TEST_UNSET_VAR: null}\n"
    repo = make_repo(tmp_path, ENV_OPS, config=config, baselines=False)
    res = subprocess.run([sys.executable, "-m", "gate.cli", "baseline", "refresh", "--evals", "3", "--ops",
                          "mylib.scaled", "--dtype", "float32"], cwd=repo, capture_output=True, text=True, timeout=600)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-2000:]
    assert "env: names DL_GATE_TEST_UNSET_VAR, not set in this environment" in out, out[-2000:]
    assert "DL_GATE_TEST_DEVICE" not in out.split("not set")[0].splitlines()[-1], out[-2000:]
    # the gate's own process is not given the value (its git and compiler runs see the job's only)
    from gate.backends import sandbox
    from gate.config import load_config

    cfg = load_config(repo / ".dl-gate.yml")
    assert sandbox.env_values(cfg.raw["env"]) == {"DL_GATE_TEST_DEVICE": "cpu"}
    import os

    sandbox.allow(cfg.raw["env"])  # what Config.activate does in a run
    try:
        assert "DL_GATE_TEST_DEVICE" not in os.environ
        assert sandbox.worker_env()["DL_GATE_TEST_DEVICE"] == "cpu"
        assert sandbox.worker_env(source={"DL_GATE_TEST_DEVICE": "cuda"})["DL_GATE_TEST_DEVICE"] == "cuda"  # the job's wins
    finally:
        sandbox.allow([])


def test_a_collection_error_that_stopped_the_users_test_command_is_named_with_what_to_do(tmp_path):
    # tensorflow/recommenders (acceptance run): one test module fails to import under NumPy 2
    # (np.str); `--tests "pytest -q ..."` without --continue-on-collection-errors ran no test,
    # and init hinted at an environment variable
    from gate.init import _collection_stop

    (tmp_path / "test_ok.py").write_text("def test_ok():\n    assert True\n")
    (tmp_path / "test_old.py").write_text("import numpy as np\nX = np.str\n\ndef test_old():\n    pass\n")
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "."],
                         cwd=tmp_path, capture_output=True, text=True).stdout
    assert _collection_stop(out) == "test_old.py", out[-1500:]
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                          "--continue-on-collection-errors", "."], cwd=tmp_path, capture_output=True, text=True).stdout
    assert _collection_stop(out) is None, out[-1500:]


def test_refresh_without_a_config_says_to_run_init(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    res = subprocess.run([sys.executable, "-m", "gate.cli", "baseline", "refresh"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode != 0 and "no .dl-gate.yml here: run `dl-gate init` first" in res.stderr, res.stderr[-1000:]


def test_a_keras_call_error_keeps_its_cause():
    # TFRS's Cross (acceptance run): left out with "InvalidArgumentError: Exception encountered
    # when calling Cross.call()." only; the cause was two lines below, in bold
    from gate.search.evaluation import exception_signature, first_words

    exc = ValueError("Exception encountered when calling Cross.call().\n\n\x1b[1mcannot compute MatMul as input #1"
                     " was expected to be a double tensor but is a float tensor\x1b[0m\n\nArguments received by "
                     "Cross.call():\n  • x0=tf.Tensor(shape=(2, 4), dtype=float64)")
    assert first_words(exc) == ("ValueError: Exception encountered when calling Cross.call(): cannot compute MatMul "
                                "as input #1 was expected to be a double tensor but is a float tensor")
    assert first_words(KeyError("x")) == "KeyError: 'x'" and first_words(RuntimeError()) == "RuntimeError"
    # what an evaluation's error says (a probe's "no inferred spec runs (...; first: ...)"); the
    # signature that tells crashes apart stays the first line
    sig, msg = exception_signature(exc)
    assert sig == "ValueError: Exception encountered when calling Cross.call()." and "double tensor" in msg, (sig, msg)


def test_a_layer_of_a_library_named_tensorflow_something_is_called_through_its_own_call():
    # tensorflow_recommenders' SamplingProbablityCorrection overrides __call__; its module's name
    # starts with "tensorflow", which the first check took for TensorFlow's own classes
    keras = __import__("pytest").importorskip("keras")
    from gate.backends.base import keras_call_method

    ns = {"keras": keras}
    exec("class Correction(keras.layers.Layer):\n    def __call__(self, logits, p):\n        return logits\n"
         "class Plain(keras.layers.Layer):\n    def call(self, x):\n        return x\n", ns)
    for cls in (ns["Correction"], ns["Plain"]):
        cls.__module__ = "tensorflow_recommenders.layers.loss"
    assert keras_call_method(ns["Correction"]) == "__call__" and keras_call_method(ns["Plain"]) == "call"
    assert keras_call_method(keras.layers.Dense) == "call"


def test_init_says_what_the_first_refresh_costs_and_how_to_narrow_a_long_one(monkeypatch):
    from gate.commands.init import refresh_plan

    monkeypatch.setenv("DL_GATE_JOBS", "2")  # a 2-core runner: two operators measured at a time
    assert refresh_plan(22, 10.0) == ("22 operators x 10s, 2 at a time, at least 110s", None)
    assert refresh_plan(1, 10.0) == ("1 operators x 10s, at least 10s", None)  # never more processes than operators
    assert refresh_plan(181, 10.0)[1] is not None and refresh_plan(180, 10.0)[1] is None  # 15 minutes, two at a time
    monkeypatch.setenv("DL_GATE_JOBS", "1")
    assert refresh_plan(22, 10.0) == ("22 operators x 10s, at least 4 min", None)
    assert refresh_plan(3, 10.0) == ("3 operators x 10s, at least 30s", None)
    plan, narrow = refresh_plan(723, 10.0)  # keras as a whole, plain `dl-gate init`
    assert plan == "723 operators x 10s, at least 2.0 h"
    assert "--package PKG.SUB" in narrow and "budget.per_op" in narrow and "--ops NAME" in narrow
    assert refresh_plan(90, 10.0)[1] is None and refresh_plan(91, 10.0)[1] is not None  # 15 minutes


def test_refresh_prints_its_plan_and_each_operators_place(tmp_path, capsys, monkeypatch):

    from gate.cli import main
    from tests.test_gate_run import make_repo

    repo = make_repo(tmp_path, baselines=False)
    monkeypatch.chdir(repo)
    code = main(["baseline", "refresh", "--dtype", "float32", "--mode", "input", "--per-op", "0.5"])
    err = capsys.readouterr().err
    assert code == 0, err
    n = err.count("] measuring ") and len(set(re.findall(r"\[\d+/(\d+)\] measuring", err)))
    total = int(re.search(r"refreshing (\d+) operator\(s\): 0.5s of search each \(budget.per_op\), at least", err).group(1))
    assert n == 1 and f"[{total}/{total}] measuring" in err and "[1/" in err, err


def test_the_methods_of_a_module_class_with_no_forward_are_operators_where_the_tests_call_them(tmp_path, monkeypatch):
    """geoopt's manifolds are nn.Module subclasses with no forward: their operators are methods
    (``norm``, ``inner``, ``expmap``); its revert of 71c7f63 (SPD.norm's NaN gradient at u = 0)
    changed a method that init had left out. A method the tests call is a row of its own
    (``callable: module:Class.method``, the instance built as the tests build it: here with a
    constructor argument), seeded with those calls; one they do not call is listed with why."""

    from gate.cli import main
    from gate.config import load_config

    repo = tmp_path / "repo"
    (repo / "manilib").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "manilib" / "__init__.py").write_text("from .spd import SPD, square, sym\nfrom . import later\n")
    # a function scripted after the recorder wrapped ``sym`` calls it (geoopt's linalg)
    (repo / "manilib" / "later.py").write_text(
        "import torch\n\nfrom .spd import sym\n\n\n@torch.jit.script\ndef twice_sym(x: torch.Tensor):\n"
        "    return 2 * sym(x)\n")
    (repo / "manilib" / "spd.py").write_text(
        "import torch\n\n\n@torch.jit.script\ndef sym(x: torch.Tensor):\n    return 0.5 * (x + x.transpose(-1, -2))\n\n\n"
        "class Manifold(torch.nn.Module):\n    forward = NotImplemented\n\n"
        "    def __init__(self, scale):\n        super().__init__()\n"
        "        self.scale = scale\n\n    def inner(self, x, u):\n        return self.scale * (u * u).sum(-1)\n\n\n"
        "class SPD(Manifold):\n    def norm(self, x, u):\n        return self.inner(x, u).sqrt()\n\n\n"
        "def square(x):\n    return x * x\n\n\nclass Point(torch.Tensor):\n    pass\n")
    (repo / "tests" / "test_spd.py").write_text(
        "import torch\n\nfrom manilib import SPD\nfrom manilib.spd import Point\n\n\ndef test_norm():\n    m = SPD(scale=2.0)\n"
        "    x = torch.eye(3).expand(4, 3, 3).clone().as_subclass(Point)\n    u = torch.rand(4, 3, 3)\n"
        "    assert m.norm(x, u).shape == (4, 3)\n    assert m.inner(x, u).shape == (4, 3)\n\n\n"
        "def test_sym():\n    from manilib.later import twice_sym\n    assert twice_sym(torch.eye(2)).shape == (2, 2)\n")
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    monkeypatch.chdir(repo)
    code = main(["init", "--no-workflows", "--json", "init.json"])
    rep = json.loads((repo / "init.json").read_text())
    assert code == 0, rep
    assert "exited 0" in rep["harvest"], rep["harvest"]  # the recorder left TorchScript alone
    left = dict(rep["left_out"])
    # Manifold.inner, which SPD inherits, is its own operator: the calls through an SPD are SPD.inner's
    assert "no test calls" in left["manilib.Manifold.inner"], left
    assert "--ops manilib.Manifold.inner" in left["manilib.Manifold.inner"]
    rows = {s.name: s for s in load_config(repo / ".dl-gate.yml").ops}
    norm = rows["manilib.SPD.norm"]
    # x is a tensor subclass (geoopt's ManifoldTensor): recorded as a tensor, the row from the tests' calls
    note = dict((n, note) for n, _, note in rep["found"])["manilib.SPD.norm"]
    assert re.search(r"from \d+ test call", note) and "not usable" not in note, note
    assert norm.callable == "manilib.spd:SPD.norm" and dict(norm.construct) == {"scale": 2.0}, norm
    assert [t.name for t in norm.inputs] == ["x", "u"] and "manilib.Manifold.inner" not in rows
    assert re.search(r"from \d+ test call", dict((n, w) for n, _, w in rep["found"])["manilib.SPD.inner"])
    assert list((repo / "baselines" / "seeds").rglob("*")), "the tests' calls are stored as seeds"


def test_a_method_operator_runs_on_an_instance_built_at_the_variants_dtype():
    import torch

    from gate.backends.base import MethodOperator, at_dtype, resolve_callable
    from gate.errors import ConfigError

    fn = resolve_callable("torch.nn.Linear.forward", (("in_features", 3), ("out_features", 2)))
    assert isinstance(fn, MethodOperator) and fn(torch.ones(1, 3)).shape == (1, 2)
    half = at_dtype(fn, "float64")
    assert half(torch.ones(1, 3, dtype=torch.float64)).dtype == torch.float64
    same = at_dtype(fn, "float64")(torch.ones(1, 3, dtype=torch.float64))
    assert torch.equal(same, fn(torch.ones(1, 3)).double()) or torch.allclose(same, fn(torch.ones(1, 3)).double())
    with pytest.raises(ConfigError, match="cannot be built without arguments"):
        resolve_callable("torch.nn.Linear.forward")
    assert resolve_callable("torch.Tensor.add") is torch.Tensor.add  # a builtin's method stays what it is


def test_a_library_that_turns_warnings_into_errors_still_has_its_calls_recorded(tmp_path, monkeypatch):
    """geoopt's pytest configuration has ``filterwarnings = ["error"]``; under a newer torch
    every test module failed to collect on a deprecation warning and init recorded nothing. The
    default test command ignores deprecations (the tests run to record calls)."""

    from gate.cli import main

    repo = tmp_path / "repo"
    (repo / "wlib").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "wlib" / "__init__.py").write_text("from .ops import scaled\n")
    (repo / "wlib" / "ops.py").write_text(
        "import warnings\n\nimport torch\n\nwarnings.warn('old API', DeprecationWarning)\n"
        "warnings.warn('old default', FutureWarning)\n\n\ndef scaled(x, k=3.0):\n    return x * k\n")
    (repo / "tests" / "test_ops.py").write_text(
        "import torch\n\nfrom wlib import scaled\n\n\ndef test_scaled():\n    assert scaled(torch.ones(2, 5)).shape == (2, 5)\n")
    (repo / "pyproject.toml").write_text('[tool.pytest.ini_options]\nfilterwarnings = ["error"]\n')
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    monkeypatch.chdir(repo)
    code = main(["init", "--no-workflows", "--json", "init.json"])
    rep = json.loads((repo / "init.json").read_text())
    assert code == 0 and "-W ignore::DeprecationWarning" in rep["harvest"], rep["harvest"]
    assert rep["tested"] == ["wlib.scaled"], rep["harvest"]
    assert "1 distinct calls of 1 operators recorded" in rep["harvest"], rep["harvest"]


def test_the_methods_no_test_calls_are_one_row_per_class_in_inits_table():
    from gate.init import InitReport

    why = "a method of SPD that no test calls (name it with --ops {} to probe it with small tensors)"
    rep = InitReport(left_out=[("geo.SPD.inner", why.format("geo.SPD.inner")), ("geo.f", "needs a path"),
                               ("geo.SPD.retr", why.format("geo.SPD.retr")),
                               ("geo.Sphere.proj", why.replace("SPD", "Sphere")),
                               ("geo.Sphere.dist", "its constructor needs r and no test constructs it")],
                     uncalled=["geo.SPD.inner", "geo.SPD.retr", "geo.Sphere.proj"])
    assert rep.left_out_table() == [
        ("geo.SPD.{inner, retr}", "methods of SPD that no test calls (--ops geo.SPD.inner probes one with small tensors)"),
        ("geo.f", "needs a path"),
        ("geo.Sphere.proj", "a method of Sphere that no test calls (--ops geo.Sphere.proj probes one with small tensors)"),
        ("geo.Sphere.dist", "its constructor needs r and no test constructs it")]
