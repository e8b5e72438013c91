"""C++ extension operators (issue 15): a torch.utils.cpp_extension library as a real git
repository (tests/beds/cpp_ext.py), built on head and on base with g++/ninja, cached by source
hash in one directory for the whole session (a build costs ~35 s here; a cached one, none)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gate.backends.build import BuildError, BuildSpec, build_tree, cache_key, first_error, input_files
from gate.errors import ConfigError
from gate.judge.verdict import GateReport
from tests.beds import cpp_ext as C
from tests.helpers.gitrepo import GitRepo
from tests.helpers.repro import run_script

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def build_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("build-cache")


@pytest.fixture
def cached(build_cache, monkeypatch) -> Path:
    monkeypatch.setenv("DL_GATE_BUILD_CACHE", str(build_cache))
    return build_cache


def _lib(path: Path) -> GitRepo:
    repo = GitRepo.init(path)
    repo.write(C.FILES, dedent=False)
    repo.commit("lnext: layer_norm and rms_norm CPU kernels")
    return repo


# -- no compiler needed -------------------------------------------------------------------------
def test_the_first_compiler_error_line_is_found_and_made_relative(tmp_path):
    gcc = (f"In file included from {tmp_path}/csrc/a.h:3,\n"
           f"{tmp_path}/csrc/a.h:7:1: warning: unused\n"
           f"{tmp_path}/csrc/ops.cpp:12:5: error: expected ';' before '}}' token\n"
           f"{tmp_path}/csrc/ops.cpp:20:1: error: later\nninja: build stopped: subcommand failed.\n")
    assert first_error(gcc, tmp_path) == "csrc/ops.cpp:12:5: error: expected ';' before '}' token"
    nvcc = "csrc/k.cu(41): error: identifier \"foo\" is undefined\n1 error detected"
    assert first_error(nvcc) == 'csrc/k.cu(41): error: identifier "foo" is undefined'
    assert first_error("c1xx: fatal error C1083: Cannot open include file").startswith("c1xx: fatal error C1083")
    assert first_error("something went wrong\nTraceback...\nRuntimeError: boom") == "RuntimeError: boom"


def test_the_build_config_is_a_command_or_a_cpp_extension(tmp_path):
    assert BuildSpec.from_config(None, tmp_path) is None
    assert BuildSpec.from_config("pip install -e .", tmp_path).command == "pip install -e ."
    spec = BuildSpec.from_config({"cpp_extension": {"name": "m._C", "sources": ["a.cpp"]}, "cache": "c"}, tmp_path)
    assert spec.cpp_extension["name"] == "m._C" and spec.cache == tmp_path / "c"
    with pytest.raises(ConfigError, match="not both"):
        BuildSpec.from_config({"command": "make", "cpp_extension": {"name": "x", "sources": ["a"]}}, tmp_path)
    with pytest.raises(ConfigError, match="needs a name"):
        BuildSpec.from_config({"cpp_extension": {"name": "x"}}, tmp_path)
    from gate.config import parse_config

    with pytest.raises(ConfigError, match="build"):
        parse_config("build: {command: make, flags: 1}\n")


def test_the_cache_key_follows_the_build_inputs_only(tmp_path):
    repo = _lib(tmp_path / "lib")
    spec = BuildSpec.from_config("python setup.py build_ext --inplace", repo.path)
    assert input_files(repo.path, spec) == ["csrc/layer_norm.cpp", "setup.py"]
    key = cache_key(repo.path, spec)
    (repo.path / "lnext" / "ops.py").write_text(C.OPS + "\n# a comment\n")
    assert cache_key(repo.path, spec) == key  # Python sources are imported, not built
    C.apply_pr(repo.path, "benign")
    assert cache_key(repo.path, spec) != key
    other = BuildSpec.from_config("python setup.py build_ext --inplace --debug", repo.path)
    assert cache_key(repo.path, other) != cache_key(repo.path, spec)


def test_selection_maps_a_changed_cpp_function_through_pybind11_to_the_python_wrapper(tmp_path):
    from gate.config import load_config
    from gate.ops.catalog import load_catalog
    from gate.select import select_ops

    repo = _lib(tmp_path / "lib")
    repo.branch("pr")
    C.apply_pr(repo.path, "one_pass_variance")
    repo.commit("one pass")
    cfg = load_config(repo.path / ".dl-gate.yml")
    sel = select_ops(repo.path, "main", "HEAD", load_catalog(cfg.ops, builtin=()), cfg)
    assert sel.op_names() == ["lnext.layer_norm"]  # rms_norm_forward shares nothing with it
    path = sel.selected[0].reasons[0].path
    assert path[0].endswith("row_moments") and "pybind::layer_norm_forward" in path
    assert path[-2:] == ["lnext.ops:layer_norm", "lnext.layer_norm"]


# -- built with g++ / ninja ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def ln_repo(tmp_path_factory, build_cache) -> Path:
    """``main`` with baselines: the refresh builds the extension (into the shared cache) first."""
    repo = _lib(tmp_path_factory.mktemp("lnext") / "lnext")
    code = "import sys; from gate.cli import main; sys.exit(main(['baseline', 'refresh', '--evals', '40', '--seed', '0']))"
    res = subprocess.run([sys.executable, "-W", "ignore", "-c", code], cwd=repo.path, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "DL_GATE_BUILD_CACHE": str(build_cache)})
    assert res.returncode == 0, res.stderr[-2000:]
    assert "build: built" in res.stdout + res.stderr
    assert list(build_cache.iterdir())  # the build is cached: the gate's base is restored from it
    repo.commit("baselines")
    return repo.path


def _pr(ln_repo: Path, tmp_path: Path, name: str) -> GitRepo:
    dst = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ln_repo), str(dst)], check=True)
    repo = GitRepo(dst)
    repo.branch(f"pr-{name}")
    C.apply_pr(dst, name)
    repo.commit(name)
    return repo


def _gate(repo: Path, out: Path, monkeypatch):
    """A fresh process per run, as the CLI runs: two builds of one extension in one process
    would share its exported symbols (torch loads with RTLD_GLOBAL), the second running the first's code."""
    res = subprocess.run([sys.executable, "-W", "ignore", "-m", "gate.cli", "run", "--base", "main", "--out", str(out),
                          "--evals", "40", "--seed", "0"], cwd=repo, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    report = GateReport.from_dict(json.loads((out / "report.json").read_text()))
    assert report.exit_code == res.returncode, res.stderr[-2000:]
    return res.returncode, report


@pytest.mark.slow
def test_the_planted_one_pass_variance_regression_fails_with_a_repro(ln_repo, tmp_path, cached, monkeypatch):
    repo = _pr(ln_repo, tmp_path, "one_pass_variance")
    code, report = _gate(repo.path, tmp_path / "out", monkeypatch)
    assert (code, report.outcome) == (1, "regression"), report.reason
    assert report.env["build"]["base"]["cached"] is True  # main's build, from the fixture
    assert report.env["build"]["head"]["cached"] is False
    listed = subprocess.run([sys.executable, "-m", "pip", "list"], capture_output=True, text=True).stdout
    assert "lnext" not in listed  # `pip install -e .` built in place, installed nothing here
    by_key = {v.key: v for v in report.verdicts}
    assert {v.op for v in report.verdicts} == {"lnext.layer_norm"}
    # the kernel writes into torch::empty_like through data_ptr: nothing for autograd, so the
    # default gradient variant does not apply (unsupported, not a gradient of zero)
    grad = by_key.pop("float32/cpu/input/grad")
    assert grad.outcome == "unsupported" and "requires grad" in grad.reason, grad.reason
    # the kernel's own layout (x.contiguous() first) and the plain one both fail
    assert set(by_key) == {"float32/cpu/input", "float32/cpu/input/noncontiguous"}
    assert {v.outcome for v in by_key.values()} == {"regression"}, [(v.id, v.reason) for v in by_key.values()]
    v = by_key["float32/cpu/input"]
    # the squared sum overflows (NaN where base is finite) or cancels (error far above base's)
    assert "new NaN/Inf" in v.reason or "ulp >" in v.reason, v.reason
    assert v.diagnosis["changed_code"][0]["symbol"] == "row_moments"
    # localisation's base worker runs base's own build too (restored from the cache)
    status = next(r for r in v.diagnosis["base_vs_head"] if r["name"] == "status")
    assert status == {"name": "status", "base": "ok", "head": "ok"}, v.diagnosis["base_vs_head"]
    script = v.diagnosis["repro_script"]
    res = run_script([script], ignore_warnings=True)
    assert res.returncode == 1, res.stdout + res.stderr


@pytest.mark.slow
def test_a_benign_change_to_the_extension_passes(ln_repo, tmp_path, cached, monkeypatch):
    repo = _pr(ln_repo, tmp_path, "benign")
    code, report = _gate(repo.path, tmp_path / "out", monkeypatch)
    assert [s["op"] for s in report.selected] == ["lnext.layer_norm"]
    assert (code, report.outcome) == (0, "pass"), [(v.id, v.outcome, v.reason) for v in report.verdicts]


@pytest.mark.slow
def test_a_head_that_does_not_compile_is_an_error_naming_the_first_compiler_error(ln_repo, tmp_path, cached,
                                                                                   monkeypatch):
    repo = _pr(ln_repo, tmp_path, "broken")
    code, report = _gate(repo.path, tmp_path / "out", monkeypatch)
    assert report.outcome == "error" and code != 0
    assert report.reason.startswith("build failed on head (exit 1): csrc/layer_norm.cpp:")
    # g++ "fatal error: ATen/Dispach.h: No such file or directory", clang "fatal error: 'ATen/Dispach.h' file not found"
    assert "fatal error" in report.reason and "Dispach.h" in report.reason, report.reason
    assert Path(report.env["build"]["head"]["log"]).is_file()
    spec = BuildSpec.from_config("pip install -e .", repo.path)
    assert not (cached / cache_key(repo.path, spec)).exists()  # a failure is never cached: the next run builds again


MINI_C = r'''#include <Python.h>

static PyObject* twice(PyObject* self, PyObject* arg) {
  double v = PyFloat_AsDouble(arg);
  if (v == -1.0 && PyErr_Occurred()) return NULL;
  return PyFloat_FromDouble(2.0 * v);
}

static PyMethodDef methods[] = {{"twice", twice, METH_O, "2 x"}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "_C", NULL, -1, methods};
PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&mod); }
'''


def test_a_cpp_extension_is_built_into_its_package_and_restored_from_the_cache(tmp_path, monkeypatch):
    """The ``cpp_extension`` recipe (torch.utils.cpp_extension.load), on a source that needs only
    Python.h (seconds to compile): built once, placed as ``mini/_C*.so``, then restored."""
    repo = GitRepo.init(tmp_path / "mini")
    repo.write({"mini/__init__.py": "", "csrc/mini.cpp": MINI_C}, dedent=False)
    repo.commit("mini")
    spec = BuildSpec.from_config({"cpp_extension": {"name": "mini._C", "sources": ["csrc/mini.cpp"]},
                                  "cache": str(tmp_path / "cache")}, repo.path)
    first = build_tree(repo.path, spec, "head")
    assert not first.cached and len(first.files) == 1 and first.files[0].startswith("mini/_C")
    check = [sys.executable, "-c", "import mini._C as c; assert c.twice(1.5) == 3.0"]
    assert subprocess.run(check, cwd=repo.path).returncode == 0
    (repo.path / first.files[0]).unlink()
    again = build_tree(repo.path, spec, "head")
    assert again.cached and again.files == first.files and again.key == first.key
    assert subprocess.run(check, cwd=repo.path).returncode == 0
    (repo.path / "csrc/mini.cpp").write_text(MINI_C.replace("return NULL;", "return NULL"))
    with pytest.raises(BuildError, match=r"build failed on head .*csrc/mini\.cpp:\d+:\d+: error"):
        build_tree(repo.path, spec, "head")


def test_pybind11_module_definitions_are_registrations_of_the_functions_they_bind():
    from gate.changes.cpp import CppFile

    src = b'''#include <torch/extension.h>
namespace ops { torch::Tensor fwd(torch::Tensor x); torch::Tensor bwd(torch::Tensor g); }
torch::Tensor helper(torch::Tensor x, int k);
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &ops::fwd, "forward");
  m.def("backward", ops::bwd);
  m.def("scaled", py::overload_cast<torch::Tensor, int>(&helper), py::arg("x"), py::arg("k") = 2);
  m.def("lambda_op", [](torch::Tensor x) { return helper(x, 3); });
  m.attr("version") = "1";
}
'''
    regs = {r.ops[0]: (r.kind, r.names, r.start) for r in CppFile("csrc/ops.cpp", src).registrations}
    assert regs == {"pybind::forward": ("pybind_def", ["fwd"], 5), "pybind::backward": ("pybind_def", ["bwd"], 6),
                    "pybind::scaled": ("pybind_def", ["helper"], 7),
                    "pybind::lambda_op": ("pybind_def", ["helper"], 8)}
