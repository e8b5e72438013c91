"""Gradients are checked where the operator is differentiable, found by probing (issue 12,
item 4): an operator whose outputs carry no gradient (integer outputs, ``torch.no_grad``,
``.detach()``) gets "gradient not checked", not a pass on zeros; a PR that makes a
differentiable operator lose its gradient fails.

The bed is modelled on pytorch/ignite#1675 ("Move detach outside of loss function
computation", fixing #1674): ignite's ``Loss`` metric detached ``y_pred`` before calling the
loss, so a loss computed through it trained nothing; the fix moved the detach after the loss.
The forward value is bit-identical either way: only the gradient variant can tell."""
import pytest

from tests.test_gate_run import by_op, gate, git, make_repo, commit_pr
from tests.helpers.repro import run_script

OPS = '''
import torch


def nll_loss(y_pred, y):
    logp = torch.log_softmax(y_pred, dim=-1)
    return -logp.gather(-1, y[:, None]).squeeze(-1)


def nll_loss_reference(y_pred, y):
    y_pred = y_pred - y_pred.logsumexp(-1, keepdim=True)
    return -y_pred.gather(-1, y[:, None]).squeeze(-1)


def top_index(x):
    return x.argmax(dim=-1)
'''

CONFIG = '''
version: 1
framework: torch
python_path: ["."]
builtin: false
gate: {dtypes: [float32]}
ops:
  - {name: lib.nll_loss, callable: "lib.ops:nll_loss", sources: [lib/ops.py], layouts: {}, dims: {N: [1, 4], D: [2, 16]},
     inputs: [{name: y_pred, shape: [N, D]}, {name: y, shape: [N], kind: index, index_hi: D}]}
  - {name: lib.nll_loss_vs_reference, callable: "lib.ops:nll_loss", reference: "lib.ops:nll_loss_reference",
     sources: [lib/ops.py], layouts: {}, dims: {N: [1, 4], D: [2, 16]},
     inputs: [{name: y_pred, shape: [N, D]}, {name: y, shape: [N], kind: index, index_hi: D}]}
  - {name: lib.top_index, callable: "lib.ops:top_index", sources: [lib/ops.py], layouts: {}, dims: {N: [1, 4], D: [1, 16]},
     inputs: [{name: x, shape: [N, D]}]}
'''

PRS = {
    "detach": ("torch.log_softmax(y_pred, dim=-1)", "torch.log_softmax(y_pred.detach(), dim=-1)"),
    "refactor": ("-logp.gather(-1, y[:, None]).squeeze(-1)", "-torch.gather(logp, 1, y.unsqueeze(1))[:, 0]"),
    "index": ("x.argmax(dim=-1)", "torch.argmax(x, dim=-1)"),
}


@pytest.fixture(scope="module")
def lib_repo(tmp_path_factory):
    return make_repo(tmp_path_factory.mktemp("gradprobe"), OPS, config=CONFIG, package="lib")


def pr(repo, name):
    commit_pr(repo, f"pr-{name}", "main", *PRS[name])


def grad_rows(report, op):
    return [v for v in by_op(report, op) if v.variant.get("oracle") == "grad"]


# without a reference the float64 run of the operator itself has no gradient on head; with one
# (a kernel library's pure-torch reference) the reference has a gradient and the operator not
@pytest.mark.parametrize("op", ["lib.nll_loss", "lib.nll_loss_vs_reference"])
def test_a_loss_that_detaches_its_input_fails_on_the_gradient(lib_repo, tmp_path, op):
    pr(lib_repo, "detach")
    code, report = gate(lib_repo, tmp_path, "--ops", op, evals=20)
    (g,) = grad_rows(report, op)
    fwd = [v for v in by_op(report, op) if v.variant.get("oracle", "precision") == "precision"]
    assert code == 1 and g.outcome == "regression" and "gradient lost" in g.reason, (g.outcome, g.reason)
    assert fwd and all(v.outcome == "pass" for v in fwd), [(v.id, v.outcome, v.reason) for v in fwd]
    d = g.diagnosis or {}
    assert d.get("minimal_input") and any(c.get("line") == 6 for c in d.get("changed_code") or []), d
    # the repro reproduces on head (exit 1) and not on base (exit 0)
    import subprocess
    import sys

    def repro():
        return run_script([d["repro_script"], "--repo", str(lib_repo)])

    on_head = repro()
    assert on_head.returncode == 1 and "not differentiable" in on_head.stdout, on_head.stdout + on_head.stderr
    git(lib_repo, "checkout", "-q", "main")
    on_base = repro()
    assert on_base.returncode == 0, on_base.stdout + on_base.stderr


@pytest.mark.parametrize("op", ["lib.nll_loss", "lib.nll_loss_vs_reference"])
def test_the_fix_that_takes_the_detach_out_passes(lib_repo, tmp_path, op):
    # ignite #1675 itself: base detaches (no gradient), head computes the loss on the live tensor
    old, new = PRS["detach"]
    commit_pr(lib_repo, "pr-detach", "main", old, new)
    commit_pr(lib_repo, "fix-detach", "pr-detach", new, old)
    code, report = gate(lib_repo, tmp_path, "--ops", op, "--base", "pr-detach", evals=20)
    (g,) = grad_rows(report, op)
    assert code in (0, 3) and g.outcome in ("pass", "improvement", "needs-baseline"), (g.outcome, g.reason)


def test_the_refactor_of_the_loss_passes(lib_repo, tmp_path):
    pr(lib_repo, "refactor")
    code, report = gate(lib_repo, tmp_path, "--ops", "lib.nll_loss", evals=20)
    assert code == 0, [(v.id, v.outcome, v.reason) for v in report.verdicts]


def test_an_operator_without_gradient_is_not_checked_rather_than_passed_on_zeros(lib_repo, tmp_path):
    pr(lib_repo, "index")
    code, report = gate(lib_repo, tmp_path, "--ops", "lib.top_index", evals=10)
    (g,) = grad_rows(report, "lib.top_index")
    assert code == 0 and g.outcome == "unsupported" and g.reason.startswith("gradient not checked: not differentiable"), \
        (g.outcome, g.reason)
