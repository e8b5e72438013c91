"""The export oracle's TensorFlow paths: SavedModel round trip and tf2onnx."""
from __future__ import annotations

import pytest

from tests.helpers import require_module

require_module("tensorflow")  # skipped where it is not installed; imported where a test needs it

from gate.oracles.export import export_op  # noqa: E402
from gate.ops.catalog import load_builtin  # noqa: E402


def tf_spec(name):
    return next(s for s in load_builtin(("tensorflow",)) if s.name == name)


def test_saved_model_round_trip_matches_eager():
    f = export_op(tf_spec("tf.tanh"), "savedmodel", seed=0, evals=4)
    assert f.status == "ok" and not f.crashes, f.message
    assert f.variant.key == "float32/cpu/savedmodel/export"
    assert f.metrics.ulp == 0.0 and not f.extra["diverges"]


def test_tf2onnx_runs_in_onnxruntime_and_reports_unsupported_ops():
    pytest.importorskip("tf2onnx")
    ok = export_op(tf_spec("tf.sigmoid"), "tf2onnx", seed=0, evals=4)
    assert ok.status == "ok" and not ok.crashes, ok.message
    assert not ok.extra["diverges"]
    lg = export_op(tf_spec("tf.lgamma"), "tf2onnx", seed=0, evals=4)
    assert lg.status == "unsupported" and not lg.crashes
    assert lg.extra["failure"]["kind"] == "unsupported" and "Lgamma" in lg.extra["failure"]["error"]
