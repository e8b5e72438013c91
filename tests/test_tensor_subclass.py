"""A library whose operators are methods of its own tensor subclass (seung-lab/torchfields: a
`DisplacementField(torch.Tensor)` whose `vote`, `get_vote_weights`, ... are voting.py's functions
taking the field as `self`, and call the field's other methods). Zero config left every one of them
out ("'Tensor' object has no attribute 'get_vote_shape'": the gate passed plain tensors), so the
revert of torchfields' 0d44d9e (an `exp` that underflows to 0/0 in place of a softmax) passed.
The recorder now notes the library's tensor subclass of each tensor argument, init writes it as
the input's `subclass`, and the gate makes the input an instance of it (`Tensor.as_subclass`)."""
from __future__ import annotations

import sys
import types

import pytest
import torch
import yaml

from gate.fuzz import fuzz_task
from gate.ops.catalog import builtin_defaults
from gate.ops.spec import OpSpec
from gate.plan import Budget, Task, Variant
from gate.search import harvest_hook
from tests.test_init import _cli, _refresh_then_run_pr, git

FIELDS = '''"""A field of 2-vectors whose methods are the library's operators."""
import torch

from . import voting


class Field(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return super().__torch_function__(func, types, args, kwargs or {})

    def distances(self):
        """Each vote's distance to the mean vote (votes on dim 0, components on dim 1)."""
        return (self - self.mean(dim=0, keepdim=True)).pow(2).sum(dim=1).sqrt()

    def vote_weights(self, softmin_temp=1.0):
        return voting.vote_weights(self, softmin_temp)
'''

VOTING = '''"""Voting over fields (after torchfields.voting)."""
import torch


def vote_weights(self, softmin_temp=1.0):
    """Weights of the votes: a softmin of their distances to the mean."""
    d = self.distances()
    {WEIGHTS}
'''
FIXED = "return (-d / softmin_temp).softmax(dim=0)"
BROKEN = "num = torch.exp(-d / softmin_temp)\n    return num / num.sum(dim=0, keepdim=True)"

TESTS = '''import torch

from fieldlib import Field


def test_vote_weights():
    torch.manual_seed(0)
    f = torch.randn(3, 2, 4, 4).as_subclass(Field)
    w = f.vote_weights(softmin_temp=1.0)
    assert w.shape == (3, 4, 4)
    assert torch.allclose(w.sum(dim=0), torch.ones(4, 4))
'''


def _make(tmp_path, fixed: bool):
    repo = tmp_path / "fieldrepo"
    pkg = repo / "fieldlib"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .fields import Field\nfrom .voting import vote_weights\n")
    (pkg / "fields.py").write_text(FIELDS)
    (pkg / "voting.py").write_text(VOTING.replace("{WEIGHTS}", FIXED if fixed else BROKEN))
    (repo / "tests").mkdir()
    (repo / "tests" / "test_voting.py").write_text(TESTS)
    git(tmp_path, "init", "-q", "-b", "main", str(repo))
    return repo


class Sub(torch.Tensor):
    pass


def test_the_recorder_notes_a_tensor_subclass_and_not_torchs_own_tensors():
    arrays = {}
    assert harvest_hook._encode(torch.ones(2).as_subclass(Sub), arrays, 16)["cls"] == f"{__name__}:Sub"
    assert "cls" not in harvest_hook._encode(torch.ones(2), arrays, 16)
    assert "cls" not in harvest_hook._encode(torch.nn.Parameter(torch.ones(2)), arrays, 16)
    # a library whose name starts with "torch" (torchfields) is not torch
    Sub.__module__ = "torchlike_lib_fields"
    sys.modules["torchlike_lib_fields"] = types.SimpleNamespace(Sub=Sub)
    try:
        assert harvest_hook._encode(torch.ones(2).as_subclass(Sub), arrays, 16)["cls"] == "torchlike_lib_fields:Sub"
    finally:
        Sub.__module__ = __name__
        del sys.modules["torchlike_lib_fields"]

    class Local(torch.Tensor):  # no import path names it: noted as a plain tensor
        pass

    assert "cls" not in harvest_hook._encode(torch.ones(2).as_subclass(Local), arrays, 16)


def test_the_gate_passes_the_input_as_its_subclass(tmp_path, monkeypatch):
    pkg = tmp_path / "fieldlib"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .fields import Field\nfrom .voting import vote_weights\n")
    (pkg / "fields.py").write_text(FIELDS)
    (pkg / "voting.py").write_text(VOTING.replace("{WEIGHTS}", FIXED))
    monkeypatch.syspath_prepend(str(tmp_path))
    row = {"name": "fieldlib.vote_weights", "callable": "fieldlib.voting:vote_weights", "grad": False,
           "inputs": [{"name": "self", "shape": [3, 2, 4, 4]}]}

    def search(row):
        spec = OpSpec.from_dict(row, builtin_defaults("torch"), origin="user")
        return fuzz_task(Task(op=spec, variant=Variant("float16"), budget=Budget(evals=20), seed=0))

    plain = search(row)  # a plain tensor has no distances(): nothing runs
    said = " ".join([plain.message or ""] + [c.message for c in plain.crashes])
    assert plain.metrics is None and "distances" in said, (plain.status, said)
    row["inputs"][0]["subclass"] = "fieldlib.fields:Field"
    sub = search(row)
    assert sub.status == "ok" and sub.metrics is not None and not sub.crashes and sub.evals >= 20, sub.message


@pytest.mark.slow
@pytest.mark.parametrize("base_fixed", [True, False])
def test_init_gates_the_subclass_method_and_the_revert_fails_the_fix_passes(tmp_path, base_fixed):
    repo = _make(tmp_path, base_fixed)
    res = _cli(repo, "init", "--no-workflows")
    assert res.returncode == 0, res.stderr
    rows = {r["name"]: r for r in yaml.safe_load((repo / ".dl-gate.yml").read_text())["ops"]}
    assert rows["fieldlib.vote_weights"]["inputs"][0]["subclass"] == "fieldlib.fields:Field", rows
    res = _refresh_then_run_pr(repo, tmp_path / "out", 60, repo / "fieldlib" / "voting.py",
                               VOTING.replace("{WEIGHTS}", BROKEN if base_fixed else FIXED),
                               "revert the softmax" if base_fixed else "softmax")
    assert res.returncode == (1 if base_fixed else 0), res.stdout[-3000:] + res.stderr[-3000:]
