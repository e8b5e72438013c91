"""Localise stage pieces on their own: shrinking, sub-operation tracing, changed-code ranking,
the no-base (framework built-in) path, the time budget, failure isolation, the TensorFlow repro."""
import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import numpy as np
import pytest

from gate.config import Config
from gate.search.inputs import Candidate
from gate.judge.baselines import BaselineRow
from gate.judge.decide import GateSettings, decide
from gate.judge.replay import replay
from gate.judge.verdict import GateReport
from gate.localise import localise_all
from gate.localise.code import Change, rank
from gate.localise.model import Deadline
from gate.localise.shrink import ddmin
from gate.localise.trace import culprit, trace_op
from gate.ops.catalog import load_builtin
from gate.ops.spec import OpSpec
from gate.plan import Budget, Task, Variant
from tests.helpers.repro import run_script


class _Chk:
    def __init__(self, cand, holds):
        self.cand, self.holds = cand, holds


def test_ddmin_finds_the_indices_that_matter():
    need = {37, 71}
    calls = []

    def check(cands):
        calls.append(len(cands))
        return [_Chk(c, need <= set(c)) for c in cands]

    keep, chk = ddmin(100, lambda s: list(s), check, 1, Deadline(30))
    assert sorted(keep) == [37, 71] and chk.holds
    assert len(calls) < 40  # batched rounds, not one question per element
    keep, _ = ddmin(100, lambda s: list(s), check, 1, Deadline(30), prefer=[[37, 71]])
    assert sorted(keep) == [37, 71] and len(calls) < 45
    # an expired deadline returns at once with what it has
    keep, chk = ddmin(100, lambda s: list(s), check, 1, Deadline(0))
    assert len(keep) == 100 and chk is None


def _module(tmp_path, monkeypatch, source: str) -> str:
    name = f"loclib_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def _line(tmp_path, mod, needle):
    text = (tmp_path / f"{mod}.py").read_text().splitlines()
    return next(i + 1 for i, ln in enumerate(text) if needle in ln)


BRANCHY = '''
import torch


def _shifted(x):
    return x - x.amax(dim=-1, keepdim=True)


def softmax(x):
    if x.dtype == torch.float16:
        e = torch.exp(x)  # no shift for half: "inputs are small"
        return e / e.sum(dim=-1, keepdim=True)
    e = torch.exp(_shifted(x))
    return e / e.sum(dim=-1, keepdim=True)
'''


def test_shadow_trace_follows_the_dtype_branch_and_names_the_jump(tmp_path, monkeypatch):
    mod = _module(tmp_path, monkeypatch, BRANCHY)
    spec = OpSpec.from_dict({"name": "t.softmax", "framework": "torch", "callable": f"{mod}:softmax",
                             "kind": "normalization", "inputs": [{"name": "x", "shape": ["N"]}], "dims": {"N": [1, 8]}},
                            origin="user")
    cand = Candidate(dims={"N": 3}, params={}, arrays={"x": np.array([12.0, 1.0, -3.0])})
    head = trace_op(spec, Variant("float16"), cand, root=str(tmp_path))
    assert [c.name.split(".")[-1] for c in head.low.calls] == ["exp", "sum", "div"]
    assert all(c.file == f"{mod}.py" for c in head.low.calls)
    sub, table = culprit(head, None, "nonfinite", 2.0, 3.0, spec.ulp_floor)
    # exp(12) overflows float16 (the oracle calls that exact: float64 is out of range too); the
    # NaN shows at the division, and the culprit is the overflowing exp of the float16-only branch
    assert sub["call"] == "exp" and sub["line"] == _line(tmp_path, mod, "e = torch.exp(x)"), sub
    assert sub["overflow"] == 1 and "overflows" in sub["how"] and "div" in sub["how"]
    assert table[0]["delta"] < 2 and table[2]["delta"] == float("inf")
    # float32 takes the shifted path: nothing jumps above the floor
    f32 = trace_op(spec, Variant("float32"), cand, root=str(tmp_path))
    assert [c.name.split(".")[-1] for c in f32.low.calls][:2] == ["amax", "sub"]
    assert all((c.delta or 0) < 4 for c in f32.low.calls)


def test_builtin_has_no_suboperations():
    spec = next(s for s in load_builtin(("torch",)) if s.name == "torch.exp")
    cand = Candidate(dims={"N": 2}, params={}, arrays={k: np.ones((2,)) for k in [t.name for t in spec.inputs]})
    tr = trace_op(spec, Variant("float32"), cand)
    assert tr.low.calls == [] and "built-in" in tr.note


TF_BRANCHY = '''
import tensorflow as tf


def _shifted(x):
    return x - tf.reduce_max(x, axis=-1, keepdims=True)


@tf.function
def softmax(x):
    if x.dtype == tf.float16:
        e = tf.exp(x)  # no shift for half: "inputs are small"
        return e / tf.reduce_sum(e, axis=-1, keepdims=True)
    e = tf.math.exp(_shifted(x))
    return e / tf.reduce_sum(e, axis=-1, keepdims=True)
'''


def test_tensorflow_operator_is_traced_through_its_api_calls_and_operators(tmp_path, monkeypatch):
    """Eager TF has no function mode: the recorder wraps tf.* functions and tensor operators
    (and runs tf.function bodies eagerly); TF's own internal calls are not recorded, and every
    wrapper is gone afterwards."""
    import tensorflow as tf

    before = (tf.exp, tf.math.exp, tf.Tensor.__truediv__, tf.config.functions_run_eagerly())
    mod = _module(tmp_path, monkeypatch, TF_BRANCHY)
    spec = OpSpec.from_dict({"name": "t.tf_softmax", "framework": "tensorflow", "callable": f"{mod}:softmax",
                             "kind": "normalization", "inputs": [{"name": "x", "shape": ["N"]}], "dims": {"N": [1, 8]}},
                            origin="user")
    cand = Candidate(dims={"N": 3}, params={}, arrays={"x": np.array([12.0, 1.0, -3.0])})
    head = trace_op(spec, Variant("float16"), cand, root=str(tmp_path))
    assert head.note is None and head.low.error is None
    assert [c.name for c in head.low.calls] == ["tf.exp", "tf.reduce_sum", "tf.Tensor.__truediv__"]
    assert all(c.file == f"{mod}.py" for c in head.low.calls)
    assert head.low.calls[2].inputs == [0, 1]  # the division consumed exp's and reduce_sum's outputs
    sub, table = culprit(head, None, "nonfinite", 2.0, 3.0, spec.ulp_floor)
    assert sub["call"] == "exp" and sub["line"] == _line(tmp_path, mod, "e = tf.exp(x)"), sub
    assert sub["overflow"] == 1
    f32 = trace_op(spec, Variant("float32"), cand, root=str(tmp_path), float64_run=True)
    assert [c.name for c in f32.low.calls][:3] == ["tf.reduce_max", "tf.Tensor.__sub__", "tf.exp"]
    assert all((c.delta or 0) < 4 for c in f32.low.calls)
    assert f32.f64 is not None and all(c.outputs is not None for c in f32.f64.calls)
    assert (tf.exp, tf.math.exp, tf.Tensor.__truediv__, tf.config.functions_run_eagerly()) == before


def test_changed_code_ranking_follows_the_stack_and_the_selection():
    changes = [
        Change("lib/a.py", [30, 31], "unrelated", 28, 33),
        Change("lib/h.py", [12], "helper", 10, 13),
        Change("lib/f.py", [5], "f", 3, 8),
        Change("lib/f.py", [20], "other", 18, 22),
    ]
    stack = ["lib/op.py:4 op", "lib/f.py:6 f", "lib/h.py:12 helper"]  # outermost first
    rows = rank(changes, stack, [])
    assert [(r["file"], r["line"], r["distance"]) for r in rows[:2]] == [("lib/h.py", 12, 0), ("lib/f.py", 5, 3)]
    assert {r["symbol"] for r in rows[2:]} == {"unrelated", "other"} and all(r["distance"] > 3 for r in rows[2:])
    # with the selection's reasons, code that does not reach the operator is left out
    reasons = [{"file": "lib/h.py", "line": 10, "symbol": "lib.h:helper", "path": ["lib.h:helper", "lib.f:f", "lib.op:op", "op"],
                "kind": "python"},
               {"file": "lib/f.py", "line": 3, "symbol": "lib.f:f", "path": ["lib.f:f", "lib.op:op", "op"], "kind": "python"}]
    rows = rank(changes, stack, reasons)
    assert [(r["file"], r["symbol"]) for r in rows] == [("lib/h.py", "helper"), ("lib/f.py", "f")]
    # a call site one level up the stack is closer than another line of that function
    rows = rank([Change("lib/f.py", [6], "f", 3, 8), Change("lib/h.py", [11], "helper", 10, 13)], stack, [])
    assert [(r["line"], r["distance"]) for r in rows] == [(11, 1), (6, 2)]
    # a changed helper that no longer calls anything traced, called on the sub-operation's line
    src = {("lib/h.py", 12): "    return torch.exp(shift(x))"}
    rows = rank([Change("lib/s.py", [4], "shift", 2, 5), Change("lib/a.py", [30], "unrelated", 28, 33)], stack, [],
                lambda f, ln: src.get((f, ln), ""))
    assert [(r["symbol"], r["distance"]) for r in rows][0] == ("shift", 1) and "called on" in rows[0]["why"]


NAIVE = '''
import torch


def _log_one_plus(u):
    return torch.log(1 + u)


def softplus(x):
    return _log_one_plus(torch.exp(x))
'''


def _work(tmp_path, monkeypatch, dtype="float16", settings=None, base_ulp=0.5, hi=6.0):
    """A work item as the pipeline builds it, for an operator judged without a base replay."""
    mod = _module(tmp_path, monkeypatch, NAIVE)
    spec = OpSpec.from_dict({"name": "t.softplus", "framework": "torch", "callable": f"{mod}:softplus",
                             "kind": "elementwise", "inputs": [{"name": "x", "shape": ["N", "D"], "domain": {"name": "real", "scale": 4}}],
                             "dims": {"N": [1, 8], "D": [1, 16]}, "dtypes": ["float16", "float32"]}, origin="user")
    variant = Variant(dtype)
    rng = np.random.default_rng(0)
    cands = [Candidate(dims={"N": 8, "D": 16}, params={}, arrays={"x": rng.uniform(-10.0, hi, (8, 16))}) for _ in range(3)]
    head = replay(spec, variant, cands)
    settings = settings or GateSettings()
    row = BaselineRow(op=spec.name, variant=variant.key, env={}, ulp=base_ulp)
    vv = decide(spec, variant, head, None, row, "ok", None, settings)
    task = Task(op=spec, variant=variant, budget=Budget(evals=10), seed=0)
    w = {"spec": spec, "task": task, "finding": None, "row": row, "status": "ok", "cands": cands, "head": head,
         "base": None, "src": (f"{mod}.py", 9), "verdict": vv}
    return mod, w


def _ctx(tmp_path, budget):
    cfg = Config(path=None, root=tmp_path, raw={"budget": {"localise": budget}})
    return {"repo": tmp_path, "merge_base": None, "head_sha": None, "config": cfg, "base_config": None, "selected": [],
            "settings": GateSettings(), "out": tmp_path / "out", "say": None}


def test_without_base_the_finding_is_held_against_the_baseline_row(tmp_path, monkeypatch):
    mod, w = _work(tmp_path, monkeypatch)
    vv = w["verdict"]
    assert vv.outcome == "regression"
    report = GateReport(outcome="regression", reason="", verdicts=[vv])
    localise_all(report, [w], _ctx(tmp_path, 30))
    d = vv.diagnosis
    assert d and not d.get("error") and not d.get("truncated"), d
    assert d["minimal_input_elements"] == 1 and d["found_input_elements"] == 128
    assert (d["suboperation"]["call"], d["suboperation"]["line"]) == ("log", _line(tmp_path, mod, "torch.log(1 + u)"))
    assert d["base_vs_head"][0] == {"name": "status", "base": "not run (no base version)", "head": "ok"}
    assert Path(d["repro_script"]).exists() and vv.repro_command == d["repro_command"]
    assert json.loads(json.dumps(report.to_dict()))["verdicts"][0]["diagnosis"]["kind"] == "precision"
    # the script reproduces with numpy + torch + the library only (tests/helpers/repro.py)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = run_script([d["repro_script"]], env=env, timeout=120)
    assert res.returncode == 1 and "float16 max error" in res.stdout, res.stdout + res.stderr


def test_new_overflow_is_traced_to_the_call_that_overflows(tmp_path, monkeypatch):
    mod, w = _work(tmp_path, monkeypatch, hi=13.0)  # exp(x) overflows float16 above ~11.1
    vv = w["verdict"]
    assert vv.outcome == "regression" and "NaN/Inf" in vv.reason
    localise_all(GateReport(outcome="regression", reason="", verdicts=[vv]), [w], _ctx(tmp_path, 30))
    d = vv.diagnosis
    assert d["kind"] == "nonfinite" and d["minimal_input_elements"] == 1
    assert (d["suboperation"]["call"], d["suboperation"]["line"]) == ("exp", _line(tmp_path, mod, "torch.exp(x)"))
    assert "overflows" in d["suboperation"]["how"] and "float16" in d["parameter"]


KL = '''
import torch


def kl(p, q):
    if p.shape[-1] != 16:  # rows of 16 (a histogram's bins): the shrinker keeps the whole row
        raise ValueError("expected 16 bins")
    return (p * torch.log(p / q)).sum(-1)
'''


def test_the_elements_an_error_hangs_on_are_named_first(tmp_path, monkeypatch):
    # torchmetrics #1030's KL without its clamp: one subnormal q among a row of p = q = 0.5 makes
    # p / q overflow float32; the "fed by" list named eight p = 0.5 first and cut the q off
    mod = _module(tmp_path, monkeypatch, KL)
    spec = OpSpec.from_dict({"name": "t.kl", "framework": "torch", "callable": f"{mod}:kl", "kind": "reduction",
                             "inputs": [{"name": "p", "shape": ["N", "D"], "domain": "prob"},
                                        {"name": "q", "shape": ["N", "D"], "domain": "prob"}],
                             "dims": {"N": [1, 2], "D": [1, 16]}, "dtypes": ["float32"]}, origin="user")
    variant = Variant("float32")
    p, q = np.full((1, 16), 0.5), np.full((1, 16), 0.5)
    q[0, 13] = 1e-40
    cands = [Candidate(dims={"N": 1, "D": 16}, params={}, arrays={"p": p, "q": q})]
    head = replay(spec, variant, cands)
    row = BaselineRow(op=spec.name, variant=variant.key, env={}, ulp=0.5)
    vv = decide(spec, variant, head, None, row, "ok", None, GateSettings())
    assert vv.outcome == "regression" and "NaN/Inf" in vv.reason, vv.reason
    task = Task(op=spec, variant=variant, budget=Budget(evals=10), seed=0)
    w = {"spec": spec, "task": task, "finding": None, "row": row, "status": "ok", "cands": cands, "head": head,
         "base": None, "src": (f"{mod}.py", 5), "verdict": vv}
    localise_all(GateReport(outcome="regression", reason="", verdicts=[vv]), [w], _ctx(tmp_path, 30))
    fed = vv.diagnosis["worst_element"].split("fed by ", 1)[1]
    assert fed.startswith("q[13] = 9.99995e-41, "), vv.diagnosis["worst_element"]  # 1e-40 in float32
    assert fed.count("p[") + fed.count("q[") == 12 and "(+20 more)" in fed, fed  # the row's others follow


def test_budget_bounds_the_stage_and_failures_stay_inside(tmp_path, monkeypatch):
    _, w = _work(tmp_path, monkeypatch)
    vv = w["verdict"]
    report = GateReport(outcome="regression", reason="", verdicts=[vv])
    localise_all(report, [w], _ctx(tmp_path, 0))
    assert vv.diagnosis["truncated"] and "off" in vv.diagnosis["notes"][0]
    vv.diagnosis = None
    localise_all(report, [w], _ctx(tmp_path, 1e-6))  # spent before it starts: cheap parts only
    d = vv.diagnosis
    assert d["truncated"] and not d.get("error") and d["minimal_input_elements"] == d["found_input_elements"]
    assert "suboperation" not in d and Path(d["repro_script"]).exists()
    assert vv.outcome == "regression"
    # a broken work item becomes a note on its verdict, never an exception
    vv.diagnosis = None
    broken = dict(w, cands=[], head=[])
    localise_all(report, [broken], _ctx(tmp_path, 5))
    assert vv.diagnosis["error"].startswith("IndexError") and vv.outcome == "regression"


@pytest.mark.tf
def test_tensorflow_repro_script_runs_with_tensorflow_alone(tmp_path):
    from gate.localise.repro import write_repro

    mod = f"tflib_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{mod}.py").write_text("import tensorflow as tf\n\n\ndef softplus(x):\n    return tf.math.log(1 + tf.exp(x))\n")
    spec = OpSpec.from_dict({"name": "t.tf_softplus", "framework": "tensorflow", "callable": f"{mod}:softplus",
                             "inputs": [{"name": "x", "shape": ["N"]}], "dims": {"N": [1, 4]}}, origin="user")
    cand = Candidate(dims={"N": 2}, params={}, arrays={"x": np.array([-8.0, 0.5])})
    paths = write_repro(tmp_path / "repro", "tf", spec, Variant("float16"), cand, kind="precision", threshold=2.0,
                        threshold_why="test", repo=tmp_path, python_path=["."], reason="planted", ftz=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run([sys.executable, paths["script"]], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "float16 max error" in res.stdout and "worst element output[0][0]" in res.stdout



def test_a_repro_script_sets_the_configs_env_values_as_the_workers_had_them(tmp_path):
    # keras's torch backend in the zero-config acceptance: the gate's workers had the config's
    # KERAS_BACKEND=torch, the repro script did not, and aborted at import (exit 134) although
    # the report said it exits 1 on head
    from gate.localise.repro import write_repro

    mod = f"envlib_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{mod}.py").write_text(
        "import os\n\nimport torch\n\nif os.environ.get('DL_GATE_REPRO_BACKEND') != 'torch':\n"
        "    raise RuntimeError('no backend chosen')\n\n\ndef softplus(x):\n    return torch.log(1 + torch.exp(x))\n")
    spec = OpSpec.from_dict({"name": "t.softplus", "framework": "torch", "callable": f"{mod}:softplus",
                             "inputs": [{"name": "x", "shape": ["N"]}], "dims": {"N": [1, 4]}}, origin="user")
    cand = Candidate(dims={"N": 2}, params={}, arrays={"x": np.array([-20.0, 0.5])})
    paths = write_repro(tmp_path / "repro", "softplus", spec, Variant("float32"), cand, kind="precision", threshold=2.0,
                        threshold_why="test", repo=tmp_path, python_path=["."], reason="planted",
                        env={"DL_GATE_REPRO_BACKEND": "torch"})
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DL_GATE_REPRO_BACKEND")}
    res = subprocess.run([sys.executable, paths["script"]], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 1 and "float32 max error" in res.stdout, res.stdout + res.stderr
    # the job's own value wins over the config's
    res = subprocess.run([sys.executable, paths["script"]], capture_output=True, text=True, timeout=120,
                         env={**env, "DL_GATE_REPRO_BACKEND": "numpy"})
    assert res.returncode == 2 and "no backend chosen" in res.stdout + res.stderr, res.stdout + res.stderr


@pytest.mark.tf
def test_a_keras_loss_class_repro_runs_the_loss_and_reproduces_a_behaviour_change(tmp_path):
    # keras-cv CenterNetBoxLoss (acceptance run): the script built the loss as a layer and read
    # its .weights, which a keras.losses.Loss has not: it raised on head and base alike
    from gate.localise.repro import write_repro

    mod = f"kloss_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{mod}.py").write_text(
        "import math\n\nimport keras\nfrom keras import ops\n\n\nclass HeadingLoss(keras.losses.Loss):\n"
        "    def __init__(self, bins, **kwargs):\n        super().__init__(**kwargs)\n        self.bins = bins\n\n"
        "    def call(self, y_true, y_pred):\n"
        "        h = ops.floor(ops.mod(y_true, 2 * math.pi))  # the reverted fix's floor\n"
        "        return ops.abs(ops.floor(h / (2 * math.pi / self.bins)) - y_pred)\n")
    spec = OpSpec.from_dict({"name": "k.HeadingLoss", "framework": "tensorflow", "callable": f"{mod}:HeadingLoss",
                             "construct": {"bins": 4, "reduction": "none"},
                             "inputs": [{"name": "y_true", "shape": ["N"]}, {"name": "y_pred", "shape": ["N"]}],
                             "dims": {"N": [1, 4]}}, origin="user")
    cand = Candidate(dims={"N": 4}, params={}, arrays={"y_true": np.array([0.5, 1.7, 3.3, 4.9]), "y_pred": np.zeros(4)})
    # base's float64 output: the loss without the floor (bins 0, 1, 2, 3)
    paths = write_repro(tmp_path / "repro", "loss", spec, Variant("float32"), cand, kind="behaviour", threshold=4.0,
                        threshold_why="test", repo=tmp_path, python_path=["."], reason="planted",
                        base_reference=[np.array([0.0, 1.0, 2.0, 3.0])])
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run([sys.executable, paths["script"]], capture_output=True, text=True, env=env, timeout=120)
    assert "raises" not in res.stdout, res.stdout + res.stderr
    assert res.returncode == 1 and "float64 output differs from base's" in res.stdout, res.stdout + res.stderr


def _trace(calls):
    from gate.localise.trace import Call, OpTrace, Trace

    return OpTrace("bfloat16", low=Trace(calls=[Call(index=i, name=n, file="lib/ops.py", line=ln, function="f",
                                                      stack=[f"lib/ops.py:{ln} f"], inputs=ins, delta=d)
                                                 for i, (n, ln, ins, d) in enumerate(calls)]))


def test_a_cast_that_rounds_what_an_amplifier_consumes_is_blamed_not_the_amplifier():
    # diffusers#13922-like: head casts angles to bf16 (line 3) then takes cos (line 4); base took
    # cos of the float32 angles and rounded after: base's cos got exact inputs
    from gate.localise.trace import culprit

    head = _trace([("torch.Tensor.to", 3, [-1], 0.5), ("torch.Tensor.cos", 4, [0], 232.0), ("torch.mul", 4, [1], 232.0)])
    base = _trace([("torch.Tensor.cos", 3, [-1], 0.002), ("torch.Tensor.to", 3, [0], 0.5), ("torch.mul", 4, [1], 0.5)])
    found, _ = culprit(head, base, "precision", 2.0, 3.0, "output")
    assert (found["call"], found["line"]) == ("to", 3), found
    assert "cos" in found["how"] and "amplifies" in found["how"]


def test_when_base_fed_its_amplifier_the_same_rounded_input_the_changed_amplifier_is_blamed():
    # both sides cast first; head replaced a stable function of the rounded value by an unstable one
    from gate.localise.trace import culprit

    head = _trace([("torch.Tensor.to", 3, [-1], 0.5), ("torch.Tensor.cos", 4, [0], 232.0)])
    base = _trace([("torch.Tensor.to", 3, [-1], 0.5), ("torch.Tensor.cos", 4, [0], 0.6)])
    found, _ = culprit(head, base, "precision", 2.0, 3.0, "output")
    assert (found["call"], found["line"]) == ("cos", 4), found


def test_a_domain_given_by_bounds_survives_the_trip_to_the_base_worker():
    from gate.ops.spec import OpSpec

    s = OpSpec.from_dict({"name": "a", "framework": "torch", "callable": "m:f",
                          "inputs": [{"name": "x", "shape": [3], "domain": {"lo": 0, "hi": 4096}}]})
    again = OpSpec.from_dict(s.to_dict())
    assert again == s and (again.inputs[0].domain.lo, again.inputs[0].domain.hi) == (0.0, 4096.0)


def test_the_worst_element_of_a_new_nan_is_the_element_that_became_nan():
    # a dropped eps under a sqrt (pytorch3d's _sqrt_positive_part, issue #119): head's NaN has a
    # NaN float64 run too, so its error reads 0 ulps; the element shown must still be that one,
    # not the first finite element of the output
    from gate.judge.replay import ReplayResult
    from gate.localise.target import NONFINITE, Target, focus_element
    from gate.ops.catalog import load_catalog
    from gate.oracles.precision import Metrics

    spec = load_catalog([], builtin=("torch",)).get("torch.exp")
    ref = np.array([[0.5, 0.25], [np.nan, 2.0]])
    head = ReplayResult("ok", Metrics(ulp=0.0), outputs=[np.array([[0.5, 0.25], [np.nan, 2.0]], np.float32)],
                        reference=[ref])
    base = ReplayResult("ok", Metrics(ulp=0.0), outputs=[np.array([[0.5, 0.25], [0.0, 2.0]], np.float32)],
                        reference=[np.array([[0.5, 0.25], [0.0, 2.0]])])
    target = Target(spec, GateSettings(), NONFINITE)
    assert focus_element(target, head, base, "float32") == (0, (1, 0))


def _module_history(tmp_path, first: str):
    """A git repository whose m.py starts as ``first``; ``commit(text)`` commits the next version."""
    repo = tmp_path / "r"
    repo.mkdir()

    def git(*a):
        subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *a], check=True,
                       capture_output=True)

    git("init", "-q", "-b", "main")

    def commit(text: str) -> None:
        (repo / "m.py").write_text(text)
        git("add", "-A")
        git("commit", "-qm", "next")

    commit(first)
    return repo, commit


def test_a_comment_edited_beside_the_change_is_not_named_as_the_changed_code(tmp_path):
    # keras #23093 (normalize's rsqrt clamp): the fix's revert edits the comment above the code
    # in a hunk of its own; the changed code named for the finding is the rsqrt line, not the comment
    from gate.localise.code import changed_code

    before = textwrap.dedent('''\
        import torch


        def normalize(x, epsilon=1e-7):
            # L2 normalization with `x * rsqrt(...)`
            # instead of `x / sqrt(...)`. Clamp the squared norm before the
            # rsqrt so zero vectors get a finite gradient.
            square_sum = torch.sum(torch.square(x), dim=-1, keepdim=True)
            inv_norm = torch.rsqrt(torch.clamp_min(square_sum, epsilon * epsilon))
            return x * inv_norm
        ''')
    after = textwrap.dedent('''\
        import torch


        def normalize(x, epsilon=1e-7):
            # L2 normalization with `x * rsqrt(...)`
            # instead of `x / sqrt(...)`
            square_sum = torch.sum(torch.square(x), dim=-1, keepdim=True)
            inv_norm = torch.rsqrt(square_sum)
            inv_norm = torch.clamp_max(inv_norm, 1.0 / epsilon)
            return x * inv_norm
        ''')
    repo, commit = _module_history(tmp_path, before)
    commit(after)
    [ch] = changed_code(repo, "HEAD~1", "HEAD")
    assert ch.symbol == "normalize" and ch.lines == [8, 9], (ch.lines, ch.text)


def test_a_base_that_did_not_answer_leaves_the_finding_untold_not_held():
    """A shrink step checked while base's worker did not answer is not accepted on the baseline
    row's word (it kept x=[inf], where base is NaN too); with no base at all the row stands in."""
    from gate.judge.replay import UNAVAILABLE, ReplayResult
    from gate.localise.target import NONFINITE, RowLimit, Target
    from gate.search.score import Metrics

    spec = next(o for o in load_builtin(("torch",)) if o.name == "torch.exp")
    target = Target(spec, GateSettings(), NONFINITE, row_limit=lambda v: RowLimit(threshold=2.0, nonfinite=0))
    head = ReplayResult("ok", metrics=Metrics(nonfinite=1, numel=1))
    assert target.holds(head, ReplayResult(UNAVAILABLE, error="timeout"), Variant("float16")) is None
    assert target.holds(head, None, Variant("float16")) is True  # no base run: the baseline row's limit
    assert target.holds(head, ReplayResult("ok", metrics=Metrics(nonfinite=1, numel=1)), Variant("float16")) is False


def test_a_deleted_line_is_named_as_a_deletion_not_as_the_unchanged_line_after_it(tmp_path):
    # the max-shift dropped from a softmax (what the bundled example's regression PR and many a
    # real "simplification" do): the hunk deletes one line and adds none. The line named is the
    # one that now follows the deletion (the traced exp), and it says what was deleted there
    from gate.localise.code import changed_code
    from gate.report.common import code_ref_text

    before = textwrap.dedent('''\
        import torch


        def softmax(x, dim=-1):
            x = x - x.amax(dim=dim, keepdim=True)  # shift: exp never overflows
            e = torch.exp(x)
            return e / e.sum(dim=dim, keepdim=True)
        ''')
    after = before.replace("    x = x - x.amax(dim=dim, keepdim=True)  # shift: exp never overflows\n", "")
    repo, commit = _module_history(tmp_path, before)
    commit(after)
    [ch] = changed_code(repo, "HEAD~1", "HEAD")
    assert ch.symbol == "softmax" and ch.lines == [5]
    [row] = rank([ch], ["m.py:5 softmax"], [])
    assert row["line"] == 5 and row["why"] == "the sub-operation's own line"
    assert row["deleted"] == ["x = x - x.amax(dim=dim, keepdim=True)  # shift: exp never overflows"]
    assert row["text"].startswith("deleted above this line: x = x - x.amax")  # not "e = torch.exp(x)"
    assert "code deleted above it: x = x - x.amax" in code_ref_text(row)
    # a comment deleted on its own is no code change: its line is not named as a deletion
    commit(after.replace("import torch\n", "import torch\n# ops\n"))
    commit(after)
    assert all(not c.deleted for c in changed_code(repo, "HEAD~1", "HEAD"))
    # nor is the code line that follows a deleted comment named as changed code
    commented = after.replace("    e = torch.exp(x)\n", "    # the exponentials\n    e = torch.exp(x)\n")
    commit(commented)
    commit(after)
    assert changed_code(repo, "HEAD~1", "HEAD") == []


def test_a_dtype_that_failed_in_the_run_is_never_called_out_by_only():
    # the float32 finding's input passes at float16 and bfloat16 (each dtype overflows on inputs
    # of its own), but the run failed those rows too: "dtype=float32 only" would send the user
    # after the wrong cause
    from gate.localise.vary import Variation, conclude

    v32 = Variant("float32")
    rows = [Variation("dtype", "float32", True, v32, [None], results=[True]),
            Variation("dtype", "float16", False, Variant("float16"), [None], results=[False]),
            Variation("dtype", "bfloat16", False, Variant("bfloat16"), [None], results=[False])]
    assert conclude(rows, v32, {})[0] == "dtype=float32 only"
    param, evidence = conclude(rows, v32, {}, failed_in_run=["float16/cpu/input"])
    # (the acceptance run's user read the set as if this input had failed at float16 too)
    assert param == "dtype in {float32, float16 (failed in this run)} (not bfloat16)", param
    assert "float16 yes (failed in this run)" in evidence
    param, _ = conclude(rows, v32, {}, failed_in_run=["float16/cpu/input", "bfloat16/cpu/input"])
    assert param.startswith("no single parameter"), param


def test_long_traces_align_in_linear_time_call_by_call(monkeypatch):
    """A running log-sum-exp written as a loop over 8,192 steps traces ~50K calls a side; difflib
    (quadratic, worse on repetitive traces) held localisation for minutes past its budget. Long
    traces align their common prefix and suffix, then the k-th call of a function to its k-th."""
    import difflib

    from gate.localise import trace

    steps = 8192
    head = ["select"] + ["maximum", "sub", "exp", "mul", "sub", "exp", "add", "log", "add"] * steps + ["stack"]
    base = ["select"] + ["sub", "exp", "add", "log", "add"] * steps + ["stack"]

    def refuse(*a, **k):
        raise AssertionError("difflib on traces beyond the limit")

    monkeypatch.setattr(difflib, "SequenceMatcher", refuse)
    m = trace.align(head, base)
    assert m[0] == 0 and m[len(head) - 1] == len(base) - 1  # common prefix and suffix
    exps_h = [i for i, x in enumerate(head) if x == "exp"]
    exps_b = [j for j, x in enumerate(base) if x == "exp"]
    # the k-th exp of head is the k-th of base (the last step's last exp is the common suffix's)
    assert [m[i] for i in exps_h[:steps - 1]] == exps_b[:steps - 1] and m[exps_h[-1]] == exps_b[-1]
    assert all(m.get(i) is None for i in exps_h[steps - 1:-1])  # head has twice base's exps
    assert "maximum" not in [base[m[i]] for i in m]
    monkeypatch.undo()
    assert trace.align(["a", "b", "c"], ["a", "c"]) == {0: 0, 2: 1}  # short traces: difflib as before
