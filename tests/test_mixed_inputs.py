"""Inputs and parameters real callers pass (issue 12): an input that keeps its own dtype, and a
parameter that is an object (an enum member) named by import path.

* Rotary embeddings keep their positions/angles in float32 while q/k are bfloat16 (the fix
  several libraries made, e.g. Hugging Face transformers computing RoPE's cos/sin in float32
  under bf16 autocast, and rotary-embedding-torch's float32 ``freqs``). The revert casts the
  positions to q's dtype: position 1000 becomes 1000 in bf16 but 1001 becomes 1000 too.
  With ``dtype: float32`` on the positions input the gate keeps them float32 (before, every float
  input was cast to the variant's dtype, so base saw the same rounded positions and the revert
  passed).
* ``order: {import: lib.ops.Order.WXYZ}``: a parameter that is an enum member (as kornia's
  QuaternionCoeffOrder) reaches the operator as the member, not as a string.
"""
from __future__ import annotations

import pytest

from tests.test_gate_run import by_op, gate, make_repo, commit_pr

OPS = '''
import enum

import torch


class Order(enum.Enum):
    WXYZ = "wxyz"
    XYZW = "xyzw"


def rotate(q, pos):
    d = q.shape[-1] // 2
    inv_freq = 1.0 / (10000.0 ** (torch.arange(d, dtype=torch.float32) / d))
    ang = pos.float()[..., None] * inv_freq  # angles in float32 whatever q's dtype
    cos, sin = ang.cos().to(q.dtype), ang.sin().to(q.dtype)
    q1, q2 = q[..., :d], q[..., d:]
    return torch.cat([q1 * cos - q2 * sin, q1 * sin + q2 * cos], dim=-1)


def quat_norm(q, order):
    w = q[..., 0] if order.name == "WXYZ" else q[..., 3]
    return q / q.norm(dim=-1, keepdim=True).clamp_min(1e-12) * torch.sign(w + 0.5)[..., None]
'''

CONFIG = '''
version: 1
framework: torch
python_path: ["."]
builtin: false
gate: {dtypes: [bfloat16]}
ops:
  - name: lib.rotate
    callable: lib.ops:rotate
    sources: [lib/ops.py]
    grad: false
    layouts: {}
    dims: {N: [1, 16], D: [2, 8]}
    inputs:
      - {name: q, shape: [N, "2*D"]}
      - {name: pos, shape: [N], dtype: float32, domain: {lo: 0, hi: 4096, scale: 1500}}
  - name: lib.quat_norm
    callable: lib.ops:quat_norm
    sources: [lib/ops.py]
    grad: false
    layouts: {}
    dims: {N: [1, 16]}
    inputs: [{name: q, shape: [N, 4]}]
    params:
      order: {choices: [{import: lib.ops.Order.WXYZ}, {import: "lib.ops:Order.XYZW"}]}
'''

PRS = {
    "angles": ("ang = pos.float()[..., None] * inv_freq", "ang = pos.to(q.dtype)[..., None] * inv_freq.to(q.dtype)"),
    "refactor": ("    q1, q2 = q[..., :d], q[..., d:]\n", "    q1 = q[..., :d]\n    q2 = q[..., d:]\n"),
    "quat": ("q / q.norm(dim=-1, keepdim=True).clamp_min(1e-12)", "q / torch.linalg.vector_norm(q, dim=-1, keepdim=True).clamp_min(1e-12)"),
}


@pytest.fixture(scope="module")
def lib_repo(tmp_path_factory):
    return make_repo(tmp_path_factory.mktemp("mixed"), OPS, config=CONFIG, package="lib")


def pr(repo, name):
    commit_pr(repo, f"pr-{name}", "main", *PRS[name])


def test_positions_cast_to_bf16_fail_when_the_input_keeps_float32(lib_repo, tmp_path):
    pr(lib_repo, "angles")
    code, report = gate(lib_repo, tmp_path, "--ops", "lib.rotate", "--mode", "input", evals=30)
    (v,) = by_op(report, "lib.rotate")
    assert code == 1 and v.outcome == "regression", (v.outcome, v.reason)


def test_a_refactor_of_the_rotary_passes(lib_repo, tmp_path):
    pr(lib_repo, "refactor")
    for seed in range(2):
        code, report = gate(lib_repo, tmp_path, "--ops", "lib.rotate", seed=seed, evals=30)
        assert code == 0, [(v.id, v.outcome, v.reason) for v in report.verdicts]


def test_an_enum_parameter_by_import_path_reaches_the_operator(lib_repo, tmp_path):
    pr(lib_repo, "quat")  # a benign change of the norm: every evaluation must run, and pass
    code, report = gate(lib_repo, tmp_path, "--ops", "lib.quat_norm", "--mode", "input", evals=30)
    (v,) = by_op(report, "lib.quat_norm")
    assert code == 0 and v.outcome == "pass", (v.outcome, v.reason)
    assert v.details.get("pairs", 0) > 0


def test_an_unimportable_parameter_is_a_one_line_error(tmp_path):
    from gate.errors import ConfigError
    from gate.ops.spec import ImportRef, resolve_params

    with pytest.raises(ConfigError, match=r"lib.op: parameter order: cannot import no_such_pkg.Order.A"):
        resolve_params({"order": ImportRef("no_such_pkg.Order.A")}, "lib.op")
