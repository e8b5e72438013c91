"""`dl-gate harvest -- pytest ...` on a real (tiny) project: the calls its tests make are
recorded, bound to the operator's spec, stored beside the baselines, and used by `dl-gate fuzz`."""
import json
import sys

import numpy as np
import pytest

from gate.cli import main
from gate.config import load_config
from gate.search.seeds import SeedStore

CONFIG = """\
version: 1
framework: torch
ops:
  - name: mylib.scaled_tanh
    callable: mylib.ops.scaled_tanh
    kind: activation
    params: {scale: {choices: [1.0, 2.0]}}
    dims: {N: [1, 8], D: [1, 8]}
    inputs: [{name: x, shape: [N, D]}]
"""

OPS = """\
import torch


def scaled_tanh(x, scale=2.0):
    return torch.tanh(x) * scale


def helper(x):
    return scaled_tanh(x, scale=1.0)  # an internal call, through the module's globals
"""

TESTS = """\
import torch

import mylib.ops as ops
from mylib import scaled_tanh


def test_linspace():
    x = torch.linspace(-1, 1, 12).reshape(3, 4)
    assert scaled_tanh(x).shape == (3, 4)


def test_twice_the_same_call():
    x = torch.ones(2, 5)
    ops.scaled_tanh(x, scale=1.0)
    ops.scaled_tanh(x, scale=1.0)


def test_internal_call():
    ops.helper(torch.full((4, 4), 0.5))


def test_other_rank():
    assert scaled_tanh(torch.ones(2, 3, 4)).shape == (2, 3, 4)
"""


@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path / "mylib").mkdir()
    (tmp_path / "mylib" / "__init__.py").write_text("from .ops import scaled_tanh\n")
    (tmp_path / "mylib" / "ops.py").write_text(OPS)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_ops.py").write_text(TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / ".dl-gate.yml").write_text(CONFIG)
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    for name in [m for m in sys.modules if m == "mylib" or m.startswith("mylib.")]:
        del sys.modules[name]


def test_harvest_records_the_calls_of_a_real_pytest_run(project, capsys):
    code = main(["harvest", "--", sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"])
    out = capsys.readouterr().out
    assert code == 0, out
    idx = json.loads((project / "baselines" / "seeds" / "index.json").read_text())
    rows = idx["ops"]["mylib.scaled_tanh"]
    sources = sorted(r["source"] for r in rows)
    assert sources == ["tests/test_ops.py::test_internal_call", "tests/test_ops.py::test_linspace",
                       "tests/test_ops.py::test_twice_the_same_call"]  # the repeat is stored once
    assert "x1: input x has rank 3, the spec 2" in out  # the reason, whole, in the table
    seeds = SeedStore(project / "baselines" / "seeds").harvested(load_config().ops[0])
    by_shape = {tuple(s.arrays["x"].shape): s for s in seeds}
    lin = by_shape[(3, 4)]
    np.testing.assert_allclose(lin.arrays["x"].ravel(), np.linspace(-1, 1, 12), rtol=1e-6)
    # scale left out: replayed with the value the call used, the function's own default
    assert lin.params == {"scale": 2.0} and lin.dims == {"N": 3, "D": 4}
    assert by_shape[(2, 5)].params == {"scale": 1.0}
    assert by_shape[(4, 4)].params == {"scale": 1.0} and np.all(by_shape[(4, 4)].arrays["x"] == 0.5)

    # the gate's fuzzing runs them first
    code = main(["fuzz", "mylib.scaled_tanh", "--dtype", "float32", "--evals", "12", "--json", "f.json",
                 "--save-inputs", "inputs"])
    assert code == 0
    finding = json.loads((project / "f.json").read_text())["findings"][0]
    assert finding["coverage"]["seeds"]["harvested"] == 3
    assert "extra" not in finding["coverage"]["classes"]["keys"]["param:scale"]  # every seed's scale is declared


def test_harvest_works_for_any_python_command_and_reports_its_failure(project, capsys):
    """Not only pytest: any Python process gets the recorder (numpy arrays are tensors too);
    a failing command still leaves the seeds it produced, and fails the step."""
    (project / "mylib" / "npops.py").write_text("import numpy as np\n\n\ndef scaled(x, scale=2.0):\n"
                                                "    return np.tanh(x) * scale\n")
    (project / ".dl-gate.yml").write_text(CONFIG.replace("mylib.scaled_tanh", "mylib.scaled")
                                          .replace("mylib.ops.scaled_tanh", "mylib.npops.scaled"))
    script = "import numpy as np, mylib.npops as m; m.scaled(np.ones((1, 2)), 2.0); raise SystemExit(1)"
    code = main(["harvest", "--out", "seeds", "--", sys.executable, "-c", script])
    captured = capsys.readouterr()
    assert code == 2 and "exited with status 1" in captured.err
    rows = SeedStore(project / "seeds").index()["ops"]["mylib.scaled"]
    assert len(rows) == 1 and rows[0]["params"] == {"scale": "2.0"} and rows[0]["shapes"] == {"x": [1, 2]}


def test_harvest_needs_a_command_and_operators(project, capsys):
    assert main(["harvest"]) == 2
    assert "give the test command after --" in capsys.readouterr().err
    (project / ".dl-gate.yml").write_text("version: 1\n")
    assert main(["harvest", "--", "true"]) == 2
    assert "no operators to record" in capsys.readouterr().err


FUNCTION_OPS = """\
import torch


class Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * x * g


class Power(torch.autograd.Function):
    @classmethod
    def forward(cls, ctx, x, p=3.0, scale=1.0):
        ctx.save_for_backward(x)
        ctx.p = p
        return scale * x ** p

    @classmethod
    def backward(cls, ctx, g):
        (x,) = ctx.saved_tensors
        return g * ctx.p * x ** (ctx.p - 1), None, None


class Cube(Power):  # entmax's SparsemaxBisectFunction(EntmaxBisectFunction): another signature
    @classmethod
    def forward(cls, ctx, x, scale=1.0):
        return super().forward(ctx, x, p=3.0, scale=scale)

    @classmethod
    def backward(cls, ctx, g):
        return super().backward(ctx, g)[0], None


class Scale(torch.nn.Module):
    def __init__(self, k=3.0):
        super().__init__()
        self.k = k

    def forward(self, x):
        return x * self.k


class Plain:
    def __call__(self, x):
        return x


class BigScale(Scale):  # a subclass at import: the class must still be a class
    pass


def square(x):
    return Square.apply(x)  # the library's own call, through the class
"""

FUNCTION_TESTS = """\
import torch

from mylib.fn_ops import BigScale, Cube, Plain, Power, Scale, Square, square


def test_function_apply():
    x = torch.linspace(-1, 1, 6, requires_grad=True)
    square(x).sum().backward()
    assert torch.allclose(x.grad, 2 * x.detach())


def test_a_subclass_function_keeps_its_own_forward():
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    assert torch.equal(Cube.apply(x, 2.0), torch.tensor([2.0, 16.0]))
    assert torch.equal(Power.apply(x, 2.0), torch.tensor([1.0, 4.0]))


def test_module_and_plain_class():
    m = Scale(2.0)
    assert isinstance(m, Scale) and isinstance(BigScale(), Scale) and issubclass(Square, torch.autograd.Function)
    assert m(torch.ones(2, 3)).sum().item() == 12.0 and Plain()(1) == 1
"""

FUNCTION_CONFIG = """\
version: 1
framework: torch
ops:
  - {name: mylib.Square, callable: "mylib.fn_ops:Square", dims: {N: [1, 8]}, inputs: [{name: x, shape: [N]}]}
  - {name: mylib.Power, callable: "mylib.fn_ops:Power", params: {p: {choices: [2.0, 3.0]}}, dims: {N: [1, 4]},
     inputs: [{name: x, shape: [N]}]}
  - {name: mylib.Cube, callable: "mylib.fn_ops:Cube", params: {scale: {choices: [1.0, 2.0]}}, dims: {N: [1, 4]},
     inputs: [{name: x, shape: [N]}]}
  - {name: mylib.Scale, callable: "mylib.fn_ops:Scale", dims: {N: [1, 4], D: [1, 4]}, inputs: [{name: x, shape: [N, D]}]}
  - {name: mylib.Plain, callable: "mylib.fn_ops:Plain", dims: {N: [1, 4]}, inputs: [{name: x, shape: [N]}]}
"""


def test_harvest_of_class_operators_leaves_the_classes_classes(project, capsys):
    """A config names an autograd.Function or a module class as the callable (deep-spin/entmax's
    `callable: entmax.activations:SparsemaxFunction`): the recorder wraps its apply / forward, it
    never replaces the class (the library's own `Cls.apply(x)`, isinstance and subclasses broke,
    and the tests recorded nothing)."""
    (project / "mylib" / "fn_ops.py").write_text(FUNCTION_OPS)
    (project / "tests" / "test_fn_ops.py").write_text(FUNCTION_TESTS)
    (project / ".dl-gate.yml").write_text(FUNCTION_CONFIG)
    code = main(["harvest", "--", sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_fn_ops.py"])
    out = capsys.readouterr().out
    assert code == 0, out  # the library's tests pass under the recorder
    rows = SeedStore(project / "baselines" / "seeds").index()["ops"]
    (square,) = rows["mylib.Square"]  # recorded through the library's Square.apply call
    assert square["shapes"] == {"x": [6]} and square["source"] == "tests/test_fn_ops.py::test_function_apply"
    # a subclass's apply runs its own forward (the test passed), and its call is its own
    # operator's, not its parent's: one recorded call each (the table's "calls" column)
    calls = {ln.split("|")[0].strip(): ln.split("|")[1].strip() for ln in out.splitlines() if ln.startswith("mylib.")}
    assert calls["mylib.Cube"] == "1" and calls["mylib.Power"] == "1", out


def test_a_test_run_killed_at_its_time_limit_keeps_what_it_recorded(project):
    """No exit handler runs in a process killed with SIGKILL (init's test run at its time limit,
    after SIGINT did not stop it: keras-cv's tests, 630 s, recorded nothing). The recorder writes
    its records while new ones come (DL_GATE_HARVEST_FLUSH seconds apart), each file whole. The
    process kills itself once the recorder's file holds its two calls: no clock in the test."""
    import os
    from types import SimpleNamespace

    from gate.search.harvest import load_records, run_harvest

    script = project / "calls_then_dies.py"
    script.write_text(
        "import glob, json, os, signal, time\nimport torch\nimport mylib.ops as ops\n\n"
        "ops.scaled_tanh(torch.ones(2, 3))\nops.scaled_tanh(torch.zeros(4, 1), scale=1.0)\n"
        "out = json.load(open(os.environ['DL_GATE_HARVEST']))['out']\n"
        "for _ in range(1200):  # a bound for a recorder that never writes (the test then fails)\n"
        "    if any(len(json.load(open(f))['records']) == 2 for f in glob.glob(out + '/raw-*.json')):\n"
        "        break\n"
        "    time.sleep(0.1)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n")
    env = dict(os.environ, DL_GATE_HARVEST_FLUSH="0.2", PYTHONPATH=str(project))
    ops = [SimpleNamespace(name="mylib.scaled_tanh", callable="mylib.ops.scaled_tanh")]
    code = run_harvest([sys.executable, str(script)], ops, project / "raw", cwd=project, env=env)
    assert code == -9  # killed: no exit handler ran
    records = [r for r in load_records(project / "raw") if not r.source.startswith("error: ")]
    assert sorted(tuple(r.args[0].shape) for r in records) == [(2, 3), (4, 1)], records
    assert not list((project / "raw" / "records").glob("*.part*"))  # each file replaced whole
