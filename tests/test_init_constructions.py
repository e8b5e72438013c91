"""A class its tests build two ways that run different code (deel-lip 28a867d: `KR(multi_gpu=True)`
computes through `_kr_multi_gpu`, `KR()` through `_kr`; the tests call the first more). Zero
config built the row as the tests build it most, so the fix of `_kr` (an epsilon in the
division by each class's count, NaN when a batch holds one class) and its revert were both judged
on a path neither touches: head and base identical, the revert passed. init now writes a second
row for another construction whose settings (flags, mode names, None) differ: `KR(multi_gpu=False)`;
its `y_true`, labels of 1 and -1 in the tests, is drawn from those two values (a set domain), so
the fix direction judges it too (from real values a broken base's `KR()` was NaN on every draw)."""
from __future__ import annotations

import pytest
import yaml

from gate.init.infer import Operator, other_construction
from gate.search.seeds import CallRecord, Opaque, TensorArg
from tests.test_init import _cli, _refresh_then_run_pr, git

LOSSES = '''"""Kantorovich-Rubinstein losses (after deel-lip's deel/lip/losses.py)."""
from functools import partial

import torch


def _kr(y_true, y_pred, epsilon):
    """The KR dual: the mean of y_pred over one class minus over the other."""
    S0 = (y_true == 1).to(y_pred.dtype)
    S1 = (y_true != 1).to(y_pred.dtype)
    {KR}


def _kr_multi_gpu(y_true, y_pred):
    """Labels already scaled by their class's count (process_labels_for_multi_gpu)."""
    return (y_pred * y_true).mean(dim=-1)


class KR(torch.nn.Module):
    def __init__(self, multi_gpu=False, reduction="mean"):
        super().__init__()
        self.multi_gpu, self.reduction = multi_gpu, reduction
        self.kr_function = _kr_multi_gpu if multi_gpu else partial(_kr, epsilon=1e-7)

    def forward(self, y_true, y_pred):
        loss = self.kr_function(y_true, y_pred)
        return loss.mean() if self.reduction == "mean" else loss.sum() if self.reduction == "sum" else loss
'''
FIXED = ("batch = y_true.shape[0]\n    pos = S0 / (S0.sum() + epsilon)\n    neg = S1 / (S1.sum() + epsilon)\n"
         "    return (batch * y_pred * (pos - neg)).mean(dim=-1)")
BROKEN = "return (y_pred * (S0 / S0.mean() - S1 / S1.mean())).mean(dim=-1)"

TESTS = '''import torch

from krlib import KR


def _batch(seed, n=16):
    g = torch.Generator().manual_seed(seed)
    y_true = torch.randint(0, 2, (n, 1), generator=g).float() * 2 - 1
    return y_true, torch.randn(n, 1, generator=g)


def test_kr_default():
    y_true, y_pred = _batch(0)
    assert torch.isfinite(KR()(y_true, y_pred))


def test_kr_multi_gpu():
    loss = KR(multi_gpu=True, reduction="sum")
    for seed in range(4):
        y_true, y_pred = _batch(seed)
        assert torch.isfinite(loss(y_true, y_pred))
'''


def _make(tmp_path, fixed: bool):
    repo = tmp_path / "krrepo"
    pkg = repo / "krlib"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .losses import KR\n")
    (pkg / "losses.py").write_text(LOSSES.replace("{KR}", FIXED if fixed else BROKEN))
    (repo / "tests").mkdir()
    (repo / "tests" / "test_losses.py").write_text(TESTS)
    git(tmp_path, "init", "-q", "-b", "main", str(repo))
    return repo


def _op(init):
    return Operator(name="lib.KR", module="lib", qualname="KR", kind="module", file="lib.py", line=1, init=init)


def _param(name, default=None, required=False):
    return {"name": name, "kind": "POSITIONAL_OR_KEYWORD", "has_default": not required, "default": default,
            "annotation": None}


def _records(*ctors):
    """Constructions ``(ctor id, kwargs, calls on that instance)``."""
    out = []
    t = TensorArg(shape=(4,), dtype="float32")
    for cid, kw, n in ctors:
        out.append(CallRecord(op="lib.KR", args=[], kwargs=kw, kind="init", ctor=str(cid)))
        out += [CallRecord(op="lib.KR", args=[Opaque("KR"), t], kwargs={}, ctor=str(cid)) for _ in range(n)]
    return out


def test_the_other_construction_is_the_one_whose_settings_differ_most():
    op = _op([_param("multi_gpu", False), _param("reduction", "mean"), _param("scale", 1.0)])
    recs = _records((1, {}, 1), (2, {"reduction": "none"}, 1), (3, {"multi_gpu": True, "reduction": "sum"}, 4))
    kw, calls, differ = other_construction(op, recs, {"multi_gpu": True, "reduction": "sum"})
    # the default construction and reduction='none' both differ in two settings: the default first
    assert kw == {} and differ == ["multi_gpu", "reduction"] and len(calls) == 6
    # without the default one (a constructor that needs an argument): the recorded one
    op2 = _op([_param("dim", required=True), _param("multi_gpu", False), _param("reduction", "mean")])
    recs2 = _records((1, {"dim": 4, "reduction": "none"}, 1), (2, {"dim": 8, "multi_gpu": True}, 1),
                     (3, {"dim": 4, "multi_gpu": True, "reduction": "sum"}, 4))
    kw, calls, differ = other_construction(op2, recs2, {"dim": 4, "multi_gpu": True, "reduction": "sum"})
    assert kw == {"dim": 4, "reduction": "none"} and differ == ["multi_gpu", "reduction"] and len(calls) == 1
    # sizes alone pick no other path; neither do the same settings written out
    recs3 = _records((1, {"scale": 2.0}, 1), (2, {"multi_gpu": True}, 3))
    assert other_construction(op, recs3, {"multi_gpu": True}) is not None  # the default one: multi_gpu=False
    assert other_construction(op, _records((1, {"scale": 2.0}, 3), (2, {"multi_gpu": False}, 1)), {"scale": 2.0}) is None
    # None against a value is a setting too (weight=None: the unweighted path)
    op4 = _op([_param("weight", None)])
    assert other_construction(op4, _records((1, {"weight": 0.5}, 3)), {"weight": 0.5})[2] == ["weight"]


@pytest.mark.slow
@pytest.mark.parametrize("base_fixed", [True, False])
def test_both_constructions_are_gated_and_the_revert_of_the_less_called_path_fails(tmp_path, base_fixed):
    """Both directions fail, each for what it does: the revert brings back the NaN of a batch of
    one class; the fix (deel-lip's formula) overflows in float16 where base did not."""
    repo = _make(tmp_path, base_fixed)
    res = _cli(repo, "init", "--no-workflows")
    assert res.returncode == 0, res.stderr
    rows = {r["name"]: r for r in yaml.safe_load((repo / ".dl-gate.yml").read_text())["ops"]}
    assert rows["krlib.KR"]["construct"] == {"multi_gpu": True, "reduction": "sum"}, rows
    # both are built: the tests' y_true are labels of 1 and -1, drawn as such (a set domain); from
    # real values no element is the label 1, a broken base's KR() was NaN on every draw and left out
    assert "construct" not in rows["krlib.KR(multi_gpu=False)"], rows
    y_true = {t["name"]: t for t in rows["krlib.KR(multi_gpu=False)"]["inputs"]}["y_true"]
    assert y_true["domain"] == {"name": "labels", "values": [-1.0, 1.0]}, y_true
    res = _refresh_then_run_pr(repo, tmp_path / "out", 40, repo / "krlib" / "losses.py",
                               LOSSES.replace("{KR}", BROKEN if base_fixed else FIXED),
                               "revert the epsilon" if base_fixed else "epsilon in the KR loss")
    import json

    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    failed = {(v["op"], v["variant"]["dtype"]) for v in report["verdicts"] if v["outcome"] == "regression"}
    if base_fixed:
        assert {op for op, _ in failed} == {"krlib.KR(multi_gpu=False)"}, failed
        return
    # the fix is judged on the path it touches: base's NaN where a batch holds one class is gone...
    improved = {v["variant"]["dtype"] for v in report["verdicts"]
                if v["op"] == "krlib.KR(multi_gpu=False)" and v["outcome"] == "improvement"}
    assert {"bfloat16", "float32"} <= improved, report["verdicts"]
    # ...and the fixed formula's own float16 overflow is found: `batch * y_pred` (deel-lip's order)
    # is 16 x 5000 = 80000 > 65504 where base's `y_pred * (S0 / mean(S0) - ...)` stays finite
    assert failed == {("krlib.KR(multi_gpu=False)", "float16")}, failed
    bad = next(v for v in report["verdicts"] if v["outcome"] == "regression")
    assert bad["reason"].startswith("new NaN/Inf") and "head -inf" in bad["diagnosis"]["worst_element"], bad
