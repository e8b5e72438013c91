"""A Keras layer under a mixed-precision policy, gated end to end (issue 28). Modelled on
keras-team/keras d863dc8a5b: GroupNormalization sets ``self.autocast = False`` so that under a
``mixed_float16`` policy its float32 inputs are not cast to float16 before the group statistics
(the variance of values above 256 overflows float16; its output is still cast to the compute
dtype). The revert only shows under the policy: built at float16 (mode ``input``) the inputs
arrive in float16 and both versions compute the same float16 statistics. Mode ``operator`` of a
Keras layer class builds it with ``dtype="mixed_float16"`` and calls it with float32 inputs, so
the revert fails there, the fix in the other direction passes, and the repro script builds the
layer the same way (exit 1 on head, 0 on base)."""
from __future__ import annotations


import pytest

from tests.helpers.repro import assert_repro_head_then_base
from tests.test_gate_run import gate, git, make_repo

pytest.importorskip("tensorflow")

FIXED = '''import keras
from keras import ops


class GroupNorm(keras.layers.Layer):
    """Group normalization over the last axis (channels), as keras' GroupNormalization."""

    def __init__(self, groups=2, epsilon=1e-3, **kwargs):
        super().__init__(**kwargs)
        self.autocast = False  # statistics from the float32 inputs under a mixed policy
        self.groups = groups
        self.epsilon = epsilon

    def build(self, input_shape):
        self.gamma = self.add_weight(shape=(input_shape[-1],), initializer="ones", name="gamma")
        self.beta = self.add_weight(shape=(input_shape[-1],), initializer="zeros", name="beta")

    def call(self, inputs):
        shape = ops.shape(inputs)
        x = ops.reshape(inputs, (shape[0], self.groups, -1))
        mean = ops.mean(x, axis=-1, keepdims=True)
        variance = ops.mean(ops.square(x - mean), axis=-1, keepdims=True)
        x = ops.reshape((x - mean) * ops.rsqrt(variance + self.epsilon), shape)
        x = x * ops.cast(self.gamma, x.dtype) + ops.cast(self.beta, x.dtype)
        return ops.cast(x, self.compute_dtype)
'''

AUTOCAST_OFF = "        self.autocast = False  # statistics from the float32 inputs under a mixed policy\n"
REVERTED = FIXED.replace(AUTOCAST_OFF, "")
assert REVERTED != FIXED

CONFIG = '''version: 1
framework: tensorflow
python_path: ["."]
builtin: false
budget: {localise: 8}  # the bed judges verdicts and runs the repro: localisation gets a short share
gate: {dtypes: [float16]}
ops:
  - name: mylib.GroupNorm
    callable: mylib.ops:GroupNorm
    kind: normalization
    sources: [mylib/ops.py]
    modes: [input, operator]
    dims: {N: [1, 4], D: [2, 16]}
    inputs: [{name: x, shape: [N, "2*D"]}]
'''

MIXED, INPUT = "float16/cpu/operator", "float16/cpu/input"


def _pr(tmp_path, base_src, head_src, name):
    repo = make_repo(tmp_path / name, ops_src=base_src, config=CONFIG)  # baselines refreshed on main
    git(repo, "checkout", "-q", "-b", f"pr-{name}")
    (repo / "mylib" / "ops.py").write_text(head_src)
    git(repo, "commit", "-q", "-am", name)
    return repo


def _why(report):
    return [(v.key, v.outcome, v.reason) for v in report.verdicts]


@pytest.mark.tf
def test_reverting_the_autocast_off_fails_under_the_mixed_policy_only(tmp_path):
    repo = _pr(tmp_path, FIXED, REVERTED, "revert")
    code, report = gate(repo, tmp_path, evals=40)
    by_key = {v.key: v for v in report.verdicts}
    assert set(by_key) == {INPUT, MIXED}, _why(report)
    v = by_key[MIXED]
    assert (code, v.outcome) == (1, "regression"), _why(report)
    assert v.head_error > 100 * max(v.base_error, 1.0), (v.head_error, v.base_error)  # ~1e3 ulp vs < 1 ulp
    # built at float16 both versions compute float16 statistics: mode input cannot see the revert
    assert by_key[INPUT].outcome == "pass", _why(report)
    assert not any(x.outcome == "not-measured" for x in report.verdicts), _why(report)
    script = v.diagnosis["repro_script"]
    assert 'MODE = \'operator\'' in open(script).read()
    assert_repro_head_then_base(script, repo)


@pytest.mark.tf
def test_turning_autocast_off_passes(tmp_path):
    repo = _pr(tmp_path, REVERTED, FIXED, "fix")
    code, report = gate(repo, tmp_path, evals=40)
    assert code == 0, _why(report)
    by_key = {v.key: v for v in report.verdicts}
    assert by_key[MIXED].outcome == "improvement", _why(report)
    assert by_key[INPUT].outcome == "pass", _why(report)
