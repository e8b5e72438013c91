"""A Keras layer named by its class, gated end to end at float16 (issue 28: a layer built
without arguments keeps its float32 dtype policy, so every run computed in float32 and a float16
overflow regression passed). Modelled on the RMSNorm layers of keras-hub and transformers, which
take the mean square in float32 whatever the layer's dtype; the pull request drops that upcast
(x² overflows float16 above 256: the row's scale becomes 0). The gate builds the layer in each
run's dtype, finds the regression, and the fix in the other direction passes; the repro script
reproduces on head only."""
from __future__ import annotations


import pytest

from tests.helpers import require_module
from tests.helpers.repro import assert_repro_head_then_base
from tests.test_gate_run import gate, git, make_repo

require_module("tensorflow")  # skipped where it is not installed; imported where a test needs it

UPCAST = '''import keras
from keras import ops


class RMSNorm(keras.layers.Layer):
    def __init__(self, epsilon=1e-6, **kwargs):
        super().__init__(**kwargs)
        self.epsilon = epsilon

    def call(self, x):
        # the mean square in float32 whatever the layer's dtype: x*x overflows float16 above 256
        x32 = ops.cast(x, "float32")
        var = ops.mean(ops.square(x32), axis=-1, keepdims=True)
        return ops.cast(x32 * ops.rsqrt(var + self.epsilon), x.dtype)
'''

NO_UPCAST = UPCAST.replace('''        # the mean square in float32 whatever the layer's dtype: x*x overflows float16 above 256
        x32 = ops.cast(x, "float32")
        var = ops.mean(ops.square(x32), axis=-1, keepdims=True)
        return ops.cast(x32 * ops.rsqrt(var + self.epsilon), x.dtype)
''', '''        var = ops.mean(ops.square(x), axis=-1, keepdims=True)
        return x * ops.rsqrt(var + self.epsilon)
''')

CONFIG = '''version: 1
framework: tensorflow
python_path: ["."]
builtin: false
gate: {dtypes: [float16], modes: [input]}
ops:
  - name: mylib.RMSNorm
    callable: mylib.ops:RMSNorm
    kind: normalization
    sources: [mylib/ops.py]
    dims: {N: [1, 4], D: [2, 32]}
    inputs: [{name: x, shape: [N, D]}]
'''


def _pr(tmp_path, base_src, head_src, name):
    repo = make_repo(tmp_path / name, ops_src=base_src, config=CONFIG)
    git(repo, "checkout", "-q", "-b", f"pr-{name}")
    (repo / "mylib" / "ops.py").write_text(head_src)
    git(repo, "commit", "-q", "-am", name)
    return repo


@pytest.mark.tf
@pytest.mark.slow
def test_dropping_the_float32_upcast_of_a_keras_layer_class_fails_at_float16(tmp_path):
    repo = _pr(tmp_path, UPCAST, NO_UPCAST, "revert")
    code, report = gate(repo, tmp_path, evals=60)
    by_key = {v.key: v for v in report.verdicts}
    v = by_key["float16/cpu/input"]
    assert (code, v.outcome) == (1, "regression"), [(x.key, x.outcome, x.reason) for x in report.verdicts]
    assert "ulp >" in v.reason or "new NaN/Inf" in v.reason, v.reason
    assert not any(x.outcome == "not-measured" for x in report.verdicts), [(x.key, x.reason) for x in report.verdicts]
    script = v.diagnosis["repro_script"]
    assert_repro_head_then_base(script, repo)


@pytest.mark.tf
@pytest.mark.slow
def test_adding_the_upcast_passes(tmp_path):
    repo = _pr(tmp_path, NO_UPCAST, UPCAST, "fix")
    code, report = gate(repo, tmp_path, evals=60)
    assert code == 0, [(x.key, x.outcome, x.reason) for x in report.verdicts]
    assert {v.outcome for v in report.verdicts} <= {"pass", "improvement"}, [(x.key, x.outcome) for x in report.verdicts]


def test_a_keras_layers_initial_weights_do_not_depend_on_the_processs_global_generators():
    """Keras draws an unseeded initializer's seed from Python's ``random`` when the layer is
    constructed; a forked worker's ``random`` is reseeded at the fork, so head's worker and
    base's built a layer with other weights (a behaviour change where nothing changed). The gate
    constructs with the global generators seeded (gate.backends.base._seeded_globals)."""
    import random

    import numpy as np

    from gate.backends.base import resolve_callable

    x = np.linspace(-1.0, 1.0, 6, dtype="float32").reshape(2, 3)
    outs = []
    for state in (1, 2):
        random.seed(state)
        np.random.seed(state)
        outs.append(np.asarray(resolve_callable("keras.layers:Dense", (("units", 4),))(x)))
    assert np.array_equal(outs[0], outs[1])


LEGACY = '''import tf_keras


class HardNegatives(tf_keras.layers.Layer):  # TFRS's HardNegativeMining on tf.keras 2: no **kwargs, no dtype=
    def __init__(self, scale):
        super().__init__()
        self._scale = scale

    def call(self, logits):
        return logits * self._scale
'''


def test_a_tf_keras_2_layer_without_dtype_is_given_its_policy(tmp_path, monkeypatch):
    """tf.keras 2 (the tf_keras package, TF_USE_LEGACY_KERAS=1: tensorflow/recommenders, deel-lip)
    has a read-only ``dtype_policy``; a layer whose constructor takes no ``dtype=`` (TFRS's
    HardNegativeMining, Retrieval, BruteForce) was left out, "its dtype policy cannot be set".
    It is set through the layer's own ``_set_dtype_policy``."""
    import importlib.util

    if importlib.util.find_spec("tf_keras") is None:
        pytest.skip("tf_keras (tf.keras 2) is not installed")
    import numpy as np

    from gate.backends.base import resolve_callable

    (tmp_path / "legacylayers.py").write_text(LEGACY)
    monkeypatch.syspath_prepend(str(tmp_path))
    op = resolve_callable("legacylayers:HardNegatives", (("scale", 2.0),))
    for dtype in ("float16", "mixed_float16"):
        layer = op.at(dtype)
        out = np.asarray(layer(np.linspace(-1.0, 1.0, 8, dtype="float32").reshape(2, 4)))
        assert out.dtype == np.float16, (dtype, out.dtype)


SHAPED = '''import {keras}


class PairSort({keras}.layers.Layer):
    """deel-lip's GroupSort(n=2): marks itself built, then rejects a channel count it cannot split."""

    def build(self, input_shape):
        super().build(input_shape)
        if input_shape[-1] % 2:
            raise RuntimeError("self.n has to be a divisor of the number of channels")
        self.half = input_shape[-1] // 2

    def call(self, x):
        a, b = x[..., :self.half], x[..., self.half:]
        return {keras}.ops.concatenate([{keras}.ops.minimum(a, b), {keras}.ops.maximum(a, b)], axis=-1) \\
            if hasattr({keras}, "ops") else {keras}.backend.concatenate([a, b], axis=-1)
'''


@pytest.mark.parametrize("keras_name", ["keras", "tf_keras"])
def test_a_layer_whose_first_input_was_invalid_is_built_again_for_the_next(tmp_path, monkeypatch, keras_name):
    """deel-lip's GroupSort2 (acceptance run): Keras marks a layer built before its ``build``
    finishes, so a first input with an odd channel count left the layer unusable and every later
    input failed the same way: its gradient variant, whose first candidate had 3 channels, was
    "no-valid-input" in 30 of 30 evaluations and the baseline refresh stopped. A first call that
    fails now leaves a fresh layer, at each dtype and built without one."""
    import importlib.util

    if importlib.util.find_spec(keras_name) is None:
        pytest.skip(f"{keras_name} is not installed")
    import numpy as np

    from gate.backends.base import resolve_callable

    (tmp_path / f"shaped_{keras_name}.py").write_text(SHAPED.replace("{keras}", keras_name))
    monkeypatch.syspath_prepend(str(tmp_path))
    op = resolve_callable(f"shaped_{keras_name}:PairSort")
    odd, even = np.ones((2, 3), dtype="float32"), np.arange(8, dtype="float32").reshape(2, 4)[:, ::-1].copy()
    for layer, dt in ((op, np.float32), (op.at("float32"), np.float32), (op.at("float16"), np.float16)):
        with pytest.raises(Exception, match="divisor"):
            layer(odd.astype(dt))
        out = np.asarray(layer(even.astype(dt)))
        assert out.shape == (2, 4) and sorted(out[0].tolist()) == [0, 1, 2, 3], out
