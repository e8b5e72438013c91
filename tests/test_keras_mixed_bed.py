"""A Keras layer under a mixed-precision policy, gated end to end (issue 28). Modelled on
keras-team/keras d863dc8a5b: GroupNormalization sets ``self.autocast = False`` so that under a
``mixed_float16`` policy its float32 inputs are not cast to float16 before the group statistics
(the variance of values above 256 overflows float16; its output is still cast to the compute
dtype). The revert only shows under the policy: built at float16 (mode ``input``) the inputs
arrive in float16 and both versions compute the same float16 statistics. Mode ``operator`` of a
Keras layer class builds it with ``dtype="mixed_float16"`` and calls it with float32 inputs, so
the revert fails there, the fix in the other direction passes, and the repro script builds the
layer the same way (exit 1 on head, 0 on base).

keras' own GroupNormalization computes its statistics in float32 whatever its inputs (it casts
them up before ``ops.moments``), so there the revert shows only where a float32 input is beyond
float16's range: the policy's cast makes it inf (the fix's "inputs above the float16 max
overflowed to inf and produced NaN outputs"). ``UpcastNorm`` is that layer: mode ``operator``
draws float32 inputs (not values of the variant's dtype), and its revert fails with new NaN/Inf."""
from __future__ import annotations


import pytest

from tests.helpers import require_module
from tests.helpers.repro import assert_repro_head_then_base
from tests.test_gate_run import gate, git, make_repo

require_module("tensorflow")  # skipped where it is not installed; imported where a test needs it

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

UPCAST = """

class UpcastNorm(keras.layers.Layer):
    \"\"\"keras' GroupNormalization (groups=1): statistics in float32 after an explicit upcast.\"\"\"

    def __init__(self, epsilon=1e-3, **kwargs):
        super().__init__(**kwargs)
        self.autocast = False  # statistics from the float32 inputs under a mixed policy
        self.epsilon = epsilon

    def call(self, inputs):
        dtype = inputs.dtype
        x = ops.cast(inputs, "float32")
        mean, variance = ops.moments(x, axes=[-1], keepdims=True)
        x = (x - mean) * ops.rsqrt(variance + self.epsilon)
        return ops.cast(ops.cast(x, dtype), self.compute_dtype)
"""

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

UPCAST_CONFIG = CONFIG.split("ops:")[0] + '''ops:
  - name: mylib.UpcastNorm
    callable: mylib.ops:UpcastNorm
    kind: normalization
    sources: [mylib/ops.py]
    modes: [input, operator]
    dims: {N: [1, 4], D: [2, 16]}
    inputs: [{name: x, shape: [N, D]}]
'''

MIXED, INPUT = "float16/cpu/operator", "float16/cpu/input"


def _pr(tmp_path, base_src, head_src, name, config=CONFIG):
    repo = make_repo(tmp_path / name, ops_src=base_src, config=config)  # baselines refreshed on main
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
    # a user TensorFlow row's gradient is checked by default too: built at float16 both versions
    # compute the same backward
    assert set(by_key) == {INPUT, MIXED, INPUT + "/grad"} and by_key[INPUT + "/grad"].outcome == "pass", _why(report)
    v = by_key[MIXED]
    assert (code, v.outcome) == (1, "regression"), _why(report)
    # float16 statistics: ~1e3 ulp vs < 1 ulp on inputs within float16's range, NaN on the float32
    # inputs beyond it that mode operator draws (what a layer under the policy receives)
    assert "new NaN/Inf" in v.reason or v.head_error > 100 * max(v.base_error, 1.0), (v.reason, v.head_error)
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


@pytest.mark.tf
@pytest.mark.parametrize("direction", ["revert", "fix"])
def test_an_upcasting_layer_is_fed_float32_values_beyond_float16_under_the_mixed_policy(tmp_path, direction):
    fixed = FIXED.split("\n\n\nclass")[0] + UPCAST
    reverted = fixed.replace(AUTOCAST_OFF, "")
    assert reverted != fixed
    base, head = (fixed, reverted) if direction == "revert" else (reverted, fixed)
    repo = _pr(tmp_path, base, head, direction, UPCAST_CONFIG)
    code, report = gate(repo, tmp_path, evals=40)
    by_key = {v.key: v for v in report.verdicts}
    if direction == "fix":
        assert code == 0 and by_key[MIXED].outcome in ("improvement", "pass"), _why(report)
        return
    v = by_key[MIXED]
    assert (code, v.outcome) == (1, "regression") and "new NaN/Inf" in v.reason, _why(report)
    assert by_key[INPUT].outcome == "pass", _why(report)  # float16 inputs: the same float32 statistics
