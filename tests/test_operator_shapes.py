"""Operators that are not plain functions of tensors (found by acceptance testing): classes,
dict outputs, and calls that give nothing to compare must never read as a clean pass."""
import inspect
import sys
import textwrap
import uuid

import numpy as np
import pytest

from gate.backends.base import resolve_callable
from gate.errors import ConfigError
from gate.search.inputs import Candidate
from gate.oracles.runner import VariantRunner
from gate.judge.decide import GateSettings, decide
from gate.judge.replay import ReplayResult
from gate.ops.spec import OpSpec
from gate.plan import Variant

LIB = '''
import torch


class LogSigmoid(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return -torch.nn.functional.softplus(-x)

    @staticmethod
    def backward(ctx, g):
        return g


class PickLoss(torch.autograd.Function):
    """deep-spin/entmax's loss Functions: a classmethod forward taking a target and a default."""

    @classmethod
    def forward(cls, ctx, x, target, scale=1.0):
        return -x.gather(-1, target.unsqueeze(-1)).squeeze(-1) * scale

    @classmethod
    def backward(cls, ctx, g):
        return None, None, None


class Softmax(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)


class Scaled(torch.nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return x * self.scale


class NotAnOp:
    pass


def stats(x):
    return {"mean": x.mean(dim=-1), "std": x.std(dim=-1)}


def masked(x, mask):
    """lucidrains' attention: masked_fill takes a boolean mask only."""
    return x.masked_fill(~mask, -1e4).softmax(dim=-1)


def quits(x):
    import sys
    if (x < 0).any():
        sys.exit(3)
    return x * 2
'''


@pytest.fixture
def lib(tmp_path, monkeypatch):
    name = f"shapes_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(LIB))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def test_classes_become_operators_or_a_one_line_error(lib):
    import torch

    assert resolve_callable(f"{lib}:LogSigmoid").__name__ == "apply"  # autograd.Function -> .apply
    # apply takes positional arguments only: a row's inputs and parameters given by name are bound
    # to forward's signature after ctx (a keyword made entmax's loss Functions fail: left out by init)
    pick = resolve_callable(f"{lib}:PickLoss")
    assert list(inspect.signature(pick).parameters) == ["x", "target", "scale"]
    x, t = torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([2])
    assert pick(x, t).tolist() == pick(x, target=t).tolist() == pick(target=t, x=x).tolist() == [-3.0]
    assert pick(x, target=t, scale=2.0).tolist() == [-6.0]
    inst = resolve_callable(f"{lib}:Softmax")  # nn.Module built without arguments (once per dtype it runs at)
    assert isinstance(inst.default, torch.nn.Module) and torch.allclose(inst(torch.zeros(2)), torch.full((2,), 0.5))
    assert torch.allclose(inst.at("float64")(torch.zeros(2, dtype=torch.float64)), torch.full((2,), 0.5).double())
    with pytest.raises(ConfigError, match="constructor needs arguments .* declare an instance"):
        resolve_callable(f"{lib}:Scaled")
    with pytest.raises(ConfigError, match="is a class, not an operator"):
        resolve_callable(f"{lib}:NotAnOp")



def test_a_class_is_built_with_the_rows_constructor_arguments(lib):
    """``construct``: what init records from the tests; a torch module's weights come from a
    fixed seed, so head's and base's processes (and every dtype) run the same ones."""
    import torch

    inst = resolve_callable(f"{lib}:Scaled", (("scale", 3.0),))
    assert torch.equal(inst(torch.ones(2)), torch.full((2,), 3.0))
    lin = [resolve_callable("torch.nn:Linear", (("in_features", 4), ("out_features", 2))) for _ in range(2)]
    torch.rand(100)  # the global generator moves on: the weights do not
    again = resolve_callable("torch.nn:Linear", (("in_features", 4), ("out_features", 2)))
    assert torch.equal(lin[0].default.weight, lin[1].default.weight) and torch.equal(lin[0].default.weight, again.default.weight)
    assert torch.equal(inst.at("float64").scale * torch.ones(1, dtype=torch.float64), torch.full((1,), 3.0).double())
    with pytest.raises(ConfigError, match=r"Scaled\(scale='x', bogus=1\) fails: TypeError"):
        resolve_callable(f"{lib}:Scaled", (("scale", "x"), ("bogus", 1)))
    with pytest.raises(ConfigError, match="construct is for a class"):
        resolve_callable(f"{lib}:stats", (("scale", 1.0),))
    row = {"name": "t.scaled", "framework": "torch", "callable": f"{lib}:Scaled",
           "inputs": [{"name": "x", "shape": [3]}], "construct": {"scale": 2.0, "sizes": [1, 2]}}
    spec = OpSpec.from_dict(row, origin="user")
    assert spec.construct == (("scale", 2.0), ("sizes", (1, 2))) and spec.to_dict()["construct"]["scale"] == 2.0
    with pytest.raises(ConfigError, match="construct.scale must be a number"):
        OpSpec.from_dict({**row, "construct": {"scale": {"t": 1}}}, origin="user")


def test_dict_outputs_are_compared(lib):
    spec = OpSpec.from_dict({"name": "t.stats", "framework": "torch", "callable": f"{lib}:stats",
                             "inputs": [{"name": "x", "shape": ["N", "D"]}], "dims": {"N": [1, 4], "D": [2, 8]}},
                            origin="user")
    _, ev = VariantRunner(spec, Variant("float16")).evaluate(
        Candidate(dims={"N": 2, "D": 4}, params={}, arrays={"x": np.arange(8.0).reshape(2, 4)}))
    assert ev.status == "ok" and ev.metrics.numel == 4  # mean and std of two rows


def test_a_bool_input_reaches_the_operator_as_a_bool_tensor(lib):
    """A ``kind: bool`` input (a mask the tests pass) is drawn as booleans, not integers: torch's
    masked_fill refuses a long mask, so every evaluation of lucidrains' Attention(mask=...) was
    invalid and init left it out ("masked_fill_ only supports boolean masks")."""
    from gate.search.inputs import draw

    spec = OpSpec.from_dict({"name": "t.masked", "framework": "torch", "callable": f"{lib}:masked",
                             "inputs": [{"name": "x", "shape": ["N", "D"]},
                                        {"name": "mask", "shape": ["N", "D"], "kind": "bool", "keyword": True}],
                             "dims": {"N": [1, 4], "D": [2, 8]}}, origin="user")
    cand = draw(spec, np.random.default_rng(0))
    assert cand.arrays["mask"].dtype == np.bool_
    _, ev = VariantRunner(spec, Variant("float32")).evaluate(cand)
    assert ev.status == "ok", ev.error


def test_nothing_compared_is_an_error_not_a_pass():
    spec = OpSpec.from_dict({"name": "t.op", "framework": "torch", "callable": "m:f",
                             "inputs": [{"name": "x", "shape": [2]}]}, origin="user")
    bad = [ReplayResult("invalid", error="the operator returned no tensor or number to compare")] * 3
    vv = decide(spec, Variant("float32"), bad, bad, None, "ok", None, GateSettings())
    assert vv.outcome == "error" and vv.reason.startswith("nothing was compared") and "no tensor" in vv.reason


def test_integer_outputs_that_change_on_any_input_are_a_behaviour_change():
    spec = OpSpec.from_dict({"name": "t.argmax", "framework": "torch", "callable": "m:f",
                             "inputs": [{"name": "x", "shape": [4]}]}, origin="user")

    def res(idx):
        out = [np.ones(1), np.array([idx], dtype=np.int64)]
        from gate.oracles.precision import Metrics

        return ReplayResult("ok", metrics=Metrics(numel=2), outputs=out, reference=out)

    # a tie (an all-constant input, not a control) broken at the last index instead of the first
    vv = decide(spec, Variant("float32"), [res(3)], [res(0)], None, "ok", None, GateSettings(), controls=[False])
    assert vv.outcome == "behaviour-change" and "integer outputs" in vv.reason
    vv = decide(spec, Variant("float32"), [res(0)], [res(0)], None, "ok", None, GateSettings(), controls=[False])
    assert vv.outcome == "pass"


def test_sys_exit_in_the_operator_is_a_crash_not_the_gate_exiting(lib):
    spec = OpSpec.from_dict({"name": "t.quits", "framework": "torch", "callable": f"{lib}:quits",
                             "inputs": [{"name": "x", "shape": [3]}]}, origin="user")
    runner = VariantRunner(spec, Variant("float32"))
    _, ev = runner.evaluate(Candidate(dims={}, params={}, arrays={"x": np.array([1.0, -1.0, 2.0])}))
    assert ev.status == "crash" and ev.signature.startswith("SystemExit(3): the operator called sys.exit()")
    assert f"{lib}.py" in ev.signature
    _, ok = runner.evaluate(Candidate(dims={}, params={}, arrays={"x": np.array([1.0, 2.0, 3.0])}))
    assert ok.status == "ok"


def test_head_replay_reuses_what_the_isolated_search_saw_crash_or_hang():
    from gate.search.finding import Crash
    from gate.judge.replay import replay_head
    from gate.ops.catalog import load_builtin

    relu = {s.name: s for s in load_builtin(("torch",))}["torch.relu"]
    cands = [Candidate(dims={"N": 2, "D": 2}, params={}, arrays={"x": np.full((2, 2), v)}) for v in (1.0, -2.0)]
    crashed = Crash("SIGSEGV in ops.py:3 f", "SIGSEGV ...", 1, cands[1])
    res = replay_head(relu, Variant("float32"), cands, [crashed], isolate=object())
    assert [r.status for r in res] == ["ok", "crash"] and res[1].signature == crashed.signature
    hung = Crash("timeout after 10s in ops.py:3 f", "a hang", 1, cands[1])
    res = replay_head(relu, Variant("float32"), cands, [hung], isolate=object())
    assert [r.status for r in res] == ["unavailable", "crash"]  # nothing run again on a hanging operator
    res = replay_head(relu, Variant("float32"), cands, [crashed])  # in process: crashes are cheap to re-run
    assert [r.status for r in res] == ["ok", "ok"]
