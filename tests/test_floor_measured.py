"""A row that declares no kind is elementwise by default; the runner measures whether its
operator is, and judges a row-reducing operator per output (issue 31: exact zeros judged in
ulps of a residue). Found on the verdict bed's benign layer_norm refactor, seed 11: the
gradient with respect to the one large value of a row [1.55e10, 0, 0, 0] is 0 in exact
arithmetic (scale invariance); head's float32 returned -3.5e-18 and, judged per element in
ulps of float32's smallest normal, read 4.5e15 ulp: a regression of a refactor that changed
nothing."""
from __future__ import annotations

import sys

import numpy as np
import pytest

from gate.ops.catalog import builtin_defaults
from gate.ops.spec import OpSpec
from gate.oracles.registry import build_runner
from gate.plan import Variant
from gate.search.inputs import Candidate

SRC = '''
import torch
import torch.nn.functional as F


def layer_norm(x, eps=1e-5):
    mu = x.mean(dim=-1, keepdim=True)
    xc = x - mu
    var = (xc ** 2).mean(dim=-1, keepdim=True)
    return xc / torch.sqrt(var + eps)


def softplus(x):
    return F.softplus(x)


def row_sum(x):
    return x.sum(-1)


def tanh_deriv(x):
    return 1 - torch.tanh(x) ** 2
'''


@pytest.fixture
def ops(tmp_path, monkeypatch):
    (tmp_path / "floorops.py").write_text(SRC)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("floorops", None)


def row(fn: str, **extra) -> OpSpec:
    raw = {"name": f"lib.{fn}", "framework": "torch", "callable": f"floorops:{fn}", "dims": {"N": [1, 4], "D": [2, 8]},
           "inputs": [{"name": "x", "shape": ["N", "D"]}], **extra}
    return OpSpec.from_dict(raw, builtin_defaults("torch"), origin="user")


def test_only_a_row_that_declares_nothing_is_measured_and_the_flag_reaches_the_worker():
    assert row("layer_norm").floor_measured and row("layer_norm").ulp_floor == "dtype"
    for declared in ({"kind": "elementwise"}, {"kind": "normalization"}, {"ulp_floor": "dtype"}, {"elementwise": True}):
        assert not row("layer_norm", **declared).floor_measured, declared
    again = OpSpec.from_dict(row("layer_norm").to_dict(), builtin_defaults("torch"), origin="user")
    assert again.floor_measured  # as the isolated worker rebuilds it
    assert not OpSpec.from_dict(row("layer_norm", kind="elementwise").to_dict(), builtin_defaults("torch"),
                                origin="user").floor_measured


def evaluate(spec, oracle, x, upstream=None):
    r = build_runner(spec, Variant("float32", oracle=oracle))
    arrays = {"x": np.asarray(x, dtype=np.float64)}
    if upstream is not None:
        arrays["__upstream0__"] = np.asarray(upstream, dtype=np.float64)
    _, ev = r.evaluate(Candidate(dims={"N": 1, "D": 4}, params={}, arrays=arrays))
    assert ev.status == "ok", ev.error
    return r, ev


X = [[15473548288.0, 0.0, 0.0, 0.0]]
UP = [[0.14722968637943268, -0.2650738060474396, -0.12341587245464325, -0.6992830634117126]]


def test_a_row_reducing_operator_is_judged_per_output_and_an_elementwise_one_per_element(ops):
    r, ev = evaluate(row("layer_norm"), "grad", X, UP)
    assert r.spec.ulp_floor == "output" and ev.metrics.ulp_floor == "output"
    assert ev.metrics.ulp < 4  # the exact zero, on the scale of its terms
    # the same operator declared elementwise: the residue in ulps of the smallest normal
    _, declared = evaluate(row("layer_norm", kind="elementwise"), "grad", X, UP)
    assert declared.metrics.ulp > 1e10 and declared.metrics.ulp_floor is None
    r, ev = evaluate(row("row_sum"), "precision", X)  # another output shape
    assert r.spec.ulp_floor == "output"
    # elementwise operators keep their per-element floor: tanh's derivative where 1 - tanh^2
    # cancels in float32 is a real loss in its own ulps, which a per-output floor would hide
    for fn in ("softplus", "tanh_deriv"):
        r, ev = evaluate(row(fn), "precision", [[0.5, -3.0, 9.0, 2.0]])
        assert r.spec.ulp_floor == "dtype" and ev.metrics.ulp_floor is None, fn
    _, ev = evaluate(row("tanh_deriv"), "precision", [[9.0, 9.5, 10.0, 8.5]])
    assert ev.metrics.ulp > 1e3  # 1 - tanh(9)^2 = 6e-8 is 0 in float32 on some of them: judged per element


def test_the_judge_counts_ulps_as_the_runs_measured(ops):
    from gate.judge.replay import ReplayResult
    from gate.pipeline import measured_floor
    from gate.search.score import Metrics

    spec = row("layer_norm")
    per_output = [ReplayResult("ok", Metrics(ulp=1.0, ulp_floor="output")), ReplayResult("crash")]
    per_element = [ReplayResult("ok", Metrics(ulp=1.0))]
    assert measured_floor(spec, per_output).ulp_floor == "output"
    assert measured_floor(spec, per_element).ulp_floor == "dtype"
    # a row that declared its floor keeps it whatever a run says
    assert measured_floor(row("layer_norm", kind="elementwise"), per_output).ulp_floor == "dtype"
    # the metrics carry it across the process boundary
    assert Metrics.from_dict(Metrics(ulp=2.0, ulp_floor="output").to_dict()).ulp_floor == "output"
