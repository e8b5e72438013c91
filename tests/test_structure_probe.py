"""A row that declares no ``kind`` is elementwise by default; before its gradients are judged,
the gate asks the operator whether it is (gate.judge.structure, issue 31).

Beds, both modelled on real code:

* a hand-written attention whose softmax shift goes ``amax`` -> ``max`` (transformers and
  PyTorch's decompositions made the reverse move; equal in value, the gradient of tied scores is
  routed differently): written without ``kind:``, its float16 gradient failed as a regression on
  8 seeds of 8 ("7.33e+03 ulp > 16 (max(floor 2, 24 x base 0.667))": a residue of O(1) terms
  read per element), its float32 one on 1 of 8; declared ``kind: attention`` it never did.
* a hand-written layer norm whose variance goes from two passes to ``E[x^2] - E[x]^2`` (the
  revert of PyTorch #55044, apache/tvm #19643, sherpa-onnx #3857): the revert still fails on its
  gradient variant too, and the fix passes.
"""
from __future__ import annotations


import numpy as np
import pytest

from gate.config import parse_config
from gate.judge.structure import (COUPLED, ELEMENTWISE, UNKNOWN, Probe, decide_structure, judged_for_grad,
                                  needs_probe, probe_structure)

from tests.test_gate_run import by_op, make_repo
from tests.test_verdict_bed import branch
import tests.test_zero_results as zero


def test_the_verdict_reads_which_outputs_moved():
    x = np.arange(6.0).reshape(2, 3)
    own = x.copy()
    own[0, 1] = 9.0
    p = Probe("x", 1, (2, 3))
    assert decide_structure([x], [(p, [own])]).result == ELEMENTWISE
    other = own.copy()
    other[1, 2] = -1.0
    found = decide_structure([x], [(p, [other])])
    assert found.result == COUPLED and "moved 1 other element" in found.evidence
    # a bias of shape [3] broadcast over the rows: its element 1 reaches column 1 of every row
    col = x.copy()
    col[:, 1] = 7.0
    assert decide_structure([x], [(Probe("b", 1, (3,)), [col])]).result == ELEMENTWISE
    # a reduction: an output the input does not broadcast to
    found = decide_structure([np.array([15.0])], [(p, [np.array([16.0])])])
    assert found.result == COUPLED and "does not broadcast" in found.evidence
    # nothing moved, NaN where it was NaN, or nothing ran: no evidence, the row stays as declared
    nan = x.copy()
    nan[0, 0] = np.nan
    assert decide_structure([nan], [(p, [nan.copy()])]).result == UNKNOWN
    assert decide_structure(None, [(p, [x])]).result == UNKNOWN
    assert decide_structure([x], [(p, None)]).result == UNKNOWN


ROWS = """version: 1
framework: torch
builtin: false
ops:
  - {name: sin, callable: "torch.sin", dims: {N: [2, 8]}, inputs: [{name: x, shape: [N]}]}
  - {name: add, callable: "torch.add", dims: {N: [2, 8], M: [2, 4]}, inputs: [{name: x, shape: [M, N]}, {name: y, shape: [N]}]}
  - {name: softmax, callable: "torch.softmax", dims: {N: [2, 8]}, inputs: [{name: x, shape: [N]}], params: {dim: -1}}
  - {name: cumsum, callable: "torch.cumsum", dims: {N: [2, 8]}, inputs: [{name: x, shape: [N]}], params: {dim: 0}}
  - {name: sum, callable: "torch.sum", dims: {N: [2, 8]}, inputs: [{name: x, shape: [N]}]}
  - {name: declared, callable: "torch.softmax", kind: normalization, dims: {N: [2, 8]}, inputs: [{name: x, shape: [N]}], params: {dim: -1}}
  - {name: floor, callable: "torch.softmax", ulp_floor: dtype, dims: {N: [2, 8]}, inputs: [{name: x, shape: [N]}], params: {dim: -1}}
"""


def test_operators_are_told_apart_by_running_them():
    ops = {o.name: o for o in parse_config(ROWS).ops}
    assert not needs_probe(ops["declared"]) and not needs_probe(ops["floor"])  # the row said: no probe
    found = {n: probe_structure(ops[n]) for n in ("sin", "add", "softmax", "cumsum", "sum")}
    assert {n: f.result for n, f in found.items()} == {"sin": ELEMENTWISE, "add": ELEMENTWISE, "softmax": COUPLED,
                                                       "cumsum": COUPLED, "sum": COUPLED}, found
    assert judged_for_grad(ops["softmax"], found["softmax"]).ulp_floor == "output"
    assert judged_for_grad(ops["sin"], found["sin"]).ulp_floor == "dtype"


def test_an_undeclared_attention_is_not_failed_on_the_residue_of_its_gradient(tmp_path):
    cfg = zero.CONFIG.replace(" kind: attention,", "")
    assert "kind" not in cfg
    repo = make_repo(tmp_path / "bed", zero.OPS, config=cfg, package="lib")
    branch(repo, "to-max", "main", zero.AMAX, zero.MAX)
    code, report, rows, grads = zero.run_branch(repo, "to-max", tmp_path / "out", "main", "lib.attention",
                                                dtype="float16")
    assert grads and all(v.outcome != "regression" for v in grads), rows
    assert code != 1 and report.outcome != "regression", rows
    assert report.env["structure"]["lib.attention"]["result"] == COUPLED
    assert report.env["structure"]["lib.attention"]["side"] == "base"


LAYER_NORM = '''
import torch


def layer_norm(x, weight, eps: float = 1e-5):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * weight
'''

LN_CONFIG = '''
version: 1
framework: torch
python_path: ["."]
builtin: false
budget: {localise: 10}
ops:
  - {name: lib.layer_norm, callable: "lib.ops:layer_norm", sources: [lib/ops.py], dims: {N: [1, 4], D: [4, 16]},
     inputs: [{name: x, shape: [N, D]}, {name: weight, shape: [D]}]}
'''
TWO_PASS = "var = ((x - mean) ** 2).mean(-1, keepdim=True)"
ONE_PASS = "var = (x * x).mean(-1, keepdim=True) - mean * mean"


@pytest.fixture(scope="module")
def ln_bed(tmp_path_factory):
    repo = make_repo(tmp_path_factory.mktemp("ln"), LAYER_NORM, config=LN_CONFIG, package="lib")
    branch(repo, "one-pass", "main", TWO_PASS, ONE_PASS)  # the revert
    branch(repo, "two-pass", "one-pass", ONE_PASS, TWO_PASS)  # the fix
    return repo


def test_an_undeclared_layer_norm_still_fails_its_variance_revert_on_its_gradient(ln_bed, tmp_path):
    code, report, rows, grads = zero.run_branch(ln_bed, "one-pass", tmp_path / "out", "main", "lib.layer_norm")
    assert code == 1, rows
    assert grads and all(v.outcome == "regression" for v in grads), rows
    assert report.env["structure"]["lib.layer_norm"]["result"] == COUPLED


def test_an_undeclared_layer_norm_passes_its_variance_fix(ln_bed, tmp_path):
    code, report, rows, _ = zero.run_branch(ln_bed, "two-pass", tmp_path / "out", "one-pass", "lib.layer_norm")
    assert code == 0 and all(v.outcome in ("pass", "improvement") for v in by_op(report, "lib.layer_norm")), rows
